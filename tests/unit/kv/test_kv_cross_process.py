"""The prefill->decode path across real processes: open by handle, copy, ack, reclaim."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch
from bucketserve.kv.handoff import HandoffTable
from bucketserve.kv.transport import PoolHandle, allocate_pool, open_pool, release_pool

from tests.unit.kv.kv_workers import pull_and_ack

NUM_BLOCKS = 16
SHAPE = (2, 2, NUM_BLOCKS, 4, 2, 8)
TIMEOUT_S = 30.0


def run_handoff(names, device: str, consumer_device: str) -> None:
    """Producer here, consumer in a spawned child; every block comes back exactly once."""
    pool, handle = allocate_pool(SHAPE, torch.float16, device, names("kv"))
    pool.copy_(torch.randn(SHAPE, dtype=torch.float16))
    table = HandoffTable.create(names("ho"), NUM_BLOCKS, TIMEOUT_S)
    free = list(range(NUM_BLOCKS))  # the block manager's free list
    pulled = [free.pop(3), free.pop(6), free.pop(7), free.pop(10)]
    abandoned = [free.pop(0), free.pop(0)]  # nobody pulls these: reclaimed by the timeout
    late = [free.pop(0)]  # expires before the consumer gets to it
    pulled_id = table.publish(pulled, now=0.0)
    table.publish(abandoned, now=0.0)
    late_id = table.publish(late, now=-TIMEOUT_S)
    free += table.reclaim(now=0.0)  # `late` expires here
    assert free.count(late[0]) == 1

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    jobs = [(pulled_id, pulled), (late_id, late)]
    child = ctx.Process(
        target=pull_and_ack,
        args=(handle.to_json(), table.name, jobs, device, consumer_device, out),
    )
    child.start()
    results = out.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert results == [(pulled_id, True, True, True), (late_id, True, False, False)]

    # The child exited: its opens must not have unlinked our segments (resource_tracker).
    if handle.kind == "shm":
        assert os.path.exists(f"/dev/shm/{handle.name}")
    assert os.path.exists(f"/dev/shm/{table.name}")
    assert bool((pool[:, :, -1] == 7).all())  # the child's write is visible here

    free += table.reclaim(now=1.0)  # the acked hand-off
    assert table.num_pending == 1 and table.num_acked == 1
    free += table.reclaim(now=TIMEOUT_S)  # the abandoned one
    assert sorted(free) == list(range(NUM_BLOCKS)) and table.num_pending == 0
    assert table.num_expired == 2
    table.close()
    table.unlink()
    release_pool(handle)


def test_cpu_pool_handoff_across_processes(names):
    run_handoff(names, "cpu", "cpu")


def test_reopen_by_json_in_same_process_is_cached(names):
    _, handle = allocate_pool(SHAPE, "float32", "cpu", names("kv"))
    peer = PoolHandle.from_json(handle.to_json())
    assert open_pool(peer) is open_pool(handle)
    release_pool(handle)


_NO_CUDA = "needs a CUDA device (none in this process); runs on a GPU machine"


@pytest.mark.skipif(not torch.cuda.is_available(), reason=_NO_CUDA)
def test_cuda_ipc_pool_handoff_across_processes(names):
    run_handoff(names, "cuda:0", "cuda:0")


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs two CUDA devices (fewer here); runs on a multi-GPU machine",
)
def test_cuda_ipc_pool_copied_to_a_pool_on_another_device(names):
    run_handoff(names, "cuda:0", "cuda:1")
