"""Sweeps: run policies x rates for one workload and collect RunMetrics."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from bucketserve.scheduling import SchedulerConfig
from bucketserve.sim.cluster import ClusterSpec
from bucketserve.sim.metrics import RunMetrics, summarize
from bucketserve.sim.simulator import Simulator
from bucketserve.sim.workload import WorkloadSpec, make_requests


@dataclass(slots=True)
class Sweep:
    """One workload's grid: every policy at every rate, same seed (common random numbers)."""

    workload: WorkloadSpec
    policies: tuple[str, ...]
    rates: tuple[float, ...]
    cluster: ClusterSpec
    latency: object
    sched_overrides: dict | None = None
    duration_s: float | None = None  # if set, at least rate x duration_s requests per run

    def config_for(self, policy: str = "") -> SchedulerConfig:
        return self.cluster.scheduler_config(
            self.workload.max_model_len, self.sched_overrides, policy
        )

    def run_one(self, policy: str, rate: float) -> RunMetrics:
        n = self.workload.num_requests
        if self.duration_s:
            n = max(n, int(rate * self.duration_s))
        spec = replace(self.workload, rate=rate, num_requests=n)
        sim = Simulator(
            policy,
            make_requests(spec),
            self.cluster,
            self.latency,
            self.config_for(policy),
            spec.max_model_len,
        )
        m = summarize(sim.run(), spec.name, rate)
        m.seed = spec.seed
        return m

    def with_seed(self, seed: int) -> Sweep:
        """The same grid on another seed's requests."""
        return replace(self, workload=replace(self.workload, seed=seed))

    def run(self, progress=None) -> list[RunMetrics]:
        rows = []
        for policy in self.policies:
            for rate in self.rates:
                rows.append(self.run_one(policy, rate))
                if progress is not None:
                    progress(rows[-1])
        return rows


def parse_rates(text: str) -> tuple[float, ...]:
    rates = tuple(float(x) for x in text.split(",") if x.strip())
    if not rates or any(r <= 0 for r in rates):
        raise ValueError(f"rates must be a comma-separated list of positive numbers, got {text!r}")
    return rates


def expand_policies(
    names: Iterable[str], all_policies: tuple[str, ...], known: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """Policy names from comma lists; "all" means all_policies; any of `known` is accepted."""
    valid = tuple(dict.fromkeys((*all_policies, *known)))
    out: list[str] = []
    for name in names:
        for part in name.split(","):
            if part == "all":
                out.extend(all_policies)
            elif part in valid:
                out.append(part)
            else:
                raise ValueError(f"policy must be one of {valid} or 'all', got {part!r}")
    return tuple(dict.fromkeys(out))
