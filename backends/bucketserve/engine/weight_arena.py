"""One buffer for the weights a CPU decode step streams, laid out in the order it reads them.

A decode step of a few rows reads every linear's plain weight once (small_linear, csrc/
small_linear.cpp): per layer qkv, o, gate/up and down, then the LM head. Loaded one by one,
those weights sit in as many separate allocations (or, for a float32 checkpoint, in views of
safetensors' file mapping); copied into one private anonymous mapping, 2 MiB-aligned, with
transparent huge pages advised where the kernel offers them, the step reads one region front to
back. On a 2-core AVX2 EPYC VM the batch-1 step took 0.89x (bf16) and 0.96x (fp32) the time of
the same weights where they were loaded (two runners interleaved in one process:
perf/engine/weight_arena_bench.py, docs/measurements.md).

The weights are moved before oneDNN packs them, one at a time, not duplicated: each linear's
weight becomes a view of the buffer (small_linear's `plain_weight`, and what oneDNN packs from);
a tied LM head's table stays the embedding's. `own_tensors` then copies out whatever the model
keeps that is still a view of another buffer and hands the freed heap back (`malloc_trim`), so
no loader buffer stays resident: RSS 91 MB (bf16) and 267 MB (fp32) lower for SmolLM2.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
from collections.abc import Callable

import torch
from torch import nn

HUGE_PAGE = 2 << 20
ALIGN = 4096  # each weight starts on its own page


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def arena_buffer(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of `nbytes` over a private anonymous mapping, starting on a 2 MiB
    boundary, with huge pages advised (MADV_HUGEPAGE; ignored where the kernel lacks it).
    The tensor keeps the mapping alive."""
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            mapping.madvise(advice)
        except OSError:  # transparent huge pages compiled out or "never": plain pages
            pass
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # holds a reference to `mapping`
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start : start + nbytes]


def streamed_linears(model) -> list[nn.Linear]:
    """The linears a decode step streams, in its read order: per layer qkv, o, gate/up,
    down (projections fused: engine/fusion.py), then the LM head."""
    linears = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears += [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
    return linears + [model.lm_head]


@torch.inference_mode()
def place_streamed_weights(model, streams: Callable[[nn.Linear], bool]) -> torch.Tensor | None:
    """Move the weights of those `streamed_linears(model)` that `streams` (those that will
    keep a plain weight) into one arena buffer, in read order, before they are packed
    (engine/fusion.py: pack_for_onednn keeps them as the plain weights small_linear streams,
    and oneDNN packs from them); a tied embedding moves with its LM head. Returns the buffer
    (None: no linear streams)."""
    linears = [m for m in streamed_linears(model) if streams(m)]
    if not linears:
        return None
    embedding = model.model.embed_tokens
    buffer, views = arena_like([m.weight for m in linears])
    for module, view in zip(linears, views, strict=True):  # one at a time: each old one can go
        param = nn.Parameter(view.copy_(module.weight), requires_grad=False)
        if embedding.weight is module.weight:  # tied LM head: one table
            embedding.weight = param
        module.weight = param
    return buffer


def arena_like(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One `arena_buffer` with room for `tensors` in order, each on its own page: (the
    buffer, an uninitialised view per tensor, of its dtype and shape)."""
    sizes = [_aligned(t.nbytes) for t in tensors]
    buffer = arena_buffer(sum(sizes))
    views, offset = [], 0
    for t, size in zip(tensors, sizes, strict=True):
        views.append(buffer[offset : offset + t.nbytes].view(t.dtype).view(t.shape))
        offset += size
    return buffer, views


@torch.inference_mode()
def own_tensors(model, arena: torch.Tensor | None = None) -> int:
    """Give every CPU tensor the model keeps (parameters, and tensors held as module
    attributes: OneDnnLinear's plain weight and biases) outside `arena` a copy of its own, then
    hand the freed heap back (`release_freed_memory`). A float32 checkpoint's tensors are views
    of its file mapping (safetensors), which a single norm weight would keep resident whole
    (the size of the checkpoint, after oneDNN has packed copies of its linears). Tensors shared
    between modules stay shared. Returns how many were copied."""
    keep = arena.untyped_storage().data_ptr() if arena is not None else None
    copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (original, copy)

    def own(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cpu" or t.is_mkldnn or t.untyped_storage().data_ptr() == keep:
            return t
        if id(t) not in copies:  # the original is held until the end: its id stays unique
            copies[id(t)] = (t, t.clone())
        return copies[id(t)][1]

    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            owned = own(param)
            if owned is not param:
                setattr(module, name, nn.Parameter(owned, requires_grad=False))
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                setattr(module, name, own(value))
    count = len(copies)
    copies.clear()  # the originals go here, before the heap is trimmed
    release_freed_memory()
    return count


def release_freed_memory() -> bool:
    """Return the C heap's free memory to the kernel (glibc's malloc_trim); False where the
    C library has no such call."""
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    return bool(trim and trim(0) is not None)
