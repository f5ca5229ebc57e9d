"""CSV files and the Markdown report of a policy comparison."""

from __future__ import annotations

import csv
from dataclasses import asdict, fields
from pathlib import Path

from bucketserve.bench.fixed_load import TOLERANCE, FixedLoadResult
from bucketserve.bench.metrics import GOODPUT_TARGETS, RunSummary, attainment, goodput
from bucketserve.bench.report_fixed import fixed_load_section
from bucketserve.bench.report_text import header_section
from bucketserve.bench.sweep import SweepResult

SLO_SCALES = (0.5, 1.0, 2.0, 4.0)


def _f(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def write_summary_csv(results: list[SweepResult], path: Path) -> None:
    names = [f.name for f in fields(RunSummary)]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=names)
        w.writeheader()
        for res in results:
            for s in res.summaries:
                w.writerow(asdict(s))


def goodput_rows(results: list[SweepResult]) -> list[dict]:
    rows = []
    for res in results:
        pts = [(s.offered_rate, s.attainment) for s in res.summaries if s.attainment is not None]
        rates, att = [p[0] for p in pts], [p[1] for p in pts]
        row = {"target": res.target.label}
        for t in GOODPUT_TARGETS:
            g = goodput(rates, att, t) if rates else None
            row[f"goodput_{int(t * 100)}"] = g.rate if g else None
            row[f"kind_{int(t * 100)}"] = g.kind if g else "not measured"
            row[f"label_{int(t * 100)}"] = g.label() if g else "not measured"
        rows.append(row)
    return rows


def write_goodput_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def results_table(results: list[SweepResult]) -> list[str]:
    lines = [
        "| target | rate | sent (req/s) | ok | attain | TTFT p50 / p90 (s) | TPOT p50 / p90 (s) "
        "| ITL p99 (s) | served req/s | out tok/s | sched ms/req | sched share "
        "| mean prefill batch | load avg | idle after (s) |",
        "|---" * 15 + "|",
    ]
    for res in results:
        for s in res.summaries:
            share = "-" if s.sched_share is None else f"{s.sched_share:.3%}"
            lines.append(
                f"| {s.label} | {s.offered_rate:g} | {s.sent} ({_f(s.sent_rate)}) | {s.ok} | "
                f"{_pct(s.attainment)} | "
                f"{_f(s.ttft_p50)} / {_f(s.ttft_p90)} | {_f(s.tpot_p50)} / {_f(s.tpot_p90)} | "
                f"{_f(s.itl_p99)} | {s.served_rate:.3f} | {s.output_tok_s:.2f} | "
                f"{_f(s.sched_ms_per_request)} | {share} | {_f(s.mean_prefill_batch)} | "
                f"{_f(s.load_avg, 2)} | {_f(s.idle_wait_s, 2)} |"
            )
    return lines


def goodput_table(rows: list[dict]) -> list[str]:
    head = " | ".join(f"goodput @ {int(t * 100)} % (req/s)" for t in GOODPUT_TARGETS)
    lines = [f"| target | {head} |", "|---" * (1 + len(GOODPUT_TARGETS)) + "|"]
    for r in rows:
        cells = " | ".join(r[f"label_{int(t * 100)}"] for t in GOODPUT_TARGETS)
        lines.append(f"| {r['target']} | {cells} |")
    return lines


def slo_scale_table(results: list[SweepResult]) -> list[str]:
    """Attainment when both SLOs are multiplied by a scale, at each target's highest rate."""
    cols = " | ".join(f"x{s:g}" for s in SLO_SCALES)
    lines = [f"| target | rate | {cols} |", "|---|---" + "|---" * len(SLO_SCALES) + "|"]
    for res in results:
        if not res.records:
            continue
        rate = max(res.records)
        cells = " | ".join(_pct(attainment(res.records[rate], k)) for k in SLO_SCALES)
        lines.append(f"| {res.target.label} | {rate:g} | {cells} |")
    return lines


def write_report(
    path: Path,
    ctx: dict,
    results: list[SweepResult],
    fixed: FixedLoadResult | None,
    plots: list[str],
    ablation_notes: list[str],
) -> None:
    rows = goodput_rows(results)
    write_goodput_csv(rows, path.parent / "goodput.csv")
    lines = header_section(ctx, results)
    failed = [r for r in results if r.error]
    if failed:
        lines += ["## Failures", ""]
        lines += [f"* `{r.target.label}` stopped early: `{r.error}`" for r in failed] + [""]
    lines += ["## Results per rate", "", *results_table(results), ""]
    lines += [
        "## Goodput",
        "",
        "Highest offered rate whose SLO attainment is at least the target, "
        "linearly interpolated towards the next (failing) rate; `>=` means every measured "
        "rate attained it, `< lowest rate` means none did.",
        "",
        *goodput_table(rows),
        "",
    ]
    lines += [
        "## SLO scale",
        "",
        "Attainment with both SLOs multiplied by the scale "
        "(DistServe's SLO-scale view), at the highest rate of the sweep.",
        "",
        *slo_scale_table(results),
        "",
    ]
    lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    lines += ["## Ablations", "", *ablation_notes, ""]
    lines += fixed_load_section(fixed, TOLERANCE)
    path.write_text("\n".join(lines) + "\n")
