"""PNG plots of a comparison: attainment and throughput vs rate, TTFT/TPOT CDFs per rate."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bucketserve.bench.metrics import GOODPUT_TARGETS, cdf  # noqa: E402
from bucketserve.bench.sweep import SweepResult  # noqa: E402

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _style(i: int) -> dict:
    """Distinct marker, size and dash per target, so identical curves stay visible."""
    return {"marker": MARKERS[i % len(MARKERS)], "markersize": 9 - i % 5,
            "ls": ("-", "--", "-.", ":")[i % 4], "alpha": 0.85}  # fmt: skip


def _by_rate(res: SweepResult, field: str) -> tuple[list[float], list[float]]:
    pts = sorted((s.offered_rate, getattr(s, field)) for s in res.summaries)
    pts = [p for p in pts if p[1] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def attainment_plot(results: list[SweepResult], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, res in enumerate(results):
        x, y = _by_rate(res, "attainment")
        ax.plot(x, [v * 100 for v in y], label=res.target.label, **_style(i))
    for t in GOODPUT_TARGETS:
        ax.axhline(t * 100, color="grey", lw=0.6, ls="--")
    ax.set(
        xlabel="offered rate (req/s)",
        ylabel="SLO attainment (%)",
        ylim=(-2, 102),
        title="SLO attainment (TTFT and TPOT met)",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def throughput_plot(results: list[SweepResult], path: Path) -> None:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    top = 0.0
    for i, res in enumerate(results):
        x, y = _by_rate(res, "served_rate")
        a1.plot(x, y, label=res.target.label, **_style(i))
        top = max([top, *x])
        x, y = _by_rate(res, "output_tok_s")
        a2.plot(x, y, label=res.target.label, **_style(i))
    a1.plot([0, top], [0, top], color="grey", lw=0.8, ls="--", label="served = offered")
    a1.set(xlabel="offered rate (req/s)", ylabel="served (req/s)", title="Load capacity")
    a2.set(xlabel="offered rate (req/s)", ylabel="output tokens/s", title="Token throughput")
    a1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cdf_plot(results: list[SweepResult], field: str, path: Path, unit_label: str) -> None:
    rates = sorted({r for res in results for r in res.records})
    fig, axes = plt.subplots(1, len(rates), figsize=(4 * len(rates), 3.6), squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=True):
        for i, res in enumerate(results):
            recs = [r for r in res.records.get(rate, []) if r.ok]
            x, y = cdf([getattr(r, field) for r in recs])
            if len(x):  # start at 0 so a single request still draws a step
                st = _style(i)
                ax.step([x[0], *x], [0.0, *y], where="post", label=res.target.label,
                        ls=st["ls"], alpha=st["alpha"])  # fmt: skip
        ax.set(xlabel=unit_label, ylabel="CDF (finished requests)", title=f"{rate:g} req/s")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_all(results: list[SweepResult], out: Path) -> list[str]:
    """All plots into `out`; returns their file names."""
    names = ["attainment_vs_rate.png", "throughput_vs_rate.png", "ttft_cdf.png", "tpot_cdf.png"]
    attainment_plot(results, out / names[0])
    throughput_plot(results, out / names[1])
    cdf_plot(results, "ttft_s", out / names[2], "TTFT (s)")
    cdf_plot(results, "tpot_s", out / names[3], "TPOT (s)")
    return names
