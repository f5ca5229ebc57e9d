"""CUDA IPC export/import of one dedicated device allocation, through torch's storage sharing."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The caching allocator rounds large segments to 2 MiB; padding the pool to that leaves no tail
# of its segment for later allocations (which the pool's IPC handle would otherwise expose).
_SEGMENT_ROUND = 2 * 2**20


@dataclass(slots=True, frozen=True)
class CudaIpcInfo:
    """The tuple UntypedStorage._share_cuda_() returns, made JSON-safe (bytes as hex)."""

    device_index: int
    mem_handle: str
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: str
    ref_counter_offset: int
    event_handle: str
    event_sync_required: bool


def allocate_exported(nbytes: int, device: torch.device) -> tuple[torch.Tensor, CudaIpcInfo]:
    """Allocate a zeroed flat uint8 buffer of >= nbytes on device and export it for peers."""
    padded = -(-nbytes // _SEGMENT_ROUND) * _SEGMENT_ROUND
    # Emptying the cache first makes the allocator cudaMalloc a fresh segment for the pool rather
    # than split a cached one, so the handle (which covers the whole segment) covers the pool only.
    torch.cuda.empty_cache()
    flat = torch.zeros(padded, dtype=torch.uint8, device=device)
    # _share_cuda_ records an event after the zero fill; openers wait on it before first use.
    dev, handle, size, offset, rc_handle, rc_offset, ev_handle, ev_sync = (
        flat.untyped_storage()._share_cuda_()
    )
    info = CudaIpcInfo(
        int(dev),
        handle.hex(),
        int(size),
        int(offset),
        rc_handle.hex(),
        int(rc_offset),
        ev_handle.hex(),
        bool(ev_sync),
    )
    return flat, info


def open_exported(info: CudaIpcInfo, device: torch.device) -> torch.Tensor:
    """Open a peer's exported buffer on the local device (index may differ from the exporter's)."""
    if not torch.cuda.is_available():
        raise RuntimeError("cannot open a cuda_ipc pool: no CUDA device in this process")
    index = device.index if device.index is not None else torch.cuda.current_device()
    local = torch.device("cuda", index)
    # _new_shared_cuda segfaults unless this process already has a CUDA context
    # (docs/platform-notes.md#p7-cuda-context-before-ipc-open).
    torch.empty(1, device=local)
    storage = torch.UntypedStorage._new_shared_cuda(
        index,
        bytes.fromhex(info.mem_handle),
        info.storage_size_bytes,
        info.storage_offset_bytes,
        bytes.fromhex(info.ref_counter_handle),
        info.ref_counter_offset,
        bytes.fromhex(info.event_handle),
        info.event_sync_required,
    )
    return torch.empty(0, dtype=torch.uint8, device=local).set_(storage)
