"""Prefill in this process, decode in a spawned one that copies the KV blocks out of our
exported pool: still token-for-token equal to transformers, and no block leaks on either side."""

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

from tests.parity.disagg_worker import decode_worker

pytestmark = pytest.mark.parity
PREFILL_BATCH = 9  # several packed prefill batches, each handed off as it completes


def test_prefill_and_decode_in_separate_processes(model_dir, references, torch_threads):
    tag = f"{os.getpid() % 100000}{time.monotonic_ns() % 1000}"
    runner = ModelRunner(EngineConfig(model=model_dir, device="cpu", kv_cache_gb=0.5,
                                      pool_name=f"bs_par{tag}_kv"))  # fmt: skip
    table = HandoffTable.create(f"bs_par{tag}_ho", runner.num_blocks, timeout_s=600.0)
    ctx = mp.get_context("spawn")
    jobs, results = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=decode_worker, daemon=True, args=(
        model_dir, runner.pool_handle.to_json(), table.name, torch_threads, jobs, results))  # fmt: skip
    worker.start()
    try:
        bm = BlockManager(runner.num_blocks, runner.block_size)
        for start in range(0, len(references), PREFILL_BATCH):
            refs = references[start : start + PREFILL_BATCH]
            seqs = [Sequence(list(r.prompt.token_ids), r.params) for r in refs]
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
        mismatched = [r.prompt.name for i, r in enumerate(references) if outputs[i] != r.tokens]
        assert not mismatched
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
