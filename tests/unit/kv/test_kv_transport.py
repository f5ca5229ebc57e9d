"""KV pool export/import and block copy within one process (CPU / POSIX shm)."""

from __future__ import annotations

import os
import types

import pytest
import torch
from bucketserve.kv import shm
from bucketserve.kv.cuda_ipc import CudaIpcInfo
from bucketserve.kv.names import shm_name
from bucketserve.kv.transport import (
    PoolHandle,
    allocate_pool,
    copy_blocks,
    open_pool,
    release_pool,
)

SHAPE = (2, 2, 6, 4, 3, 8)  # [layers, 2, num_blocks, block_size, kv_heads, head_dim]


def test_allocate_zeroed_shared_and_roundtrip(names):
    pool, handle = allocate_pool(SHAPE, torch.bfloat16, "cpu", names("kv"))
    assert pool.shape == SHAPE and pool.dtype == torch.bfloat16 and not pool.any()
    assert handle.kind == "shm" and handle.num_blocks == 6 and handle.dtype == "bfloat16"
    assert os.path.exists(f"/dev/shm/{handle.name}")
    assert PoolHandle.from_json(handle.to_json()) == handle
    assert open_pool(handle) is pool  # the owner's own pool comes back from the cache
    release_pool(handle)
    assert not os.path.exists(f"/dev/shm/{handle.name}")
    pool[0, 0, 0] = 1  # views outlive release: the mapping goes when the last view does


def test_copy_blocks_gathers_and_scatters(names):
    src, h_src = allocate_pool(SHAPE, "float32", "cpu", names("a"))
    dst, h_dst = allocate_pool((2, 2, 9, 4, 3, 8), "float32", "cpu", names("b"))
    src.copy_(torch.randn(SHAPE))
    copy_blocks(src, [4, 0, 2], dst, torch.tensor([8, 1, 5]))
    for s, d in ((4, 8), (0, 1), (2, 5)):
        assert torch.equal(dst[:, :, d], src[:, :, s])
    assert not dst[:, :, [0, 2, 3, 4, 6, 7]].any()
    copy_blocks(src, [], dst, [])  # nothing to move is fine
    release_pool(h_src)
    release_pool(h_dst)


def test_copy_is_chunked_with_a_bounded_temporary(names, monkeypatch):
    """The old copy gathered the whole transfer at once (16 GiB for a 128k prompt on 8B)."""
    from bucketserve.kv import block_copy as transport

    shape = (3, 2, 40, 4, 3, 8)
    src, h_src = allocate_pool(shape, "float32", "cpu", names("a"))
    dst, h_dst = allocate_pool(shape, "float32", "cpu", names("b"))
    src.copy_(torch.randn(shape))
    per_block = 2 * 4 * 3 * 8 * 4  # one layer's K and V of one block, bytes
    monkeypatch.setattr(transport, "COPY_CHUNK_BYTES", 7 * per_block)
    sizes = []
    real = transport._gather
    monkeypatch.setattr(transport, "_gather", lambda p, i: sizes.append(i.numel()) or real(p, i))
    src_ids, dst_ids = list(range(5, 35)), list(range(39, 9, -1))
    copy = copy_blocks(src, src_ids, dst, dst_ids)
    assert copy.done()
    assert torch.equal(dst[:, :, dst_ids], src[:, :, src_ids])
    assert max(sizes) == 7 and sum(sizes) == 3 * 30  # per layer, 7 blocks at most
    release_pool(h_src)
    release_pool(h_dst)


@pytest.mark.parametrize(
    ("src_ids", "dst_ids", "message"),
    [
        ([6], [0], r"src_ids contains block 6, must be in \[0, 6\)"),
        ([0], [-1], r"dst_ids contains block -1, must be in \[0, 6\)"),
        ([0, 1], [0], "len"),
        ([0, 1], [2, 2], "repeat"),
    ],
)
def test_copy_blocks_validates(src_ids, dst_ids, message):
    pool = torch.zeros(SHAPE)
    with pytest.raises(ValueError, match=message):
        copy_blocks(pool, src_ids, pool.clone(), dst_ids)


def test_copy_blocks_rejects_mismatched_layout():
    with pytest.raises(ValueError, match="layouts differ"):
        copy_blocks(torch.zeros(SHAPE), [0], torch.zeros(2, 2, 6, 4, 3, 4), [0])


def test_open_after_owner_released_fails_clearly(names):
    _, handle = allocate_pool(SHAPE, "float16", "cpu", names("kv"))
    release_pool(handle)  # the owner unlinks at shutdown
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_pool(PoolHandle.from_json(handle.to_json()))


