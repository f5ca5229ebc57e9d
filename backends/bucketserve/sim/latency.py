"""Latency models the simulator charges for prefill batches, decode steps and KV hand-offs.

RooflineLatency: time = max(FLOPs / (peak x e_c), bytes / (bandwidth x e_b)) + overhead, with
stated efficiency factors. FittedLatency: SCLS's bilinear forms fitted by least squares to
perf/engine/engine_bench.py JSON lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bucketserve.sim.hardware import GpuSpec, ModelSpec


@dataclass(slots=True, frozen=True)
class Efficiency:
    """Achieved fractions of peak and fixed per-call overheads (our stated assumptions).

    prefill compute 0.6 (vLLM-class prefill MFU on A100 is ~50-65 %); bandwidth 0.8 (decode
    GEMV + paged attention reach ~75-85 % of HBM peak); decode compute 0.5; per prefill batch
    5 ms and per decode step 4 ms of launch/scheduling overhead (CUDA-graph decode).
    """

    prefill_compute: float = 0.6
    decode_compute: float = 0.5
    bandwidth: float = 0.8
    prefill_overhead_s: float = 5e-3
    decode_overhead_s: float = 4e-3
    handoff_overhead_s: float = 1e-3
    allreduce_latency_s: float = 10e-6  # per tensor-parallel all-reduce (NCCL, NVLink)


class RooflineLatency:
    """Roofline times for one instance of `tp` GPUs.

    Tensor parallelism (Megatron-style) splits FLOPs, weight bytes and KV bytes evenly over
    the tp GPUs, so compute and bandwidth terms divide by tp; it adds two all-reduces per
    layer of tokens x hidden activations (ring: 2 (tp - 1) / tp of the bytes over the link,
    plus allreduce_latency_s each), serialized with the step. A hand-off from a TP instance
    moves each GPU's shard in parallel (tp links).
    """

    def __init__(
        self, model: ModelSpec, gpu: GpuSpec, tp: int = 1, eff: Efficiency | None = None
    ) -> None:
        self.model, self.gpu, self.tp = model, gpu, tp
        self.eff = eff or Efficiency()

    def prefill_work(self, lengths: Sequence[int], padded: bool = False) -> tuple[float, float]:
        """(FLOPs, bytes) of one prefill batch (padded: every prompt as long as the longest)."""
        m = self.model
        eff_lengths = [max(lengths)] * len(lengths) if padded else list(lengths)
        tokens = sum(eff_lengths)
        attn = 2.0 * m.layers * m.hidden * sum(s * s for s in eff_lengths)  # causal QK^T + AV
        return 2.0 * m.params * tokens + attn, m.weight_bytes + tokens * m.kv_bytes_per_token

    def decode_work(self, batch: int, context_tokens: int) -> tuple[float, float]:
        """(FLOPs, bytes) of one decode step over `batch` sequences."""
        m = self.model
        flops = 2.0 * m.params * batch + 4.0 * m.layers * m.hidden * context_tokens
        return flops, m.weight_bytes + (context_tokens + batch) * m.kv_bytes_per_token

    def _time(self, flops: float, nbytes: float, compute_eff: float) -> float:
        compute = flops / (self.tp * self.gpu.flops * compute_eff)
        return max(compute, nbytes / (self.tp * self.gpu.bandwidth * self.eff.bandwidth))

    def comm_time(self, tokens: int) -> float:
        """Tensor-parallel all-reduces of one forward pass over `tokens` tokens (0 at tp=1)."""
        if self.tp == 1:
            return 0.0
        m = self.model
        ring = 2.0 * (self.tp - 1) / self.tp * tokens * m.hidden * m.dtype_bytes
        return 2 * m.layers * (ring / self.gpu.link_bandwidth + self.eff.allreduce_latency_s)

    def prefill_time(self, lengths: Sequence[int], padded: bool = False) -> float:
        e = self.eff
        tokens = max(lengths) * len(lengths) if padded else sum(lengths)
        return (
            self._time(*self.prefill_work(lengths, padded), e.prefill_compute)
            + self.comm_time(tokens)
            + e.prefill_overhead_s
        )

    def decode_time(self, batch: int, context_tokens: int) -> float:
        e = self.eff
        return (
            self._time(*self.decode_work(batch, context_tokens), e.decode_compute)
            + self.comm_time(batch)
            + e.decode_overhead_s
        )

    def hybrid_time(
        self, batch: int, context_tokens: int, chunks: Sequence[tuple[int, int]]
    ) -> float:
        """One Sarathi iteration: a decode step fused with prefill chunks (tokens, prefix).

        Weights are read once for the fused batch; chunk attention reads its prefix's KV.
        """
        m, e = self.model, self.eff
        flops, nbytes = self.decode_work(batch, context_tokens) if batch else (0.0, m.weight_bytes)
        for tokens, prefix in chunks:
            flops += 2.0 * m.params * tokens + 4.0 * m.layers * m.hidden * tokens * (
                prefix + tokens / 2
            )
            nbytes += (prefix + tokens) * m.kv_bytes_per_token
        compute_eff = e.prefill_compute if chunks else e.decode_compute
        tokens = batch + sum(t for t, _ in chunks)
        return self._time(flops, nbytes, compute_eff) + self.comm_time(tokens) + e.decode_overhead_s

    def handoff_time(self, tokens: int) -> float:
        return (
            tokens * self.model.kv_bytes_per_token / (self.tp * self.gpu.link_bandwidth)
            + self.eff.handoff_overhead_s
        )

    def describe(self) -> str:
        e = self.eff
        return (
            f"roofline {self.model.name} on {self.tp}x{self.gpu.name}: "
            f"{self.gpu.flops / 1e12:.0f} TFLOP/s x {e.prefill_compute} (prefill) / {e.decode_compute} (decode), "
            f"{self.gpu.bandwidth / 1e12:.3f} TB/s x {e.bandwidth}, overheads {e.prefill_overhead_s * 1e3:.0f} ms/batch, "
            f"{e.decode_overhead_s * 1e3:.0f} ms/step"
        )


def _bilinear(n: np.ndarray, length: np.ndarray) -> np.ndarray:
    return np.stack([n * length, n, length, np.ones_like(n)], axis=1)


REDUCED = {"prefill": (0, 3), "decode": (1, 3)}  # N*L + const, N + const


def _fit(n: list[float], length: list[float], seconds: list[float], phase: str) -> np.ndarray:
    """Least squares for the bilinear form; with fewer than 4 distinct (N, L) points, the
    reduced form the points can determine (prefill p1 N L + p4, decode d2 N + d4)."""
    x = _bilinear(np.asarray(n, float), np.asarray(length, float))
    y = np.asarray(seconds, float)
    coef = np.zeros(4)
    cols = list(REDUCED[phase]) if len(set(zip(n, length, strict=True))) < 4 else [0, 1, 2, 3]
    coef[cols], *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
    return coef


class FittedLatency:
    """T_prefill(N, L) and tau_decode(N, l) fitted to measured engine_bench rows."""

    def __init__(
        self,
        prefill_coef: np.ndarray,
        decode_coef: np.ndarray,
        handoff_bytes_per_s: float,
        kv_bytes: int,
    ):
        self.prefill_coef, self.decode_coef = prefill_coef, decode_coef
        self.handoff_bytes_per_s, self.kv_bytes = handoff_bytes_per_s, kv_bytes

    @classmethod
    def from_rows(
        cls,
        rows: Iterable[dict],
        kv_bytes: int,
        handoff_bytes_per_s: float = 10e9,
        impl: str | None = None,
    ):
        """rows: dicts with phase, batch, tokens_per_s, prompt_len (and impl)."""
        data: dict[str, tuple[list, list, list]] = {"prefill": ([], [], []), "decode": ([], [], [])}
        for row in rows:
            if impl is not None and row.get("impl") != impl or row.get("phase") not in data:
                continue
            n, length, tps = (
                float(row["batch"]),
                float(row["prompt_len"]),
                float(row["tokens_per_s"]),
            )
            tokens = n * length if row["phase"] == "prefill" else n
            cols = data[row["phase"]]
            cols[0].append(n), cols[1].append(length), cols[2].append(tokens / tps)
        for phase, cols in data.items():
            if len(set(zip(cols[0], cols[1], strict=True))) < 2:
                raise ValueError(f"need >= 2 distinct {phase} (batch, length) points to fit")
        return cls(_fit(*data["prefill"], "prefill"), _fit(*data["decode"], "decode"),
                   handoff_bytes_per_s, kv_bytes)  # fmt: skip

    @classmethod
    def from_jsonl(
        cls, path: str | Path, kv_bytes: int, impl: str | None = None, **kw
    ) -> FittedLatency:
        lines = Path(path).read_text().splitlines()
        return cls.from_rows(
            (json.loads(s) for s in lines if s.strip().startswith("{")), kv_bytes, impl=impl, **kw
        )

    def prefill_time(self, lengths: Sequence[int], padded: bool = False) -> float:
        n, longest = len(lengths), max(lengths)
        mean = longest if padded else sum(lengths) / n
        p1, p2, p3, p4 = self.prefill_coef
        return max(1e-4, p1 * n * mean + p2 * n + p3 * longest + p4)

    def decode_time(self, batch: int, context_tokens: int) -> float:
        d1, d2, d3, d4 = self.decode_coef
        mean_ctx = context_tokens / max(batch, 1)
        return max(1e-4, d1 * batch * mean_ctx + d2 * batch + d3 * mean_ctx + d4)

    def hybrid_time(
        self, batch: int, context_tokens: int, chunks: Sequence[tuple[int, int]]
    ) -> float:
        """A fused iteration as a decode step plus a packed prefill of the chunks (an upper
        bound: the fit has no shared weight read)."""
        t = self.decode_time(batch, context_tokens) if batch else 0.0
        return t + (self.prefill_time([c for c, _ in chunks]) if chunks else 0.0)

    def handoff_time(self, tokens: int) -> float:
        return tokens * self.kv_bytes / self.handoff_bytes_per_s + 1e-3

    def describe(self) -> str:
        return f"fitted bilinear: prefill {np.round(self.prefill_coef, 9).tolist()}, decode {np.round(self.decode_coef, 9).tolist()}"
