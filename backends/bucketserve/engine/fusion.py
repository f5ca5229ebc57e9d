"""Inference-time weight transforms applied after loading (the eager HF layout stays the
reference): fuse q/k/v and gate/up projections, and on CPU pre-pack weights for oneDNN."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bucketserve.engine.model import MLP, Attention, CausalLM


def _fused_linear(parts: list[nn.Linear]) -> nn.Linear:
    weight = torch.cat([p.weight for p in parts], dim=0)
    has_bias = parts[0].bias is not None
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias, device="meta")
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if has_bias:
        fused.bias = nn.Parameter(torch.cat([p.bias for p in parts]), requires_grad=False)
    return fused


def fuse_projections(model: CausalLM) -> None:
    """Replace q/k/v and gate/up with one matmul each (fewer, larger GEMMs)."""
    for module in model.modules():
        if isinstance(module, Attention):
            module.qkv_proj = _fused_linear([module.q_proj, module.k_proj, module.v_proj])
            del module.q_proj, module.k_proj, module.v_proj
        elif isinstance(module, MLP):
            module.gate_up_proj = _fused_linear([module.gate_proj, module.up_proj])
            del module.gate_proj, module.up_proj


def is_onednn_available() -> bool:
    """oneDNN's pre-packed linear ops are present in this torch build."""
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_linear_pointwise")
        and hasattr(ops, "_reorder_linear_weight")
    )


MIN_ROWS = 4  # pad smaller inputs: on Zen 4 a 4-row GEMM is faster than a 1- or 2-row one


class OneDnnLinear(nn.Module):
    """Inference-only Linear whose weight is pre-packed for oneDNN.

    MKL's sgemm on AMD CPUs runs its AVX2 path; oneDNN dispatches on ISA flags (AVX-512 on
    Zen 4), which halves the LM-head matmul at decode batch sizes.
    """

    def __init__(self, linear: nn.Linear, batch_hint: int = 16) -> None:
        super().__init__()
        weight = linear.weight.detach()
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.out_features = weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, in] -> [N, out]."""
        rows = x.shape[0]
        if rows < MIN_ROWS:  # measured: oneDNN's 1-2 row kernels stream weights slower
            x = F.pad(x, (0, 0, 0, MIN_ROWS - rows))
        out = torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
        return out[:rows]


def pack_for_onednn(model: CausalLM) -> int:
    """Swap every nn.Linear for a OneDnnLinear (CPU float32/bfloat16); returns how many."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    packed = [OneDnnLinear(child) for _, _, child in targets]  # all or nothing
    for (parent, name, _), linear in zip(targets, packed, strict=True):
        setattr(parent, name, linear)
    return len(targets)