def test_opened_peer_release_does_not_unlink(names):
    _, handle = allocate_pool(SHAPE, "float32", "cpu", names("kv"))
    # Pretend to be a peer process: a handle with another uid maps the same segment anew.
    peer = PoolHandle.from_json(handle.to_json().replace(handle.uid, "0" * 16))
    a = open_pool(peer)
    assert open_pool(peer) is a
    a[:, :, 3] = 2.0
    owner_view = open_pool(handle)
    assert bool((owner_view[:, :, 3] == 2.0).all())  # zero-copy: same pages
    release_pool(peer)
    assert os.path.exists(f"/dev/shm/{handle.name}")
    release_pool(handle)
    assert not os.path.exists(f"/dev/shm/{handle.name}")


def test_allocate_replaces_stale_segment_and_rejects_duplicate_name(names):
    name = names("kv")
    with open(f"/dev/shm/{name}", "wb") as f:  # leftover of a crashed run
        f.write(b"x" * 100)
    pool, handle = allocate_pool(SHAPE, "float32", "cpu", name)
    assert not pool.any()
    with pytest.raises(ValueError, match="already in use"):
        allocate_pool(SHAPE, "float32", "cpu", name)
    release_pool(handle)


def test_shm_too_small_names_sizes_and_fix(names, monkeypatch):
    fake = types.SimpleNamespace(f_bavail=16, f_frsize=4096)  # 64 KiB free
    monkeypatch.setattr(shm.os, "statvfs", lambda path: fake)
    with pytest.raises(shm.ShmSpaceError) as err:
        allocate_pool((4, 2, 1024, 16, 8, 128), "float16", "cpu", names("kv"))
    text = str(err.value)
    assert str(4 * 2 * 1024 * 16 * 8 * 128 * 2) in text and "65536" in text
    assert "--shm-size" in text and "shm_size" in text
    assert not os.path.exists(f"/dev/shm/{names.made[-1]}")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "rdma"}, "kind"),
        ({"shape": (2, 2)}, "shape"),
        ({"dtype": "float99"}, "dtype"),
        ({"nbytes": 3}, "nbytes"),
        ({"kind": "cuda_ipc"}, "ipc"),
    ],
)
def test_handle_validates(kwargs, message):
    base = dict(kind="shm", name="x", shape=(1, 2, 3), dtype="float32", device="cpu", nbytes=24)
    with pytest.raises(ValueError, match=message):
        PoolHandle(**{**base, **kwargs})


def test_allocate_rejects_other_devices():
    with pytest.raises(ValueError, match="device"):
        allocate_pool(SHAPE, "float32", "meta", "bstmeta")


def test_shm_name():
    assert shm_name("1a2b3c4d", "prefill", 0, "kv") == "bs_1a2b3c4d_p0_kv"
    assert shm_name("1a2b3c4d", "decode", 12, "st") == "bs_1a2b3c4d_d12_st"
    with pytest.raises(ValueError, match="limit 31"):
        shm_name("a" * 30, "prefill", 0, "kv")
    with pytest.raises(ValueError, match="run_id"):
        shm_name("a/b", "prefill", 0, "kv")
    with pytest.raises(ValueError, match="index"):
        shm_name("abc", "prefill", -1, "kv")


def _cuda_handle() -> PoolHandle:
    ipc = CudaIpcInfo(0, "ab" * 64, 4 * 2**20, 0, "2f746f726368", 3, "cd" * 64, True)
    return PoolHandle("cuda_ipc", "kvgpu", (1, 2, 4, 8), "float16", "cuda:0", 128, ipc=ipc)


def test_cuda_ipc_handle_json_roundtrip():
    handle = _cuda_handle()
    again = PoolHandle.from_json(handle.to_json())
    assert again == handle and isinstance(again.ipc, CudaIpcInfo) and again.ipc.event_sync_required


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on machines without CUDA")
def test_opening_cuda_pool_without_cuda_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no CUDA device"):
        open_pool(_cuda_handle())


def mapped_kb(path: str) -> int:
    """Resident kB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.parametrize("kernel_populates", [True, False])
def test_pool_pages_are_mapped_at_start_and_keep_their_bytes(names, monkeypatch, kernel_populates):
    """A pool's pages enter the page tables when it is created or opened, not one fault per
    block while serving; the peer sees the owner's bytes (an old kernel: one read per page)."""
    if not kernel_populates:
        monkeypatch.setattr(shm, "MADV_POPULATE_WRITE", 0x7FFF)  # no such advice: EINVAL
    shape = (1, 2, 64, 16, 4, 64)  # 2 MiB of float32
    pool, handle = allocate_pool(shape, torch.float32, "cpu", names("kv"))
    path = f"/dev/shm/{handle.name}"
    assert mapped_kb(path) >= handle.nbytes // 1024
    pool[0, 1, 63].fill_(3.0)
    peer = shm.map_segment(handle.name, handle.nbytes, whole=True)  # as open_pool in a peer
    assert mapped_kb(path) >= 2 * handle.nbytes // 1024  # both mappings, every page
    seen = torch.frombuffer(peer, dtype=torch.float32).view(shape)
    assert seen[0, 1, 63].eq(3.0).all() and not seen[0, 0].any()
    del seen
    peer.close()
    release_pool(handle)
