"""Summarise a perf/device/device_check.sh run: $OUT/summary.json and summary.txt; exit status 1 when
a step failed, timed out or reported ok=false."""

from __future__ import annotations

import json
import sys
from pathlib import Path

STEPS = ("env", "correctness", "ipc", "decode", "attention", "sizing", "server")


def load(out: Path, name: str) -> list[dict]:
    """A step's JSON objects (the attention check prints one per line)."""
    path = out / f"{name}.json"
    if not path.exists():
        return [{"status": "missing"}]
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows or [{"status": "failed", "reason": "no output"}]


def verdict(rows: list[dict]) -> str:
    for status in ("missing", "failed", "timeout"):  # a timeout keeps the rows before it
        if any(r.get("status") == status for r in rows):
            return status if len(rows) == 1 else f"{status} after {len(rows) - 1} rows"
    if rows[0].get("status") == "skipped":
        return "skipped"
    return "ok" if all(r.get("ok", True) for r in rows) else "NOT OK"


def main() -> int:
    out, elapsed = Path(sys.argv[1]), int(sys.argv[2])
    steps = {name: load(out, name) for name in STEPS}
    verdicts = {name: verdict(rows) for name, rows in steps.items()}
    (out / "summary.json").write_text(json.dumps(
        {"elapsed_s": elapsed, "verdicts": verdicts, "steps": steps}, indent=1, default=str))  # fmt: skip
    lines = [f"device check: {elapsed} s"]
    for name, v in verdicts.items():
        reason = steps[name][0].get("reason", "")
        lines.append(f"  {name:12s} {v}{'  (' + reason + ')' if reason else ''}")
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return (
        1 if any(v in ("failed", "timeout", "NOT OK", "missing") for v in verdicts.values()) else 0
    )


if __name__ == "__main__":
    sys.exit(main())
