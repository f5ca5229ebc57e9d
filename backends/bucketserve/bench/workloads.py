"""Benchmark workloads: length distributions, SLOs per source, and seeded request lists.

This is the one workload model: the simulator (bucketserve.sim.workload) draws its Alpaca and
LongBench lengths from the distributions defined here, so a workload name means the same
lengths in a simulation and in a load run. The numbers are the simulator's, which
docs/scheduling.md's tables were computed with: prompt statistics from the BucketServe paper
(Alpaca median 69 / mean 83.7, LongBench median 41,417 / mean 55,749), outputs our assumption
(the paper gives none): Alpaca median 96 / mean 128, LongBench median 256 / mean 300. The load
generator's own output guesses (Alpaca 48 / 64, LongBench 128 / 160) were never measured and
are gone; its "cpu" profile scales the shared outputs so the CPU runs draw what they drew
before (Alpaca x 1/8 = median 12 / mean 16, as before; LongBench x 1/16 = median 16, as
before, mean 18.75 instead of 20).

Each workload is a mix of sources; a request inherits its source's SLO (DistServe sets SLOs
per application, so a Mixed workload carries both the chat and the summarisation SLO).
Mixed here is 20 % LongBench-like (every measured CPU run used that); the simulator's Mixed
defaults to 10 % (`WorkloadSpec.long_fraction`, the paper-scale tables). Two profiles:
"paper" (the published length statistics, DistServe's SLOs for 13B-class chat and
summarisation) and "cpu" (same shapes, long prompts truncated to `input_cap`, outputs scaled
down and SLOs scaled to SmolLM2-135M on a 2-core CPU; see perf/README.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from bucketserve.bench.textsource import TextSource

CHAT_HEADER = "Explain this passage from the Python documentation in simple words.\n\n"
SUMMARY_HEADER = "Summarize the following document from the Python documentation.\n\n"
WORKLOADS = ("alpaca", "longbench", "mixed", "phased", "sharegpt")
PROFILES = ("paper", "cpu")
MIXED_LONG_SHARE = 0.2  # Mixed = 80 % Alpaca-like + 20 % LongBench-like requests
# Phased: Mixed's sources, the LongBench-like share switching every PHASE_REQUESTS requests
# between a long-heavy phase and an Alpaca-only one (mean = Mixed's share). The simulator's
# phased switches by time (sim/workload.py PHASE_S); a load run's send times scale with its
# rate, so here a phase is a number of requests (at 1 req/s, 30 s).
PHASE_REQUESTS = 30
PHASE_LONG_SHARES = (2 * MIXED_LONG_SHARE, 0.0)


@dataclass(frozen=True, slots=True)
class LengthDist:
    """Log-normal token lengths given by median and mean, rounded and clipped to [low, high]."""

    median: float
    mean: float
    low: int
    high: int

    def __post_init__(self) -> None:
        if not 0 < self.median <= self.mean:
            raise ValueError(f"need 0 < median <= mean, got {self.median}, {self.mean}")
        if not 1 <= self.low <= self.high:
            raise ValueError(f"need 1 <= low <= high, got {self.low}, {self.high}")

    @property
    def sigma(self) -> float:
        return math.sqrt(2.0 * math.log(self.mean / self.median))

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` raw log-normal draws, not rounded or clipped (the simulator clips its own way)."""
        return rng.lognormal(math.log(self.median), self.sigma, n)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.clip(np.rint(self.draw(rng, n)), self.low, self.high).astype(np.int64)

    def scaled(self, factor: float, high: int) -> LengthDist:
        low = min(self.low, high)
        return LengthDist(self.median * factor, self.mean * factor, low, high)

    def describe(self) -> str:
        return f"lognormal(median {self.median:g}, mean {self.mean:g}) clipped to [{self.low}, {self.high}]"


