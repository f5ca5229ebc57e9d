"""Copying KV blocks between pools (a peer's opened pool into ours): per layer and per chunk of
blocks, so no temporary grows with the prompt; on GPU on a side stream, so the caller can keep
working and ack the hand-off once the copy is done()."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

BLOCK_DIM = 2  # pool: [layers, 2, num_blocks, block_size, kv_heads, head_dim]

COPY_CHUNK_BYTES = 64 * 2**20  # largest temporary a copy makes (a 128k-token prompt is 16 GiB)


@dataclass(slots=True)
class KvCopy:
    """A block copy in flight. On GPU it runs on a side stream, so the decode loop can keep
    stepping and ack the hand-off once done() says the blocks have landed; on CPU it is done
    when start_copy returns."""

    event: object | None = None  # torch.cuda.Event recorded after the last copy

    def done(self) -> bool:
        """The copy has landed (never blocks)."""
        return self.event is None or self.event.query()

    def wait(self) -> None:
        """Block this thread until the copy has landed."""
        if self.event is not None:
            self.event.synchronize()


def copy_blocks(
    src_pool: torch.Tensor,
    src_ids: Sequence[int] | torch.Tensor,
    dst_pool: torch.Tensor,
    dst_ids: Sequence[int] | torch.Tensor,
    *,
    wait: bool = True,
) -> KvCopy:
    """dst[:, :, dst_ids] = src[:, :, src_ids]. With wait (the default) return once the copy has
    landed: the hand-off ack lets the producer reuse the source blocks. wait=False returns the
    KvCopy in flight (see start_copy)."""
    copy = start_copy(src_pool, src_ids, dst_pool, dst_ids)
    if wait:
        copy.wait()
    return copy


def start_copy(src_pool, src_ids, dst_pool, dst_ids) -> KvCopy:
    """Start dst[:, :, dst_ids] = src[:, :, src_ids], per layer and per chunk of blocks (no
    temporary beyond COPY_CHUNK_BYTES); on GPU on a side stream of the destination device.
    Ack the hand-off only once the returned KvCopy is done()."""
    src_idx = _block_index(src_ids, src_pool, "src_ids")
    dst_idx = _block_index(dst_ids, dst_pool, "dst_ids")
    _check_copy(src_pool, src_idx, dst_pool, dst_idx)
    if src_idx.numel() == 0:
        return KvCopy()
    if dst_pool.device.type != "cuda" and src_pool.device.type != "cuda":
        _copy_chunks(src_pool, src_idx, dst_pool, dst_idx)
        return KvCopy()
    stream = _side_stream(dst_pool.device if dst_pool.is_cuda else src_pool.device)
    stream.wait_stream(torch.cuda.current_stream(stream.device))  # after this thread's writes
    with torch.cuda.stream(stream):
        _copy_chunks(src_pool, src_idx, dst_pool, dst_idx)
        event = torch.cuda.Event()
        event.record(stream)
    return KvCopy(event)


def _copy_chunks(src_pool, src_idx, dst_pool, dst_idx) -> None:
    per_block = src_pool[0, :, 0].numel() * src_pool.element_size()  # one layer, K and V
    chunk = max(1, COPY_CHUNK_BYTES // per_block)
    src_idx = src_idx.to(src_pool.device, non_blocking=True)
    dst_idx = dst_idx.to(dst_pool.device, non_blocking=True)
    for layer in range(src_pool.shape[0]):
        for start in range(0, src_idx.numel(), chunk):
            part = _gather(src_pool[layer], src_idx[start : start + chunk])  # [2, c, ...]
            part = part.to(dst_pool.device, non_blocking=True)
            dst_pool[layer].index_copy_(1, dst_idx[start : start + chunk], part)


def _gather(layer_pool: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """layer_pool [2, num_blocks, ...] -> [2, len(idx), ...] (the copy's only temporary)."""
    return layer_pool.index_select(1, idx)


_SIDE_STREAMS: dict = {}
_STREAMS_LOCK = threading.Lock()


def _side_stream(device: torch.device):
    with _STREAMS_LOCK:
        if device not in _SIDE_STREAMS:
            _SIDE_STREAMS[device] = torch.cuda.Stream(device)
        return _SIDE_STREAMS[device]


def _check_copy(src_pool, src_idx, dst_pool, dst_idx) -> None:
    if src_idx.numel() != dst_idx.numel():
        raise ValueError(
            f"len(src_ids)={src_idx.numel()} must equal len(dst_ids)={dst_idx.numel()}"
        )
    if torch.unique(dst_idx).numel() != dst_idx.numel():
        raise ValueError("dst_ids must not repeat a block (the scatter would be ambiguous)")
    src_shape, dst_shape = list(src_pool.shape), list(dst_pool.shape)
    src_shape[BLOCK_DIM] = dst_shape[BLOCK_DIM] = -1
    if src_shape != dst_shape or src_pool.dtype != dst_pool.dtype:
        raise ValueError(
            f"pool layouts differ outside dim {BLOCK_DIM}: src {tuple(src_pool.shape)} "
            f"{src_pool.dtype}, dst {tuple(dst_pool.shape)} {dst_pool.dtype}"
        )


def _block_index(ids: Sequence[int] | torch.Tensor, pool: torch.Tensor, field: str) -> torch.Tensor:
    idx = torch.as_tensor(ids, dtype=torch.long, device="cpu").reshape(-1)
    limit = pool.shape[BLOCK_DIM]
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= limit):
        bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
        raise ValueError(f"{field} contains block {bad}, must be in [0, {limit})")
    return idx
