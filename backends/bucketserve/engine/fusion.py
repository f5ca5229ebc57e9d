"""Inference-time transforms applied after loading (the eager HF layout stays the reference):
fuse q/k/v and gate/up projections; on CPU pre-pack weights for oneDNN and route RMSNorm,
rotary embedding + KV store, and SwiGLU through the C++ kernels (engine/csrc/cpu_ops.cpp)."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from bucketserve.engine import cpu_ops
from bucketserve.engine.model import MLP, Attention, CausalLM, RMSNorm
from bucketserve.engine.weight_arena import own_tensors, place_streamed_weights


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


log = logging.getLogger(__name__)
CPU_DTYPES = (torch.float32, torch.bfloat16)  # the C++ kernels' and oneDNN linears' dtypes


def optimize(model: CausalLM, device: torch.device, dtype: torch.dtype,
             triton_elementwise: bool = False) -> tuple[str, str]:  # fmt: skip
    """Fuse projections; on CPU route element-wise ops to the C++ kernels and
    pre-pack linears for oneDNN; with triton_elementwise, to the Triton kernels.
    Returns (linear_impl, elementwise_impl)."""
    fuse_projections(model)
    if triton_elementwise:
        use_triton_kernels(model)
        return "torch", "triton"
    is_cpu = device.type == "cpu"
    elementwise = "torch"
    if is_cpu and dtype in CPU_DTYPES and cpu_ops.load():
        use_cpu_kernels(model)
        elementwise = "cpp"
    if not (is_cpu and dtype in CPU_DTYPES and is_onednn_available()):
        return "torch", elementwise
    if dtype == torch.bfloat16 and not onednn_bf16_gemms() and not small_linear_available(dtype):
        log.warning("bfloat16 on a CPU without bf16 GEMMs in oneDNN (it needs AVX512 BW/VL/DQ) "
                    "or AVX2: linears run through torch's slow bf16 path; --dtype auto picks "
                    "float32 here")  # fmt: skip
        return "torch", elementwise
    try:
        pack_for_onednn(model)
    except RuntimeError as e:  # e.g. bf16 on a CPU without bf16 GEMMs
        log.warning("oneDNN weight packing failed (%s); using torch linears", e)
        return "torch", elementwise
    if elementwise == "cpp":
        use_decode_layers(model)
    return "onednn", elementwise


def onednn_bf16_gemms() -> bool:
    """oneDNN runs bf16 GEMMs on this CPU (AVX512 BW/VL/DQ; natively with AVX512-BF16 or AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype oneDNN's GEMMs run for weights of `dtype`: float32 for bf16 weights on CPUs
    without oneDNN bf16 GEMMs (AVX2 only), whose bf16 values are exact in float32 (the products
    and sums are then those of a bf16 GEMM with fp32 accumulation; its output is rounded back
    to bf16); otherwise `dtype` itself."""
    if dtype == torch.bfloat16 and not onednn_bf16_gemms():
        return torch.float32
    return dtype


def is_onednn_available() -> bool:
    """oneDNN's pre-packed linear ops are present in this torch build."""
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_linear_pointwise")
        and hasattr(ops, "_reorder_linear_weight")
    )


MIN_ROWS = 4  # pad smaller inputs: on Zen 4 a 4-row GEMM is faster than a 1- or 2-row one
OCTAVE_BITS = 4  # 2^4 = 16 row counts per power of two: at most 1/16 (6.25 %) padding
CHUNK_ROWS = 512  # larger inputs run as GEMMs of this many rows (and one padded rest)
# The LM head is warmed up to this many rows (one per sequence): its GEMMs are the costly
# ones (vocab-wide; 256 rows took 10 s on one core); bigger decode batches are rarer and add
# their shapes when they first run (at most 48 more, ~27 MB).
WARM_LOGIT_ROWS = 64


