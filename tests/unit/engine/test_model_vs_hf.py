"""Our forward pass equals transformers' on tiny random models of each architecture."""

from __future__ import annotations

import pytest
import torch
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner

from tests.unit.engine.helpers import ARCHS, make_hf_checkpoint, prefill_seqs, rel_err

PROMPTS = [[5, 17, 99, 3, 250, 7, 8, 42, 11, 12, 13], [6], [200 + i for i in range(40)]]


@pytest.mark.parametrize("optimize", [False, True], ids=["eager", "fused"])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_prefill_and_decode_logits_match_hf(arch, optimize, tmp_path):
    hf = make_hf_checkpoint(arch, tmp_path)
    config = EngineConfig(model=str(tmp_path), device="cpu", dtype="float32", num_blocks=64,
                          block_size=4, optimize_weights=optimize)  # fmt: skip
    runner = ModelRunner(config)
    try:
        bm = BlockManager(runner.num_blocks, runner.block_size)
        seqs = prefill_seqs(runner, bm, PROMPTS)
        logits = runner.prefill_logits(seqs)
        for seq, row in zip(seqs, logits, strict=True):
            with torch.no_grad():
                ref = hf(torch.tensor([seq.token_ids])).logits[0, -1]
            assert rel_err(row, ref) < 1e-5
        for step in range(6):  # decode crosses block boundaries (block_size 4)
            for seq in seqs:
                seq.append_token(17 + 31 * step)
                bm.ensure_slot(seq)
            logits = runner.decode_logits(seqs)
            for seq, row in zip(seqs, logits, strict=True):
                with torch.no_grad():
                    ref = hf(torch.tensor([seq.token_ids])).logits[0, -1]
                assert rel_err(row, ref) < 1e-5, (arch, step)
    finally:
        runner.close()
