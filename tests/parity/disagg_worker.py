"""Decode-instance body for the disaggregated parity test (spawned, so importable by name)."""

from __future__ import annotations


def decode_worker(
    model_dir: str, dtype: str, handle_json: str, table_name: str, threads: int, jobs, results
) -> None:
    """Open the prefill pool, pull each hand-off's blocks, ack, then decode to completion."""
    from bucketserve.engine.block_manager import BlockManager
    from bucketserve.engine.config import EngineConfig
    from bucketserve.engine.runner import ModelRunner
    from bucketserve.engine.sequence import Sequence, check_stop, finish
    from bucketserve.kv.handoff import HandoffTable
    from bucketserve.kv.transport import PoolHandle, copy_blocks, open_pool, release_pool

    config = EngineConfig(
        model=model_dir, device="cpu", dtype=dtype, kv_cache_gb=0.5, num_threads=threads
    )
    runner = ModelRunner(config)
    handle = PoolHandle.from_json(handle_json)
    src_pool, table = open_pool(handle), HandoffTable.open(table_name)
    bm = BlockManager(runner.num_blocks, runner.block_size)
    eos, max_len = runner.model_config.eos_token_ids, runner.model_config.max_model_len
    running, outputs, batch_sizes = [], {}, []

    def settle(seq: Sequence, index: int) -> None:
        reason = check_stop(seq, eos, max_len)
        if reason is None:
            running.append((index, seq))
            return
        finish(seq, reason)
        bm.release(seq)
        outputs[index] = seq.completion_token_ids

    while (batch := jobs.get()) is not None:
        for index, prompt, first_token, src_ids, handoff_id, params in batch:
            seq = Sequence(prompt + [first_token], params, num_prompt_tokens=len(prompt))
            bm.allocate_for(seq)  # prompt + first token
            copy_blocks(src_pool, src_ids, runner.pool, seq.block_table[: len(src_ids)])
            if not table.ack(handoff_id):
                raise RuntimeError(f"hand-off {handoff_id} expired before it was acked")
            settle(seq, index)
    while running:
        step, running[:] = list(running), []
        for _, seq in step:
            bm.ensure_slot(seq)
        batch_sizes.append(len(step))
        tokens = runner.decode([seq for _, seq in step])
        for (index, seq), token in zip(step, tokens, strict=True):
            seq.append_token(token)
            settle(seq, index)
    results.put((outputs, bm.num_free_blocks, runner.num_blocks, max(batch_sizes)))
    table.close()
    release_pool(handle)
    runner.close()