def padded_rows(rows: int) -> int:
    """The row count one oneDNN GEMM runs for `rows` <= CHUNK_ROWS inputs: at least MIN_ROWS,
    exact below 32, then rounded up to one of 2^OCTAVE_BITS steps per power of two.

    torch's oneDNN linear keeps ~0.56 MB for every distinct input shape it has run (its
    primitive cache; measured per shape, the same for 4 and 4,096 rows) and never gives it
    back (docs/platform-notes.md#p30-onednn-keeps-memory-per-gemm-shape). Prefill sees a new
    row count for nearly every batch (the sum of its prompt lengths), so a serving process grew
    without bound (+720 MB in a 10-minute soak). Rounding, and running larger inputs in
    CHUNK_ROWS-row chunks (`gemm_rows`), leave 93 shapes in all, each padded by at most 1/16
    (coarser steps cost: the GEMMs are compute-bound from ~16 rows, a 576 -> 3,072 linear takes
    1.44 ms at 34 rows and 1.74 ms at 40), and `warm_onednn` runs each of them once at start-up,
    so the memory is taken before serving."""
    if rows < MIN_ROWS:
        return MIN_ROWS
    shift = rows.bit_length() - 1 - OCTAVE_BITS  # rows in [2^k, 2^(k+1)): steps of 2^(k-4)
    if shift <= 0:
        return rows
    step = 1 << shift
    return -(-rows // step) * step


def gemm_rows(rows: int) -> list[int]:
    """The row counts of the GEMMs one linear over `rows` inputs runs: CHUNK_ROWS-row chunks,
    then the rest padded (so every shape comes from a fixed set of `gemm_shapes`)."""
    full, rest = divmod(rows, CHUNK_ROWS)
    return [CHUNK_ROWS] * full + ([padded_rows(rest)] if rest else [])


def gemm_shapes(max_rows: int) -> list[int]:
    """Every row count a GEMM runs for inputs of 1..max_rows rows, ascending."""
    return sorted({padded_rows(r) for r in range(1, min(max_rows, CHUNK_ROWS) + 1)})


# small_linear's K step: a weight row is read in whole 64-byte lines of this many elements.
SMALL_K_STEP = {torch.bfloat16: 32, torch.float32: 16}


def small_linear_rows(dtype: torch.dtype) -> int:
    """The most rows small_linear (csrc/small_linear.cpp, which says why) runs in `dtype` on
    this CPU, 0 where it does not: bfloat16 with AVX512-BF16 4; on CPUs with AVX2 + FMA and no
    AVX-512, float32 4 and bfloat16 16."""
    return int(torch.ops.bucketserve.small_linear_rows(dtype)) if cpu_ops.load() else 0


def small_linear_available(dtype: torch.dtype) -> bool:
    """The C++ kernels are loaded and small_linear runs `dtype` on this CPU."""
    return small_linear_rows(dtype) > 0


def streams_plain(linear: nn.Linear) -> bool:
    """small_linear can run this linear's weight (its dtype, and K a multiple of the step)."""
    step = SMALL_K_STEP.get(linear.weight.dtype)
    return step is not None and linear.in_features % step == 0


class OneDnnLinear(nn.Module):
    """Inference-only Linear whose weight is pre-packed for oneDNN.

    MKL's sgemm on AMD CPUs runs its AVX2 path; oneDNN dispatches on ISA flags (AVX-512 on
    Zen 4), which halves the LM-head matmul at decode batch sizes. Where small_linear runs the
    weight's dtype (bf16 with AVX512-BF16 or AVX2, fp32 on AVX2 CPUs) and `small` is set, it
    also keeps the plain weight (`plain_weight`): steps of at most `small_rows` rows
    (small_linear_rows) run torch.ops.bucketserve.small_linear over it, which streams the
    weights 1.3-2x faster than oneDNN's GEMMs (docs/measurements.md, 2026-12-06). bf16 weights
    on CPUs without oneDNN bf16 GEMMs are packed in float32 (`gemm_dtype`): larger steps run
    fp32 GEMMs over them, their inputs widened and outputs rounded back to bf16.
    """

    def __init__(self, linear: nn.Linear, batch_hint: int = 16, small: bool = False) -> None:
        super().__init__()
        weight = linear.weight.detach()
        self.dtype = weight.dtype
        self.gemm_dtype = gemm_dtype(weight.dtype)
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(
            weight.to(self.gemm_dtype), batch_hint
        )
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.gemm_bias = None if self.bias is None else self.bias.to(self.gemm_dtype)
        self.out_features, self.in_features = weight.shape
        small = small and streams_plain(linear)
        self.plain_weight = weight.contiguous() if small else None
        self.small_rows = small_linear_rows(weight.dtype) if small else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, in] -> [N, out]; above CHUNK_ROWS rows in chunks (same speed: the GEMM is
        compute-bound well before 512 rows; 4,000 rows 199 ms chunked vs 204 ms in one)."""
        rows = x.shape[0]
        if rows <= CHUNK_ROWS:
            return self._gemm(x)
        out = x.new_empty(rows, self.out_features)
        for start in range(0, rows, CHUNK_ROWS):
            out[start : start + CHUNK_ROWS] = self._gemm(x[start : start + CHUNK_ROWS])
        return out

    def _gemm(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if 0 < rows <= self.small_rows:
            return torch.ops.bucketserve.small_linear(x.contiguous(), self.plain_weight, self.bias)
        target = padded_rows(rows)  # few distinct shapes; 1-2 row kernels are slower
        x = x.to(self.gemm_dtype)
        if target != rows:
            x = F.pad(x, (0, 0, 0, target - rows))
        out = torch.ops.mkldnn._linear_pointwise(
            x, self.packed_weight, self.gemm_bias, "none", [], ""
        )
        return out[:rows].to(self.dtype)


@torch.inference_mode()
def warm_onednn(model: CausalLM, max_rows: int, max_logit_rows: int) -> int:
    """Run every GEMM shape the model's oneDNN linears can meet once, so the memory oneDNN
    keeps per shape is taken at start-up rather than over hours of serving (as CUDA graphs are
    captured per batch size before serving). The LM head sees one row per sequence
    (`max_logit_rows`), the others up to `max_rows` tokens. Returns how many GEMMs ran."""
    done: set[tuple] = set()
    for module in model.modules():
        if not isinstance(module, OneDnnLinear):
            continue
        cap = max_logit_rows if module is model.lm_head else max_rows
        key = (module.in_features, module.out_features, module.bias is not None, module.dtype)
        for rows in gemm_shapes(cap):
            if (key, rows) not in done:  # layers of one shape share oneDNN's primitives
                module._gemm(torch.zeros(rows, module.in_features, dtype=module.dtype))
                done.add((key, rows))
    return len(done)


def pack_for_onednn(model: CausalLM, small: bool | None = None) -> int:
    """Swap every nn.Linear for a OneDnnLinear (CPU float32/bfloat16); returns how many.
    `small` (default: small_linear_available() for the model's dtype): linears also keep
    their plain weight for small_linear, moved first into one buffer in the order a decode
    step reads them (engine/weight_arena.py). Afterwards the model owns every tensor it keeps
    (`own_tensors`: no loader buffer stays resident)."""
    if small is None:
        small = small_linear_available(next(model.parameters()).dtype)
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    # Streamed weights first into one buffer: the plain weights are views of it.
    arena = place_streamed_weights(model, streams_plain) if small else None
    packed = [OneDnnLinear(child, small=small) for _, _, child in targets]  # all or nothing
    for (parent, name, _), linear in zip(targets, packed, strict=True):
        setattr(parent, name, linear)
    own_tensors(model, arena)
    return len(targets)


class CpuRMSNorm(RMSNorm):
    """RMSNorm through the C++ kernel for [T, D] inputs (q/k norms keep the torch path)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return super().forward(x)
        return torch.ops.bucketserve.rms_norm(x, self.weight, self.eps)


class CpuAttention(Attention):
    """Attention whose rotary embedding and KV store run as one in-place C++ kernel."""

    def _rope_and_store(self, q, k, v, cos, sin, k_cache, v_cache, slot_mapping):
        cos, sin = cos.squeeze(1), sin.squeeze(1)  # [T, hd]
        torch.ops.bucketserve.rope_and_store_kv(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)
        return q, k


class CpuMLP(MLP):
    """SwiGLU whose silu(gate) * up is one C++ kernel."""

    def _act_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return torch.ops.bucketserve.silu_and_mul(gate_up)


CPU_KERNEL_CLASSES = {RMSNorm: CpuRMSNorm, Attention: CpuAttention, MLP: CpuMLP}


def use_cpu_kernels(model: CausalLM) -> int:
    """Switch RMSNorm, Attention and MLP modules to their C++-kernel subclasses (CPU float32
    or bfloat16, after cpu_ops.load()); returns how many. The subclasses add no state, only
    forward paths."""
    return swap_classes(model, CPU_KERNEL_CLASSES)


class TritonRMSNorm(RMSNorm):
    """RMSNorm as one Triton kernel for [T, D] inputs (q/k norms keep the torch path)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return super().forward(x)
        from bucketserve.engine import triton_ops

        return triton_ops.rms_norm(x, self.weight, self.eps)


class TritonAttention(Attention):
    """Attention whose rotary embedding and KV store are one in-place Triton kernel."""

    def _rope_and_store(self, q, k, v, cos, sin, k_cache, v_cache, slot_mapping):
        from bucketserve.engine import triton_ops

        triton_ops.rope_and_store(q, k, v, cos.squeeze(1), sin.squeeze(1), k_cache, v_cache,
                                  slot_mapping)  # fmt: skip
        return q, k


class TritonMLP(MLP):
    """SwiGLU whose silu(gate) * up is one Triton kernel."""

    def _act_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        from bucketserve.engine import triton_ops

        return triton_ops.silu_and_mul(gate_up)


TRITON_KERNEL_CLASSES = {RMSNorm: TritonRMSNorm, Attention: TritonAttention, MLP: TritonMLP}


def use_triton_kernels(model: CausalLM) -> int:
    """Switch RMSNorm, Attention and MLP modules to their Triton-kernel subclasses (GPU, or
    CPU under TRITON_INTERPRET=1); returns how many."""
    return swap_classes(model, TRITON_KERNEL_CLASSES)


def swap_classes(model: CausalLM, table: dict) -> int:
    """Give every module whose type is in `table` the fast subclass it maps to; returns how many."""
    swapped = 0
    for module in model.modules():
        fast = table.get(type(module))
        if fast is not None:
            module.__class__ = fast
            swapped += 1
    return swapped


class CpuCausalLM(CausalLM):
    """CausalLM whose decode-only steps on the C++ paged backend run every decoder layer in
    one C++ call (torch.ops.bucketserve.decode_layers, csrc/decode_layers.cpp): the same
    kernels and oneDNN GEMMs on the same shapes as the layers' Python path, bit for bit, without
    its per-layer module calls. Prefill, mixed and chunked steps keep the Python path."""

    decode_weights: list[torch.Tensor]

    def forward(self, input_ids, positions, meta, pool, backend):
        rows = input_ids.shape[0]
        if not (meta.decode_only(rows) and backend.name == "cpu_paged" and rows <= CHUNK_ROWS):
            return super().forward(input_ids, positions, meta, pool, backend)
        x = self.model.embed_tokens(input_ids)  # [B, D]
        cos = self.rope_cos[positions].to(x.dtype)  # [B, hd]
        sin = self.rope_sin[positions].to(x.dtype)
        c = self.config
        x = torch.ops.bucketserve.decode_layers(
            x, cos, sin, self.decode_weights, pool, meta.slot_mapping, meta.block_tables,
            meta.context_lens, c.num_heads, c.num_kv_heads, c.rms_norm_eps, c.head_dim**-0.5,
            padded_rows(rows),
        )  # fmt: skip
        return self.model.norm(x)


def use_decode_layers(model: CausalLM) -> bool:
    """Make `model` a CpuCausalLM when its layers have the shape decode_layers runs (oneDNN
    linears, C++ norms, no q/k norms); returns whether it did."""
    empty = torch.empty(0)  # no qkv bias / no plain weight
    weights = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if hasattr(attn, "q_norm") or not all(isinstance(m, OneDnnLinear) for m in linears):
            return False
        weights += [layer.input_layernorm.weight.detach(), attn.qkv_proj.packed_weight,
                    empty if attn.qkv_proj.bias is None else attn.qkv_proj.bias,
                    attn.o_proj.packed_weight, layer.post_attention_layernorm.weight.detach(),
                    mlp.gate_up_proj.packed_weight, mlp.down_proj.packed_weight]  # fmt: skip
        weights += [empty if m.plain_weight is None else m.plain_weight for m in linears]
    model.__class__ = CpuCausalLM
    model.decode_weights = weights
    return True
