"""The generated part of docs/scheduling.md: method, tables and verdicts, from per-seed goodput."""

from __future__ import annotations

import math

from bucketserve.sim.evidence import DURATION, GRID, SEEDS, SYSTEMS
from bucketserve.sim.evidence_report import (
    best_placement,
    ratios,
    table,
    top_rates,
    values,
)
from bucketserve.sim.stats import fmt_ci, mean_ci


def _labels(group: str) -> list[str]:
    return [s.label for s in SYSTEMS if s.group == group]


def method(g: dict, rows: list[dict], wall_s: float | None) -> list[str]:
    grid = "; ".join(
        f"{w}: {v[0]:g} to {v[-1]:g} step {v[1] - v[0]:g} req/s" for w, v in GRID.items()
    )
    clamped = sum(v["clamped"] for seeds in g.values() for v in seeds.values())
    runs = len(rows)
    growing = sum(r["growing"] for r in rows)
    took = f" in {wall_s / 60:.1f} min wall" if wall_s else ""
    cpu = [r["cpu_s"] for r in rows if not math.isnan(r.get("cpu_s", math.nan))]
    if cpu:  # what two idle cores would need: the measured CPU seconds over two workers
        took += (f"; the {len(cpu)} runs with a CPU-time record used {sum(cpu) / 60:.0f} CPU-min "
                 f"(mean {sum(cpu) / len(cpu):.1f} s per run)")  # fmt: skip
    horizon = sorted({f"{s.duration:g} s" for s in SYSTEMS if s.duration})
    return [
        f"Method (every table below): {len(SEEDS)} seeds (0–{len(SEEDS) - 1}; seed k gives every "
        f"system the same requests), values are **mean ± 95 % CI** (Student t over seeds). "
        f"Arrivals: Poisson, {', '.join(f'{w} {d:g} s' for w, d in DURATION.items())} per run "
        f"(horizon check below: {', '.join(horizon)}). Rate grid, fixed: {grid}. A sweep stops after the first "
        "rate below 80 % under both SLO definitions. A rate counts only if `sim/steady.py` finds "
        "the run steady (its backlog grew over the second half by at most 2 % of the offered "
        "rate or 10 requests, less than 20 s of arrivals unfinished at the end, no last-third "
        "collapse) and is judged by the worse of its whole-run and last-third attainment; "
        "goodput is interpolated "
        "on the grid and clamped to the sustained capacity (highest served rate seen; "
        f"{clamped} of the per-seed values needed the clamp). {runs} runs, {growing} flagged as "
        f"growing{took}. Goodput in req/s for the whole cluster (4 GPUs everywhere).",
        "",
        "SLOs: TTFT max(0.25 s, 1.5 ms × prompt tokens), TPOT 0.1 s (mean per request), as "
        "before; the **p90-TBT** column asks instead that 90 % of each request's gaps between "
        "tokens are within 0.1 s (a per-token tail SLO that prefill stalls break).",
    ]


def main_tables(g: dict) -> list[str]:
    out = []
    for w in GRID:
        if not any(k[1] == w for k in g):
            out += [f"#### {w.capitalize()}: not run yet", ""]
            continue
        best = best_placement(g, w)
        systems = [s for s in _labels("main")]
        out += [f"#### {w.capitalize()} (DistServe's placement search picks **{best}**)", ""]
        out += table(g, systems, w)
        top = top_rates(g, w, GRID[w][-1])
        if top:
            out.append(f"\nReached the top of the grid (a lower bound): {', '.join(top)}.")
        out.append("")
    return out


def _verdict(r: list[float], claim: float, reason: str) -> str:
    m, h = mean_ci(r)
    if not r:
        return "not measured"
    hi = m if math.isnan(h) else m + h
    if hi >= claim:
        return "**reproduced**"
    # simulator errors up to 62 % and algorithm details from secondary notes: not "refuted"
    return f"**not reproduced on a shared simulated engine**: {reason}"


