"""Bullet's SM-scaling roofline (SRM, arXiv 2504.19516 Eq. 1) on top of RooflineLatency.

    T(N_p) = max(FLOPs / C_p, bytes / D_p) + overhead,
    C_p = C_peak x e_c x N_p / N,   D_p = D_peak x e_b x min(1, N_p / N_d)

N SMs on the GPU, N_d the SM count that saturates HBM bandwidth (~30 on A100). Prefill is
compute-bound, so its time scales ~ N / N_p; decode is bandwidth-bound and stops improving
past N_d SMs, which is why Bullet gives decode only the SMs its TPOT SLO needs. Contention
(both phases share the memory system even on disjoint SMs) is a stated factor: Bullet measures
< 8 % GEMM loss above 60 % of SMs and calibrates decode bandwidth under co-run; we take 5 %
off prefill compute and 10 % off decode bandwidth while the other phase runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bucketserve.sim.latency import RooflineLatency

TPC = 2  # SM masks are per TPC (2 SMs) in Bullet's libsmctrl path


@dataclass(slots=True, frozen=True)
class Contention:
    """Slow-downs while prefill and decode co-run on disjoint SMs (our stated assumption)."""

    prefill_compute: float = 0.95
    decode_bandwidth: float = 0.90


class SmPartitionLatency:
    """Prefill and decode times on a share of one GPU's SMs."""

    def __init__(self, base: RooflineLatency, contention: Contention | None = None) -> None:
        if base.tp != 1:
            raise ValueError("the SM-partition model is for one GPU (tp=1)")
        self.base, self.gpu = base, base.gpu
        self.contention = contention or Contention()

    def _time(self, flops: float, nbytes: float, sms: int, compute_eff: float, bw: float) -> float:
        if not 0 < sms <= self.gpu.sms:
            raise ValueError(f"sms must be in [1, {self.gpu.sms}], got {sms}")
        share = sms / self.gpu.sms
        compute = flops / (self.gpu.flops * compute_eff * share)
        bandwidth = self.gpu.bandwidth * self.base.eff.bandwidth * bw
        memory = nbytes / (bandwidth * min(1.0, sms / self.gpu.bandwidth_sms))
        return max(compute, memory)

    def prefill_time(
        self, lengths: Sequence[int], padded: bool = False, sms: int | None = None, corun=False
    ) -> float:
        e = self.base.eff
        c = self.contention.prefill_compute if corun else 1.0
        flops, nbytes = self.base.prefill_work(lengths, padded)
        sms = self.gpu.sms if sms is None else sms
        return self._time(flops, nbytes, sms, e.prefill_compute * c, 1.0) + e.prefill_overhead_s

    def decode_time(
        self, batch: int, context_tokens: int, sms: int | None = None, corun=False
    ) -> float:
        e = self.base.eff
        bw = self.contention.decode_bandwidth if corun else 1.0
        flops, nbytes = self.base.decode_work(batch, context_tokens)
        sms = self.gpu.sms if sms is None else sms
        return self._time(flops, nbytes, sms, e.decode_compute, bw) + e.decode_overhead_s

    def min_decode_sms(self, batch: int, context_tokens: int, target_s: float) -> int:
        """Fewest SMs (whole TPCs) whose co-run decode step meets target_s; all if none does.

        Closed form of the SRM: compute needs sms >= FLOPs x N / (C x budget), bandwidth
        needs sms >= N_d x bytes / (D x budget), and no SM count beats full bandwidth.
        """
        g, e = self.gpu, self.base.eff
        budget = target_s - e.decode_overhead_s
        flops, nbytes = self.base.decode_work(batch, context_tokens)
        bw = g.bandwidth * e.bandwidth * self.contention.decode_bandwidth
        if budget <= 0 or nbytes / bw > budget:
            return g.sms
        need = max(
            flops * g.sms / (g.flops * e.decode_compute * budget),
            g.bandwidth_sms * nbytes / (bw * budget),
        )
        return min(g.sms, max(TPC, TPC * math.ceil(need / TPC - 1e-9)))

    def handoff_time(self, tokens: int) -> float:
        return 0.0  # prefill and decode share one KV pool (CUDA IPC): nothing moves

    def describe(self) -> str:
        return f"SM-partition roofline ({self.gpu.sms} SMs, N_d={self.gpu.bandwidth_sms}) over {self.base.describe()}"
