"""The serving models' tokenizer: AutoTokenizer's, loaded without torch where the files allow."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from bucketserve.engine.loader import resolve_model
from bucketserve.serving.core.model_info import ModelInfo, load_tokenizer, loads_plain_tokenizer

TEXTS = [
    "The capital of France is",
    "  leading spaces, tabs\tand\nnewlines  ",
    "Ünïcödé, 中文, emoji 🚀 and <|im_start|> written out",
    "",
]


@pytest.fixture(scope="module")
def smollm2_dir() -> str:
    return resolve_model("smollm2")


def copy_with(src: str, dst, config: dict | None = None, tokenizer_config: dict | None = None):
    """A copy of a checkpoint's tokenizer files with fields of its two configs replaced."""
    for name in ("config.json", "tokenizer_config.json", "tokenizer.json"):
        shutil.copy(f"{src}/{name}", dst / name)
    for name, changes in (("config.json", config), ("tokenizer_config.json", tokenizer_config)):
        data = json.loads((dst / name).read_text())
        data.update(changes or {})
        (dst / name).write_text(json.dumps(data))
    return str(dst)


def test_the_plain_path_loads_what_auto_tokenizer_loads(smollm2_dir):
    from transformers import AutoTokenizer

    assert loads_plain_tokenizer(smollm2_dir)  # SmolLM2 (llama, TokenizersBackend) takes it
    ours = load_tokenizer(ModelInfo(smollm2_dir, 2048))
    auto = AutoTokenizer.from_pretrained(smollm2_dir)
    assert type(ours) is type(auto)
    for text in TEXTS:
        assert ours.encode(text) == auto.encode(text)
        assert ours.encode(text, add_special_tokens=False) == auto.encode(
            text, add_special_tokens=False
        )
        messages = [{"role": "user", "content": text}]
        chat = dict(add_generation_prompt=True, tokenize=True, return_dict=False)  # as preprocess
        assert ours.apply_chat_template(messages, **chat) == auto.apply_chat_template(
            messages, **chat
        )
    ids = auto.encode(TEXTS[2])
    assert ours.decode(ids) == auto.decode(ids)
    assert ours.backend_tokenizer.to_str() == auto.backend_tokenizer.to_str()  # what decode uses
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_ids"):
        assert getattr(ours, attr) == getattr(auto, attr), attr


@pytest.mark.parametrize(
    ("config", "tokenizer_config"),
    [
        ({"model_type": "qwen2"}, None),  # AutoTokenizer maps qwen2 to Qwen2Tokenizer
        (None, {"tokenizer_class": "GPT2Tokenizer"}),  # a model-specific class
        (None, {"auto_map": {"AutoTokenizer": [None, "tok.MyTokenizer"]}}),  # remote code
    ],
)
def test_other_tokenizers_go_through_auto_tokenizer(
    smollm2_dir, tmp_path, config, tokenizer_config
):
    assert not loads_plain_tokenizer(copy_with(smollm2_dir, tmp_path, config, tokenizer_config))


def test_auto_tokenizer_picks_its_own_class_for_qwen2(smollm2_dir, tmp_path):
    """Why the model type is part of the rule: the same files under qwen2 load another class."""
    from transformers import AutoTokenizer

    tokenizer_dir = copy_with(smollm2_dir, tmp_path, {"model_type": "qwen2"})
    assert type(AutoTokenizer.from_pretrained(tokenizer_dir)).__name__ == "Qwen2Tokenizer"


def test_a_directory_without_tokenizer_files_is_not_plain(tmp_path):
    assert not loads_plain_tokenizer(str(tmp_path))


# What the preprocessing instances and the scheduler run at start-up, in a fresh process.
CODE = """
import sys, types
sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.core.model_info import load_tokenizer, model_info
from bucketserve.serving.launch.launcher import prepare_model
for model in ("smollm2", "dummy:tiny"):
    cfg = ServeConfig(model=model, model_dir=prepare_model(model))
    tokenizer = load_tokenizer(model_info(cfg))
    assert tokenizer.encode("Paris"), model
assert "torch" not in sys.modules, "torch was imported"
"""


def test_resolving_the_model_and_its_tokenizer_imports_no_torch():
    subprocess.run([sys.executable, "-c", CODE], check=True)
