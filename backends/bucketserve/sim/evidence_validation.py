"""The simulator-vs-server table of docs/scheduling.md (rows from sim.validate.compare_run)."""

from __future__ import annotations

import math

TARGET = 0.20  # the error we aim for on mean TTFT and mean TPOT


def validation_table(validation: tuple[list[dict], str, str] | None) -> list[str]:
    if not validation:
        return ["Not run: pass --server-run and --bench (see sim/validate.py)."]
    rows, model, source = validation
    c = rows[0]["path_overhead_s"]
    lines = [f"Server run: `{source}`. Latency model: {model}. Path constant (median over policies of "
             f"the TTFT gap at each policy's lowest rate, in sample): {1e3 * c:.0f} ms.", "",
             "| policy | rate | requests | TTFT real / sim (s) | error | + path | TPOT real / sim (s) | error | attainment real / sim | prefill busy real / sim (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['rate']:g} | {r['requests']} | {r['real_ttft_s']:.3f} / "
            f"{r['sim_ttft_s']:.3f} | {100 * r['ttft_error']:+.0f} % | "
            f"{100 * r['ttft_cal_error']:+.0f} %{' (in sample)' if r['in_sample'] else ''} | "
            f"{r['real_tpot_s']:.4f} / {r['sim_tpot_s']:.4f} | {100 * r['tpot_error']:+.0f} % | "
            f"{r['real_attainment']:.2f} / {r['sim_attainment']:.2f} | "
            f"{r['real_prefill_busy_s']:.1f} / {r['sim_prefill_busy_s']:.1f} |"
        )
    out_of_sample = [r for r in rows if not r["in_sample"]]
    for k, sel, label in (("ttft", rows, "TTFT, engine only"),
                          ("ttft_cal", out_of_sample, "TTFT + path constant, out of sample"),
                          ("tpot", rows, "TPOT")):  # fmt: skip
        errs = [abs(r[f"{k}_error"]) for r in sel if not math.isnan(r[f"{k}_error"])]
        worst = max(errs, default=math.nan)
        mean = sum(errs) / len(errs) if errs else math.nan
        ok = "every row within" if worst <= TARGET else "not every row within"
        lines.append(f"\nMean {label}: mean |error| {100 * mean:.0f} %, worst {100 * worst:.0f} % "
                     f"({ok} the {100 * TARGET:.0f} % target).")  # fmt: skip
    return lines
