"""The summary table perf/engine/engine_bench.py prints to stderr from its JSON lines."""

from __future__ import annotations

import sys

SHORT = {"bucketserve": "ours", "transformers": "hf", "float32": "fp32", "bfloat16": "bf16"}


def label(row: dict) -> str:
    """ "ours-bf16", "hf-fp32", ... for a row's impl and dtype."""
    return f"{SHORT.get(row['impl'], row['impl'])}-{SHORT.get(row['dtype'], row['dtype'])}"


def print_table(rows: list[dict], file=sys.stderr) -> None:
    """Tokens/s per (batch, phase) and impl-dtype; ours bf16/fp32; decode step vs floor."""
    labels = list(dict.fromkeys(label(r) for r in rows))
    ours = [lb for lb in labels if lb.startswith("ours-")]
    by_key = {(r["batch"], r["phase"], label(r)): r for r in rows}
    head = ["batch", "phase", *(f"{lb} tok/s" for lb in labels)]
    if {"ours-bf16", "ours-fp32"} <= set(ours):
        head.append("ours bf16/fp32")
    head += [f"{lb} step ms (floor ms, x)" for lb in ours]
    lines = [head]
    for batch, phase in dict.fromkeys((r["batch"], r["phase"]) for r in rows):
        cells = [by_key.get((batch, phase, lb)) for lb in labels]
        line = [str(batch), phase, *(f"{c['tokens_per_s']:.1f}" if c else "-" for c in cells)]
        if "ours bf16/fp32" in head:
            bf, fp = by_key[batch, phase, "ours-bf16"], by_key[batch, phase, "ours-fp32"]
            line.append(f"{bf['tokens_per_s'] / fp['tokens_per_s']:.2f}x")
        for lb in ours:
            r = by_key[batch, phase, lb]
            line.append(f"{r['step_ms']:.2f} ({r['floor_ms']:.2f}, {r['floor_ratio']:.2f}x)"
                        if phase == "decode" else "")  # fmt: skip
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for line in lines:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)), file=file)
