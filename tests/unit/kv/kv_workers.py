"""Child-process bodies for the cross-process KV tests (spawned, so importable by name)."""

from __future__ import annotations

import secrets

from bucketserve.kv.handoff import HandoffTable
from bucketserve.kv.shm import unlink_stale
from bucketserve.kv.stats import StatsBlock


def pull_and_ack(
    handle_json: str, table_name: str, jobs: list, src_device: str, dst_device: str, out
) -> None:
    """Decode side: open the peer pool, copy each job's blocks, compare bytes, ack; report back."""
    import torch  # here, not at module level: the stats child starts faster without torch
    from bucketserve.kv.transport import (
        PoolHandle,
        allocate_pool,
        copy_blocks,
        open_pool,
        release_pool,
    )

    handle = PoolHandle.from_json(handle_json)
    src = open_pool(handle, src_device)
    assert open_pool(handle, src_device) is src  # cached per process
    shape = list(handle.shape)
    shape[2] = 8
    dst, dst_handle = allocate_pool(shape, handle.dtype, dst_device, f"{handle.name}c")
    table = HandoffTable.open(table_name)
    results = []
    for handoff_id, src_ids in jobs:
        dst_ids = list(range(len(src_ids)))
        copy_blocks(src, src_ids, dst, dst_ids)
        equal = bool(torch.equal(dst[:, :, dst_ids].cpu(), src[:, :, src_ids].cpu()))
        results.append((handoff_id, equal, table.ack(handoff_id), table.ack(handoff_id)))
    src[:, :, -1] = 7  # the mapping is shared both ways: the parent checks this marker
    if src.is_cuda:
        torch.cuda.synchronize(src.device)
    table.close()
    release_pool(dst_handle)
    release_pool(handle)
    out.put(results)


def read_stats(name: str, target: int, out) -> None:
    """Monitor side: read until the writer's counter reaches target; count torn snapshots."""
    block = StatsBlock.open(name)
    out.put("ready")
    reads = torn = backwards = last = 0
    while last < target:
        s = block.read()
        values = (s.total_blocks, s.free_blocks, s.running, s.waiting, s.tokens_processed)
        floats = (s.step_latency_ema_s, s.heartbeat)
        torn += any(v != s.block_size for v in values) or any(f != s.block_size for f in floats)
        backwards += s.tokens_processed < last
        last = s.tokens_processed
        reads += 1
    block.close()
    out.put((reads, torn, backwards))


class ShmNames:
    """Unique shm names for one test, with every leftover segment unlinked at teardown."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(3)
        self.made: list[str] = []

    def __call__(self, kind: str) -> str:
        name = f"bst{self.token}{kind}"
        self.made.append(name)
        return name

    def cleanup(self) -> None:
        for name in self.made:
            for suffix in ("", "c"):
                unlink_stale(name + suffix)