@dataclass(frozen=True, slots=True)
class Source:
    """One request population: prompt/output lengths, its SLO pair and prompt header."""

    name: str
    input: LengthDist
    output: LengthDist
    ttft_slo_s: float  # the TTFT SLO, or its floor when ttft_per_token_s > 0
    tpot_slo_s: float
    header: str = CHAT_HEADER
    ttft_per_token_s: float = 0.0  # Bullet-style normalised TTFT: max(floor, per_token x prompt)

    def ttft_slo_for(self, prompt_tokens: int) -> float:
        return max(self.ttft_slo_s, self.ttft_per_token_s * prompt_tokens)

    def describe_slo(self) -> str:
        ttft = f"{self.ttft_slo_s:g} s"
        if self.ttft_per_token_s > 0:
            ttft = f"max({ttft}, {self.ttft_per_token_s * 1e3:g} ms x prompt tokens)"
        return f"TTFT {ttft}, TPOT {self.tpot_slo_s:g} s"


@dataclass(frozen=True, slots=True)
class Workload:
    """A named mix of sources with their weights."""

    name: str
    sources: tuple[Source, ...]
    weights: tuple[float, ...]
    phases: tuple[tuple[float, ...], ...] = ()  # weights per phase of PHASE_REQUESTS requests

    def describe(self) -> list[str]:
        lines = []
        for src, w in zip(self.sources, self.weights, strict=True):
            lines.append(
                f"{src.name} ({w:.0%}): input {src.input.describe()}; output "
                f"{src.output.describe()}; SLO {src.describe_slo()}"
            )
        if self.phases:
            shares = " / ".join(
                ", ".join(f"{s.name} {w:.0%}" for s, w in zip(self.sources, ph, strict=True))
                for ph in self.phases
            )  # fmt: skip
            lines.append(f"phases of {PHASE_REQUESTS} requests, in turn: {shares}")
        return lines


@dataclass(slots=True)
class BenchRequest:
    """One request of a workload; min_tokens = max_tokens = output_tokens."""

    idx: int
    source: str
    prompt: str
    input_tokens: int
    output_tokens: int
    ttft_slo_s: float
    tpot_slo_s: float
    slo_class: str = "online"


# The shared length distributions (see the module docstring for where each number comes from).
ALPACA_PROMPT = LengthDist(69, 83.7, 4, 2048)
ALPACA_OUTPUT = LengthDist(96, 128, 4, 512)
LONGBENCH_PROMPT = LengthDist(41417, 55749.3, 256, 7680)  # truncated to the context budget
LONGBENCH_OUTPUT = LengthDist(256, 300, 16, 512)
# ShareGPT (load generator only): published means (input 161, output 338); medians are ours.
SHAREGPT_PROMPT = LengthDist(90, 161, 4, 4096)
SHAREGPT_OUTPUT = LengthDist(250, 338, 4, 1024)

PAPER_SOURCES = {
    "alpaca": Source("alpaca", ALPACA_PROMPT, ALPACA_OUTPUT, 0.25, 0.1),
    "longbench": Source(
        "longbench", LONGBENCH_PROMPT, LONGBENCH_OUTPUT, 15.0, 0.15, SUMMARY_HEADER
    ),
    "sharegpt": Source("sharegpt", SHAREGPT_PROMPT, SHAREGPT_OUTPUT, 0.25, 0.1),
}

# CPU profile (SmolLM2-135M, 2 cores): output scale and cap, SLOs (TTFT normalised per prompt
# token with a floor, so one rule fits any prompt cap). LongBench prompts keep the
# paper's log-normal shape scaled down so the median sits at LONG_MEDIAN_OF_CAP x the cap, then
# are truncated at the cap (plain truncation of a 41k-token median would make them all equal).
LONG_MEDIAN_OF_CAP = 0.6
CPU_TTFT_PER_TOKEN_S = 0.008  # needs >= 125 prompt tokens/s of prefill per request
CPU_SCALING = {
    "alpaca": dict(output_scale=1 / 8, output_cap=64, ttft_slo_s=2.0, tpot_slo_s=0.15),
    "longbench": dict(output_scale=1 / 16, output_cap=64, ttft_slo_s=2.0, tpot_slo_s=0.2),
    "sharegpt": dict(output_scale=0.1, output_cap=64, ttft_slo_s=2.0, tpot_slo_s=0.15),
}
CPU_INPUT_CAP = 1500


