"""Prefill in this process, decode in a spawned one that copies the KV blocks out of our
exported pool: still token-for-token equal to transformers (bf16: up to near-ties, see
bf16_refs.py), and no block leaks on either side."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.runner import ModelRunner
from bucketserve.engine.sequence import Sequence
from bucketserve.kv.handoff import HandoffTable

from tests.parity.bf16_refs import NEAR_TIE, Bf16Reference, divergence_gaps, hf_bf16_skip_reason
from tests.parity.conftest import EOS_TOKEN_ID
from tests.parity.disagg_worker import decode_worker

pytestmark = pytest.mark.parity
PREFILL_BATCH = 9  # several packed prefill batches, each handed off as it completes


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefill_and_decode_in_separate_processes(model_dir, torch_threads, dtype, request):
    if dtype == "bfloat16" and hf_bf16_skip_reason():
        pytest.skip(hf_bf16_skip_reason())
    references = request.getfixturevalue("references" if dtype == "float32" else "bf16_references")
    tag = f"{os.getpid() % 100000}{time.monotonic_ns() % 1000}"
    runner = ModelRunner(EngineConfig(model=model_dir, device="cpu", dtype=dtype,
                                      kv_cache_gb=0.5, pool_name=f"bs_par{tag}_kv"))  # fmt: skip
    table = HandoffTable.create(f"bs_par{tag}_ho", runner.num_blocks, timeout_s=600.0)
    ctx = mp.get_context("spawn")
    jobs, results = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=decode_worker, daemon=True, args=(
        model_dir, dtype, runner.pool_handle.to_json(), table.name, torch_threads, jobs,
        results))  # fmt: skip
    worker.start()
    try:
        bm = BlockManager(runner.num_blocks, runner.block_size)
        for start in range(0, len(references), PREFILL_BATCH):
            refs = references[start : start + PREFILL_BATCH]
            seqs = [Sequence(prompt_ids(r), r.params) for r in refs]
            for seq in seqs:
                bm.allocate_for(seq)
            first_tokens = runner.prefill(seqs)
            batch = []
            for i, (seq, token) in enumerate(zip(seqs, first_tokens, strict=True)):
                block_ids = bm.detach(seq)  # pending until the decode side acks
                handoff_id = table.publish(block_ids, now=time.monotonic())
                batch.append(
                    (start + i, seq.token_ids, token, block_ids, handoff_id, seq.sampling_params)
                )
            jobs.put(batch)
            bm.free(table.reclaim(now=time.monotonic()))
        jobs.put(None)
        outputs, free_blocks, total_blocks, max_batch = results.get(timeout=600)
        bm.free(table.reclaim(now=time.monotonic()))
        outputs = [outputs[i] for i in range(len(references))]
        if dtype == "float32":
            pairs = zip(outputs, references, strict=True)
            assert not [r.prompt.name for out, r in pairs if out != r.tokens]
        else:
            gaps = divergence_gaps(references, outputs, EOS_TOKEN_ID)
            assert all(gap < NEAR_TIE for gap in gaps.values()), gaps
        assert max_batch == len(references)  # all hand-offs decoded together
        assert free_blocks == total_blocks
        assert table.num_pending == 0 and table.num_expired == 0
        assert bm.num_free_blocks == runner.num_blocks
    finally:
        worker.join(timeout=60)
        if worker.is_alive():
            worker.kill()
        table.unlink()
        runner.close()


def prompt_ids(ref) -> list[int]:
    """The prompt of a bf16 (bf16_refs) or float32 (conftest.Reference) reference."""
    return list(ref.prompt if isinstance(ref, Bf16Reference) else ref.prompt.token_ids)
