"""Tables, CSV files and plots of simulation results."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

from bucketserve.sim.metrics import RunMetrics, effective_attainment, goodput
from bucketserve.sim.stats import mean_ci

GOODPUT_TARGETS = (0.8, 0.9, 0.99)
# (field, header, format); every column right-aligned to max(header, value) width
TABLE_COLUMNS = (
    ("workload", "workload", "{}"), ("policy", "policy", "{}"), ("rate", "rate", "{:.1f}"),
    ("attainment", "attain", "{:.3f}"), ("long_attainment", "long", "{:.2f}"),
    ("online_attainment", "online", "{:.2f}"),
    ("throughput_tok_s", "tok/s", "{:.0f}"),
    ("served_rate", "served", "{:.2f}"), ("mean_ttft_s", "ttft", "{:.3f}"),
    ("p90_ttft_s", "ttft_p90", "{:.3f}"), ("mean_tpot_s", "tpot", "{:.3f}"),
    ("preemptions", "preempt", "{}"), ("mean_batch_size", "batch", "{:.1f}"),
    ("max_buckets", "buckets", "{}"), ("mean_decision_us", "dec_us", "{:.1f}"),
)  # fmt: skip


def format_table(rows: Sequence[RunMetrics]) -> str:
    """A fixed-width text table, one line per run."""
    cells = [[fmt.format(r.as_dict()[name]) for name, _, fmt in TABLE_COLUMNS] for r in rows]
    heads = [head for _, head, _ in TABLE_COLUMNS]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(heads)]
    lines = [" ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines += [" ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _per_seed(sel: Sequence[RunMetrics]) -> dict[str, float]:
    sel = sorted(sel, key=lambda r: r.rate)
    rates = [r.rate for r in sel]
    # capacity: the highest rate the runs actually served; goodput never exceeds it
    cap = max((r.served_rate for r in sel if not math.isnan(r.served_rate)), default=math.inf)
    out = {f"goodput@{int(t * 100)}": min(goodput(rates, [effective_attainment(r) for r in sel], t), cap)
           for t in GOODPUT_TARGETS}  # fmt: skip
    out["capacity_rps"] = max(r.completion_rate for r in sel)
    out["max_throughput_tok_s"] = max(r.throughput_tok_s for r in sel)
    return out


def goodput_rows(rows: Sequence[RunMetrics]) -> list[dict]:
    """Goodput (req/s, total and per GPU) at each attainment target, per workload x policy:
    the mean over seeds, with the 95 % CI half-width when there are several.

    A rate counts only while the run sustained it (metrics.effective_attainment).
    """
    out = []
    for key in dict.fromkeys((r.workload, r.policy) for r in rows):
        sel = [r for r in rows if (r.workload, r.policy) == key]
        seeds = [
            _per_seed([r for r in sel if r.seed == s]) for s in dict.fromkeys(r.seed for r in sel)
        ]
        row = {
            "workload": key[0],
            "policy": key[1],
            "num_gpus": sel[0].num_gpus,
            "seeds": len(seeds),
        }
        for name in seeds[0]:
            mean, half = mean_ci([s[name] for s in seeds])
            row[name] = round(mean, 3)
            if name.startswith("goodput@"):
                row[name.replace("goodput", "per_gpu")] = round(mean / sel[0].num_gpus, 3)
                if len(seeds) > 1:
                    row[name + "_ci"] = round(half, 3)
        out.append(row)
    return out


def format_goodput(rows: list[dict]) -> str:
    keys = list(rows[0]) if rows else []
    lines = ["  ".join(f"{k:>14s}" for k in keys)]
    lines += ["  ".join(f"{str(r[k]):>14s}" for k in keys) for r in rows]
    return "\n".join(lines)


def write_csv(rows: Sequence[dict], path: Path) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: Sequence[RunMetrics], out_dir: Path) -> list[Path]:
    """attainment-vs-rate and throughput-vs-rate PNGs, one pair per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for workload in dict.fromkeys(r.workload for r in rows):
        for metric, label, name in (
            ("attainment", "SLO attainment (TTFT and TPOT)", "attainment"),
            ("throughput_tok_s", "output tokens/s", "throughput"),
        ):
            fig, ax = plt.subplots(figsize=(6, 4))
            for policy in dict.fromkeys(r.policy for r in rows):
                sel = sorted(
                    (r for r in rows if r.workload == workload and r.policy == policy),
                    key=lambda r: r.rate,
                )
                ax.plot(
                    [r.rate for r in sel],
                    [getattr(r, metric) for r in sel],
                    marker="o",
                    label=policy,
                )
            if metric == "attainment":
                for t in (0.8, 0.9):
                    ax.axhline(t, color="grey", lw=0.6, ls="--")
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(label)
            ax.set_title(f"{workload}: {label} vs rate")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
            path = out_dir / f"{name}_vs_rate_{workload}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            plt.close(fig)
            paths.append(path)
    return paths
