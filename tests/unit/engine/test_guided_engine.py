"""LLMEngine on SmolLM2: JSON-schema-guided generation parses and validates, in chunks and in
batches mixed with unguided requests; a bad schema fails before anything runs."""

from __future__ import annotations

import json

import jsonschema
import pytest
from bucketserve.bench.schemas import PERSON as SCHEMA
from bucketserve.engine import loader
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.llm_engine import LLMEngine
from bucketserve.engine.sampling_params import SamplingParams

QUESTIONS = ("Describe a person who lives in Paris as JSON.", "Invent a chef from Madrid.",
             "Tell me about a student.", "Who are you?")  # fmt: skip


@pytest.fixture(scope="module")
def engine():
    eng = LLMEngine(EngineConfig(model="smollm2", device="cpu", num_blocks=256), chunk_tokens=32)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompts():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(loader.resolve_model("smollm2"))
    encode = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False) for q in QUESTIONS]  # fmt: skip
    return [list(p) for p in encode], tok


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_guided_json_validates_with_unguided_neighbours(engine, prompts, temperature):
    ids, tok = prompts
    guided = SamplingParams(temperature=temperature, seed=11, max_tokens=160,
                            guide_type="json", guide=json.dumps(SCHEMA))  # fmt: skip
    plain = SamplingParams(temperature=0, max_tokens=8)
    outs = engine.generate(ids + ids[:1], [guided] * len(ids) + [plain])
    for out in outs[:-1]:
        assert out[-1] in engine.eos_token_ids, "EOS ends a guided reply once its JSON is done"
        jsonschema.validate(json.loads(tok.decode(out[:-1])), SCHEMA)
    assert not tok.decode(outs[-1]).lstrip().startswith("{")  # the unguided one is prose
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_total_blocks


def test_invalid_schema_fails_before_generation(engine, prompts):
    ids, _ = prompts
    bad = SamplingParams(guide_type="json", guide='{"type": "object", "properties": 3}')
    with pytest.raises(ValueError, match="JSON schema is invalid"):
        engine.generate(ids[:2], [SamplingParams(), bad])
    assert not engine.scheduler.has_work
