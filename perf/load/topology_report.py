"""Summarise `perf/load/compare.py --topologies ...` runs over several seeds.

Per (label, rate): SLO attainment, TTFT and TPOT p50/p90, requests lost, and a steady-state
check of the send window: a run is flagged when its last third attains clearly less than its
first two thirds (a growing backlog) or when its median TTFT in the last third is more than
twice the first third's. Per label: goodput@90 per seed (the highest rate at 90 % attainment,
interpolated; bench.metrics.goodput), their mean and a 95 % t-interval, and the ratios paired
by seed: every other topology over disaggregated, and hybrid over each colocated label. For
hybrid runs, the role controller's layout changes and the decodes moved per rate (from each
run's summary.csv, the server's own counters).

    .venv/bin/python perf/load/topology_report.py perf/results/2026-12-03-*-topology-seed*

A seed may come from several runs (more rates on a second server start): name its folders
joined by commas, e.g. `...-seed0,...-hi-seed0`.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from pathlib import Path

from bucketserve.bench.metrics import goodput, percentile

T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57}  # two-sided 95 % t quantiles by dof


def ok(row: dict) -> bool:
    if row.get("error") or row.get("ttft_s") is None:
        return False
    tpot = row.get("tpot_s") or 0.0
    return row["ttft_s"] <= row["ttft_slo_s"] and tpot <= row["tpot_slo_s"]


def attained(rows: list[dict]) -> float:
    return sum(ok(r) for r in rows) / len(rows)


def median_ttft(rows: list[dict]) -> float:
    return statistics.median(
        [r["ttft_s"] for r in rows if r.get("ttft_s") is not None] or [math.nan]
    )


def run_stats(rows: list[dict]) -> dict:
    """Attainment, latency percentiles and the steady-state check of one (label, rate) file."""
    rows = sorted(rows, key=lambda r: r["t_send_s"])
    third = max(1, len(rows) // 3)
    head, tail = rows[: len(rows) - third], rows[len(rows) - third :]
    ttft = [r["ttft_s"] for r in rows if r.get("ttft_s") is not None]
    tpot = [r["tpot_s"] for r in rows if r.get("tpot_s") is not None]
    growing = (attained(tail) < attained(head) - 0.15
               or median_ttft(tail) > 2 * median_ttft(rows[:third]))  # fmt: skip
    return {
        "n": len(rows), "lost": sum(1 for r in rows if r.get("error")),
        "attainment": attained(rows), "tail_attainment": attained(tail), "steady": not growing,
        "ttft_p50": percentile(ttft, 50), "ttft_p90": percentile(ttft, 90),
        "tpot_p50": percentile(tpot, 50), "tpot_p90": percentile(tpot, 90),
    }  # fmt: skip


def load(runs: list[Path]) -> dict[str, dict[int, dict[float, dict]]]:
    """{label: {seed: {rate: stats}}}."""
    out: dict[str, dict[int, dict[float, dict]]] = {}
    for seed, group in enumerate(runs):
        paths = [
            p for run in folders(group) for p in sorted((run / "requests").glob("*_rate*.jsonl"))
        ]
        for path in paths:
            label, rate = path.stem.rsplit("_rate", 1)
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            out.setdefault(label, {}).setdefault(seed, {})[float(rate)] = run_stats(rows)
    return out


def folders(group: Path) -> list[Path]:
    """The run folders of one seed: `a,b` names two."""
    return [Path(x) for x in str(group).split(",")]


def mean_ci(values: list[float]) -> str:
    m = statistics.mean(values)
    if len(values) < 2:
        return f"{m:.2f}"
    half = T95.get(len(values) - 1, 2.0) * statistics.stdev(values) / math.sqrt(len(values))
    return f"{m:.2f} ± {half:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--target", type=float, default=0.9)
    a = p.parse_args(argv)
    data = load(a.runs)
    print(
        "| label | rate | attainment (seeds) | last third | TTFT p50 / p90 s | TPOT p50 / p90 s | lost | steady |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, seeds in data.items():
        for rate in sorted({r for s in seeds.values() for r in s}):
            st = [s[rate] for s in seeds.values() if rate in s]
            f = {k: statistics.mean(x[k] for x in st) for k in st[0] if k != "steady"}
            atts = " / ".join(f"{x['attainment']:.2f}" for x in st)
            print(f"| {label} | {rate:g} | {atts} | {f['tail_attainment']:.2f} | "
                  f"{f['ttft_p50']:.2f} / {f['ttft_p90']:.2f} | {f['tpot_p50']:.3f} / {f['tpot_p90']:.3f} | "
                  f"{sum(x['lost'] for x in st)} | {sum(x['steady'] for x in st)}/{len(st)} |")  # fmt: skip
    print()
    good: dict[str, dict[int, float]] = {}
    censored: dict[str, int] = {}
    exact: dict[str, set[int]] = {}
    for label, seeds in data.items():
        for seed, rates in seeds.items():
            rs = sorted(rates)
            g = goodput(rs, [rates[r]["attainment"] for r in rs], a.target)
            good.setdefault(label, {})[seed] = g.rate
            censored[label] = censored.get(label, 0) + (g.kind != "interpolated")
            if g.kind == "interpolated":
                exact.setdefault(label, set()).add(seed)
            print(f"{label} seed {seed}: goodput@{a.target:g} {g.label()} req/s ({g.kind})")
    for label, by_seed in good.items():
        if censored[label]:  # a bound is not a value: no mean over it
            print(f"{label}: goodput@{a.target:g} outside the measured rates in {censored[label]} of {len(by_seed)} seeds: no mean")  # fmt: skip
            continue
        print(f"{label}: goodput@{a.target:g} {mean_ci(list(by_seed.values()))} req/s (95 % t-interval, {len(by_seed)} seeds)")  # fmt: skip
    labels = sorted(good)
    disagg = [x for x in labels if x.endswith("@disaggregated")]
    pairs = [(c, d) for d in disagg for c in labels
             if c != d and c.split("@")[0] == d.split("@")[0]]  # fmt: skip
    pairs += [(h, c) for h in labels if h.endswith("@hybrid") for c in labels
              if "@colocated" in c and c.split("@")[0] == h.split("@")[0]]  # fmt: skip
    for c, d in pairs:
        ratios = [good[c][s] / good[d][s] for s in good[c]
                  if good[d].get(s) and s in exact[c] and s in exact[d]]  # fmt: skip
        if not ratios:
            print(f"{c} / {d}: no seed where both goodputs fall inside the measured rates")
        else:
            print(f"{c} / {d}: {mean_ci(ratios)}x (paired by seed: {', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
    roles = role_counts(a.runs)
    if roles:
        print()
        for (label, rate), per_seed in sorted(roles.items()):
            changes = " / ".join(f"{c:g}" for c, _ in per_seed)
            moves = " / ".join(f"{m:g}" for _, m in per_seed)
            print(f"{label} rate {rate:g}: layout changes {changes}, decodes moved {moves} (seeds)")
    return 0


def role_counts(runs: list[Path]) -> dict[tuple[str, float], list[tuple[float, float]]]:
    """{(label, rate): [(role changes, migrations) per seed]} of the runs that had any."""
    out: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for run in [r for group in runs for r in folders(group)]:
        path = run / "summary.csv"
        if not path.exists():
            continue
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("role_changes") in (None, "") or "@hybrid" not in row["label"]:
                    continue
                key = (row["label"], float(row["offered_rate"]))
                out.setdefault(key, []).append(
                    (float(row["role_changes"]), float(row["migrations"]))
                )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
