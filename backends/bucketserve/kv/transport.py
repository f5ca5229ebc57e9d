"""KV pool export/import (POSIX shm on CPU, CUDA IPC on GPU); the block copy is in block_copy."""

from __future__ import annotations

import json
import math
import secrets
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.shared_memory import SharedMemory

import torch

from bucketserve.kv import cuda_ipc, shm
from bucketserve.kv.block_copy import (  # noqa: F401  (copy_blocks etc. re-exported)
    BLOCK_DIM,
    KvCopy,
    copy_blocks,
    start_copy,
)
from bucketserve.kv.cuda_ipc import CudaIpcInfo

KINDS = ("shm", "cuda_ipc")


@dataclass(slots=True, frozen=True)
class PoolHandle:
    """Everything a peer process needs to open a pool: small, JSON-serialisable, immutable."""

    kind: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str  # as the exporting process sees it: "cpu" or "cuda:N"
    nbytes: int
    uid: str = field(default_factory=lambda: secrets.token_hex(8))  # tells re-allocations apart
    ipc: CudaIpcInfo | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r} must be one of {KINDS}")
        if len(self.shape) <= BLOCK_DIM or any(int(d) <= 0 for d in self.shape):
            raise ValueError(f"shape={self.shape} needs > {BLOCK_DIM} dims, all > 0")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        expected = math.prod(self.shape) * _torch_dtype(self.dtype).itemsize
        if self.nbytes != expected:
            raise ValueError(f"nbytes={self.nbytes} must equal prod(shape) * itemsize = {expected}")
        if (self.kind == "cuda_ipc") != (self.ipc is not None):
            raise ValueError(f"ipc must be set exactly when kind == 'cuda_ipc' (kind={self.kind})")

    @property
    def num_blocks(self) -> int:
        """Number of KV blocks in the pool (dimension 2)."""
        return self.shape[BLOCK_DIM]

    def to_json(self) -> str:
        """Serialise for a peer (Triton parameters, a file, a BLS string tensor)."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> PoolHandle:
        """Parse what to_json produced."""
        d = json.loads(text)
        ipc = d.pop("ipc", None)
        d["shape"] = tuple(d["shape"])
        return cls(**d, ipc=CudaIpcInfo(**ipc) if ipc else None)


@dataclass(slots=True)
class _Entry:
    tensor: torch.Tensor
    owner_shm: SharedMemory | None  # set only in the process that created a CPU pool


# Pools this process allocated or opened, keyed by (name, uid). A per-process cache is the point:
# each peer pool is mapped/opened once and reused for every hand-off (like torch's shared_cache).
_POOLS: dict[tuple[str, str], _Entry] = {}
_POOLS_LOCK = threading.Lock()  # decode threads may open the same peer pool at once


def allocate_pool(
    shape: Sequence[int], dtype: torch.dtype | str, device: torch.device | str, name: str
) -> tuple[torch.Tensor, PoolHandle]:
    """Allocate a zeroed pool shared with peers: POSIX shm on CPU, a CUDA IPC export on GPU."""
    dev = torch.device(device)
    dtype_name = _dtype_name(dtype)
    with _POOLS_LOCK:
        if any(key[0] == name for key in _POOLS):
            raise ValueError(f"pool name={name!r} is already in use here; release_pool it first")
        nbytes = math.prod(int(d) for d in shape) * _torch_dtype(dtype_name).itemsize
        if dev.type == "cpu":
            handle = PoolHandle("shm", name, tuple(shape), dtype_name, "cpu", nbytes)
            owner = shm.create_segment(name, nbytes, f"KV pool {name!r}")
            tensor = _view(shm.map_segment(name, nbytes, whole=True), handle)
            _POOLS[(name, handle.uid)] = _Entry(tensor, owner)
        elif dev.type == "cuda":
            flat, ipc = cuda_ipc.allocate_exported(nbytes, dev)
            handle = PoolHandle(
                "cuda_ipc", name, tuple(shape), dtype_name, str(flat.device), nbytes, ipc=ipc
            )
            tensor = _view(flat, handle)
            _POOLS[(name, handle.uid)] = _Entry(tensor, None)
        else:
            raise ValueError(f"device={dev} must be cpu or cuda")
    return tensor, handle


def open_pool(handle: PoolHandle, device: torch.device | str | None = None) -> torch.Tensor:
    """Open a peer's pool zero-copy (once per process), on the exporter's GPU: a consumer on
    another GPU then copies across with copy_blocks (no reliance on lazy peer access). `device`
    only renames that GPU where this process numbers GPUs differently (CUDA_VISIBLE_DEVICES)."""
    with _POOLS_LOCK:
        entry = _POOLS.get((handle.name, handle.uid))
        if entry is not None:
            return entry.tensor
        if handle.kind == "shm":
            if device is not None and torch.device(device).type != "cpu":
                raise ValueError(f"device={device} must be cpu for a shm pool")
            tensor = _view(shm.map_segment(handle.name, handle.nbytes, whole=True), handle)
        else:
            local = torch.device(device if device is not None else handle.device)
            tensor = _view(cuda_ipc.open_exported(handle.ipc, local), handle)
        _POOLS[(handle.name, handle.uid)] = _Entry(tensor, None)
        return tensor


def release_pool(handle: PoolHandle) -> None:
    """Forget a pool in this process; the owner also unlinks its segment, peers never do."""
    with _POOLS_LOCK:
        entry = _POOLS.pop((handle.name, handle.uid), None)
    if entry is None:
        return
    # The mapping itself goes away when the last tensor view is dropped (views keep it alive), so
    # a caller still holding a view never touches unmapped memory.
    if entry.owner_shm is not None:
        entry.owner_shm.unlink()


def _view(buffer: object, handle: PoolHandle) -> torch.Tensor:
    """Typed, shaped view of a raw byte buffer (an mmap or a flat uint8 tensor)."""
    flat = (
        buffer if isinstance(buffer, torch.Tensor) else torch.frombuffer(buffer, dtype=torch.uint8)
    )
    return flat[: handle.nbytes].view(_torch_dtype(handle.dtype)).view(handle.shape)


def _dtype_name(dtype: torch.dtype | str) -> str:
    name = str(dtype).removeprefix("torch.")
    _torch_dtype(name)
    return name


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype={name!r} is not a torch dtype name (e.g. 'bfloat16')")
    return dtype
