"""GPU checks (skipped without CUDA): fp32 greedy parity on the GPU, and the flash-attn
backend against SDPA in bf16."""

from __future__ import annotations

import pytest
import torch
from bucketserve.engine.attention import is_flash_attn_available
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.llm_engine import LLMEngine
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sequence import Sequence

from tests.parity.conftest import rel_err

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_fp32_sdpa_on_gpu_matches_transformers(model_dir, references):
    config = EngineConfig(model=model_dir, device="cuda", dtype="float32", attention="sdpa",
                          num_blocks=2048, max_num_seqs=32)  # fmt: skip
    engine = LLMEngine(config)
    try:
        outputs = engine.generate([list(r.prompt.token_ids) for r in references],
                                  [r.params for r in references])  # fmt: skip
        assert [
            r.prompt.name for r, o in zip(references, outputs, strict=True) if o != r.tokens
        ] == []
        assert engine.block_manager.num_free_blocks == engine.runner.num_blocks
    finally:
        engine.close()


@pytest.mark.skipif(not is_flash_attn_available(), reason="needs flash_attn")
def test_flash_attn_matches_sdpa_in_bf16(model_dir, references):
    logits = {}
    for attention in ("flash_attn", "sdpa"):
        runner = ModelRunner(EngineConfig(model=model_dir, device="cuda", dtype="bfloat16",
                                          attention=attention, num_blocks=64))  # fmt: skip
        bm = BlockManager(runner.num_blocks, runner.block_size)
        seqs = [Sequence(list(r.prompt.token_ids), r.params) for r in references[:8]]
        for seq in seqs:
            bm.allocate_for(seq)
        prefill = runner.prefill_logits(seqs)
        for seq, ref in zip(seqs, references, strict=False):
            seq.append_token(ref.tokens[0])  # same decode input for both backends
            bm.ensure_slot(seq)
        logits[attention] = (prefill, runner.decode_logits(seqs))
        runner.close()
    for flash, sdpa in zip(logits["flash_attn"], logits["sdpa"], strict=True):
        assert rel_err(flash, sdpa) < 3e-2