def claims(g: dict, offline: list[dict], rows: list[dict]) -> list[str]:
    off: dict[str, dict[int, float]] = {}
    for r in offline:
        off.setdefault(r["system"], {})[int(r["seed"])] = float(r["throughput_tok_s"])
    bo, do = off.get("bucketserve 2P2D", {}), off.get("distserve 2P2D", {})
    off_ratio = [bo[s] / do[s] for s in sorted(bo) if s in do]
    same = "distserve 2P2D"
    items = [("offline throughput vs DistServe, Mixed", 1.31, off_ratio, off_ratio,
              "offline Mixed is decode-KV-bound; prefill batching cannot raise it")]  # fmt: skip
    for w, claim in (("mixed", 1.93), ("alpaca", 1.37)):
        best = best_placement(g, w)
        items.append((f"load at 80 % vs DistServe, {w} (searched: {best})", claim,
                      ratios(g, "bucketserve 2P2D", best, w, 0.8),
                      ratios(g, "bucketserve 2P2D", same, w, 0.8),
                      "mostly our decode-headroom admission (not in the paper) against "
                      "DistServe's prefill-only one; with the same admission (padded table: "
                      "fcfs-pad vs bucketserve) the ratio is ≈ 1.0"))  # fmt: skip
    best = best_placement(g, "mixed")
    items.append(("capacity vs DistServe, Mixed", 1.4,
                  ratios(g, "bucketserve 2P2D", best, "mixed", "capacity"),
                  ratios(g, "bucketserve 2P2D", same, "mixed", "capacity"),
                  "both are decode-KV-bound, and our decode-headroom admission (not in the "
                  "paper) admits less than DistServe's prefill-only one"))  # fmt: skip
    lines = ["| claim | paper | vs DistServe, searched placement | vs DistServe 2P2D | verdict |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, claim, r, r_same, reason in items:
        verdict = _verdict(r, claim, reason)
        lines.append(f"| {name} | {claim}× | {fmt_ci(r)}× | {fmt_ci(r_same)}× | {verdict} |")
    lines.append(_overhead(rows))
    for name, claim in (
        ("offline throughput vs UELLM", "3.58×"),
        ("capacity vs UELLM, Alpaca / Mixed", "1.975× / 3.47×"),
    ):
        lines.append(f"| {name} | {claim} | — | — | **not testable**: no UELLM stand-in (static is HF-like batching, not UELLM's predictor + SLO-ODBS); ratios dropped |")  # fmt: skip
    return lines


def _overhead(rows: list[dict]) -> str:
    """Decision time over simulated GPU time, faithful bucketserve runs (wall-clock timing)."""
    share = sorted(r["decision_share"] for r in rows if r["policy"] == "bucketserve 2P2D")
    if not share:
        return "| bucketing overhead | < 1 % | not measured | — | — |"
    med, p95 = share[len(share) // 2], share[int(0.95 * (len(share) - 1))]
    verdict = "**reproduced**" if med < 0.01 else "**not reproduced**"
    return (
        f"| bucketing overhead | < 1 % | median {100 * med:.3f} %, p95 {100 * p95:.2f} %, max "
        f"{100 * share[-1]:.2f} % of GPU time over {len(share)} runs | — | {verdict} (median; the "
        "decision time is wall-clock, so the tail includes the machine's scheduling noise) |"
    )


def offline_table(offline: list[dict]) -> list[str]:
    by: dict[str, list[float]] = {}
    for r in offline:
        by.setdefault(r["system"], []).append(float(r["throughput_tok_s"]))
    lines = ["| system | output tokens/s (1,000 Mixed requests queued at t=0) |", "|---|---|"]
    return lines + [f"| {s} | {fmt_ci(v, 0)} |" for s, v in by.items()]


def contributions(g: dict) -> list[str]:
    refs = {
        "bucketserve": "bucketserve 2P2D",
        "bucketserve+": "bucketserve+ 2P2D",
        "edf": "edf 2P2D",
    }
    lines = [
        "| variant | goodput@80 | @90 | @99 | @90 p90-TBT | ratio @90 vs its reference |",
        "|---|---|---|---|---|---|",
    ]
    for s in ["distserve 2P2D", "sjf 2P2D", "edf 2P2D", "bucketserve 2P2D", "bucketserve+ 2P2D",
              *_labels("ablation"), "bucketserve+ chunked", "sarathi (fcfs, chunked 512)"]:  # fmt: skip
        if (s, "mixed") not in g:
            continue
        ref = next(
            (v for k, v in refs.items() if s.startswith(k + ",") or s == f"{k} chunked"), None
        )
        ref = ref or (
            "distserve 2P2D"
            if s in ("sjf 2P2D", "edf 2P2D", "bucketserve 2P2D", "bucketserve+ 2P2D")
            else None
        )
        ratio = f"{fmt_ci(ratios(g, s, ref, 'mixed', 0.9))}× vs {ref}" if ref else "—"
        cells = [fmt_ci(values(g, s, "mixed", k)) for k in (0.8, 0.9, 0.99, "tail90")]
        lines.append(f"| {s} | " + " | ".join(cells) + f" | {ratio} |")
    return lines


def padded_tables(g) -> list[str]:
    """Mixed and Alpaca with prefill padded to the batch's longest prompt, and the padding ratio."""
    ratio = [("padding ratio", lambda g, s, w: fmt_ci(values(g, s, w, "padding")))]
    out = []
    for workload in ("mixed", "alpaca"):
        out += [
            f"#### {workload.capitalize()}",
            "",
            *table(g, _labels("padded"), workload, ratio),
            "",
        ]
    return out


def document(g, rows, offline, wall_s, validation) -> str:
    from bucketserve.sim.evidence_validation import validation_table

    parts = ["### Method", "", *method(g, rows, wall_s), "", "### Baselines and topologies", "",
             *main_tables(g), "### The paper's claims", "", *claims(g, offline, rows), "",
             "Offline throughput:", "", *offline_table(offline), "",
             "### Padded prefill (the paper's premise)", "", *padded_tables(g),
             "### What each mechanism contributes (Mixed)", "", *contributions(g), "",
             "### Horizon check (Mixed): the same systems with longer runs", "",
             *table(g, [x for s in _labels("horizon") for x in (s.split(",")[0], s)], "mixed"), "",
             "### Simulator vs the real CPU server", "", *validation_table(validation)]  # fmt: skip
    return "\n".join(parts) + "\n"