def source(name: str, profile: str = "cpu", input_cap: int | None = None) -> Source:
    """The `name` source in `profile`; `input_cap` overrides the prompt truncation."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    src = PAPER_SOURCES[name]
    if profile == "cpu":
        s = CPU_SCALING[name]
        cap = min(src.input.high, input_cap or CPU_INPUT_CAP)
        factor = LONG_MEDIAN_OF_CAP * cap / src.input.median if name == "longbench" else 1.0
        src = replace(
            src,
            input=src.input.scaled(factor, cap),
            output=src.output.scaled(s["output_scale"], s["output_cap"]),
            ttft_slo_s=s["ttft_slo_s"],
            tpot_slo_s=s["tpot_slo_s"],
            ttft_per_token_s=CPU_TTFT_PER_TOKEN_S,
        )
    elif input_cap is not None:
        src = replace(
            src, input=replace(src.input, high=input_cap, low=min(src.input.low, input_cap))
        )
    return src


def workload(name: str, profile: str = "cpu", input_cap: int | None = None) -> Workload:
    """alpaca | longbench | mixed | sharegpt in a profile."""
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, got {name!r}")
    if name in ("mixed", "phased"):
        parts = (source("alpaca", profile, input_cap), source("longbench", profile, input_cap))
        phases = tuple((1.0 - s, s) for s in PHASE_LONG_SHARES) if name == "phased" else ()
        return Workload(name, parts, (1.0 - MIXED_LONG_SHARE, MIXED_LONG_SHARE), phases)
    return Workload(name, (source(name, profile, input_cap),), (1.0,))


def sample_lengths(wl: Workload, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source index, input length, output length) per request; deterministic for a seed."""
    rng = np.random.default_rng(seed)
    which = rng.choice(len(wl.sources), size=n, p=np.asarray(wl.weights) / sum(wl.weights))
    if wl.phases:  # the source of request i by its phase's weights (one uniform draw each)
        cum = np.cumsum(np.asarray(wl.phases) / np.sum(wl.phases, axis=1, keepdims=True), axis=1)
        phase = (np.arange(n) // PHASE_REQUESTS) % len(wl.phases)
        u = np.random.default_rng([seed, 3]).random(n)
        which = np.minimum((u[:, None] >= cum[phase]).sum(axis=1), len(wl.sources) - 1)
    ins = np.zeros(n, dtype=np.int64)
    outs = np.zeros(n, dtype=np.int64)
    for k, src in enumerate(wl.sources):
        mask = which == k
        ins[mask] = src.input.sample(rng, int(mask.sum()))
        outs[mask] = src.output.sample(rng, int(mask.sum()))
    return which, ins, outs


def build_requests(wl: Workload, n: int, seed: int, text: TextSource) -> list[BenchRequest]:
    """`n` requests of real text with the drawn lengths; same seed -> same list."""
    which, ins, outs = sample_lengths(wl, n, seed)
    offsets = np.random.default_rng([seed, 1]).integers(0, 2**31, size=n)
    reqs = []
    for i in range(n):
        src = wl.sources[int(which[i])]
        prompt, actual = text.prompt(src.header, int(ins[i]), int(offsets[i]))
        reqs.append(
            BenchRequest(
                i, src.name, prompt, actual, int(outs[i]), src.ttft_slo_for(actual), src.tpot_slo_s
            )
        )
    return reqs


def requests_from_lengths(
    lengths: list[tuple[int, int]], seed: int, text: TextSource, slo: Source, name: str = "trace"
) -> list[BenchRequest]:
    """Requests for given (input, output) lengths, e.g. a replayed trace, under `slo`'s SLOs."""
    offsets = np.random.default_rng([seed, 2]).integers(0, 2**31, size=len(lengths))
    reqs = []
    for i, (n_in, n_out) in enumerate(lengths):
        prompt, actual = text.prompt(slo.header, n_in, int(offsets[i]))
        ttft = slo.ttft_slo_for(actual)
        reqs.append(BenchRequest(i, name, prompt, actual, n_out, ttft, slo.tpot_slo_s))
    return reqs
