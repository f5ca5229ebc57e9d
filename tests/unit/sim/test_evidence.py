"""The evidence pipeline: adaptive sweep, steady-state goodput, capacity clamp, doc splice."""

from __future__ import annotations

import pytest
from bucketserve.sim import evidence
from bucketserve.sim.evidence import System, sweep
from bucketserve.sim.evidence_report import BEGIN, END, per_seed, splice


def row(rate, att, served, growing=False, late=None, system="x", seed=0):
    return {"policy": system, "workload": "mixed", "seed": seed, "rate": rate,
            "attainment": att, "attainment_tail": att, "late_attainment": att if late is None else late,
            "late_attainment_tail": att if late is None else late, "growing": growing,
            "served_rate": served, "num_gpus": 4, "padding_ratio": 0.0, "decision_share": 0.0}  # fmt: skip


def test_growing_runs_count_as_zero_and_late_thirds_count():
    rows = [row(1, 1.0, 1.0), row(2, 0.95, 2.0, late=0.85), row(3, 0.97, 2.5, growing=True)]
    g = per_seed(rows)[("x", "mixed")][0]
    assert g[0.8] == pytest.approx(2.0 + 0.85 / 0.85 * 0.0 + (0.85 - 0.8) / 0.85)
    assert g[0.9] == pytest.approx(1.0 + (1.0 - 0.9) / (1.0 - 0.85))
    assert g["capacity"] == 2.5 and not g["clamped"]


def test_goodput_never_exceeds_the_sustained_capacity():
    rows = [row(1, 1.0, 0.9), row(2, 1.0, 1.2), row(3, 0.5, 1.3)]  # served lags the offer
    g = per_seed(rows)[("x", "mixed")][0]
    assert g[0.8] == g["capacity"] == 1.3 and g["clamped"]


def test_sweep_stops_past_the_80_percent_crossing_and_fills_the_bracket(monkeypatch):
    monkeypatch.setitem(
        evidence.GRID,
        "mixed",
        (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0),
    )
    monkeypatch.setitem(evidence.DURATION, "mixed", 40.0)
    rows = sweep(System("d", "distserve", {"topology": "pd"}, workloads=("mixed",)), "mixed", 0)

    def ok(r):
        return max(evidence.effective_attainment(r), evidence.effective_attainment(r, True))

    rates = [r["rate"] for r in rows]
    assert rates == sorted(rates) and rates[-1] < 13.0  # stopped before the end of the grid
    coarse = [r for r in rows if r["rate"] % 4 == 1]  # every 4th grid point: 1, 5, 9, ...
    assert ok(coarse[-1]) < 0.8 and all(ok(r) >= 0.8 for r in coarse[:-1])
    # bisection closed the bracket around the 80 % crossing down to adjacent grid points
    passing = max(r["rate"] for r in rows if ok(r) >= 0.8)
    assert min(r["rate"] for r in rows if r["rate"] > passing) == passing + 1.0


def test_splice_replaces_only_the_generated_block(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text(f"intro\n{BEGIN}\nold\n{END}\noutro\n")
    splice(doc, "new table")
    assert doc.read_text() == f"intro\n{BEGIN}\nnew table\n{END}\noutro\n"
    doc.write_text("no markers")
    with pytest.raises(ValueError, match="no generated block"):
        splice(doc, "x")
