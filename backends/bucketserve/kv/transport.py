"""KV pool export/import (POSIX shm on CPU, CUDA IPC on GPU) and the block gather/scatter."""

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
from bucketserve.kv.cuda_ipc import CudaIpcInfo

KINDS = ("shm", "cuda_ipc")
BLOCK_DIM = 2  # pool: [layers, 2, num_blocks, block_size, kv_heads, head_dim]


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
            tensor = _view(shm.map_segment(name, nbytes), handle)
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
            tensor = _view(shm.map_segment(handle.name, handle.nbytes), handle)
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


def _side_stream(device: torch.device):
    with _POOLS_LOCK:
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
