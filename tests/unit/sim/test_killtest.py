"""The kill test: bisection finds each cell's goodput, the hybrid runs per cell, the report."""

from __future__ import annotations

import pytest
from bucketserve.sim import killtest
from bucketserve.sim.grid import goodput
from bucketserve.sim.killtest_report import BEGIN, END, render

RATES = tuple(float(r) for r in range(1, 21))
CELLS = [(0.04, 1.0), (0.1, 1.0)]
KNEE = {(0.04, 1.0): 7.0, (0.1, 1.0): 13.0}  # last rate at 100 %; 0.5 one step later


def fake_probe(calls: list[float]):
    def probe(rate: float) -> list[dict]:
        calls.append(rate)
        return [{"rate": rate, "tpot_s": c[0], "ttft_scale": c[1],
                 "effective": 1.0 if rate <= KNEE[c] else 0.5} for c in CELLS]  # fmt: skip

    return probe


def test_bisection_finds_every_cells_knee_with_few_runs():
    calls: list[float] = []
    rows = killtest.bisect_sweep(fake_probe(calls), RATES, CELLS)
    for cell, knee in KNEE.items():
        sel = [r for r in rows if (r["tpot_s"], r["ttft_scale"]) == cell]
        assert goodput(sel) == pytest.approx(knee + 0.2)  # (1 - 0.9) / (1 - 0.5) of a step
    assert len(calls) == len(set(calls)) <= 14  # memoised; a full sweep would take 20


def test_nothing_passes_gives_zero():
    rows = killtest.bisect_sweep(lambda r: [{"rate": r, "tpot_s": 0.04, "ttft_scale": 1.0,
                                             "effective": 0.1}], RATES, [(0.04, 1.0)])  # fmt: skip
    assert goodput(rows) == 0.0


def test_units_run_the_hybrid_once_per_cell_and_statics_once():
    units = killtest.units(seeds=(0,), workloads=("mixed",))
    hybrid = [u for u in units if u[0] == killtest.HYBRID.label]
    assert len(hybrid) == 9 and all(u[3] is not None for u in hybrid)
    assert sorted(u[0] for u in units if u[3] is None) == sorted(killtest.STATIC)


def test_a_real_unit_and_the_report(tmp_path, monkeypatch):
    monkeypatch.setitem(killtest.DURATION, "alpaca", 4.0)
    monkeypatch.setitem(killtest.RATES, "alpaca", (8.0, 16.0))
    rows = killtest.unit((killtest.HYBRID.label, "alpaca", 0, (0.1, 1.0)))
    rows += killtest.unit(("sarathi TP2 512", "alpaca", 0, None))
    assert {r["system"] for r in rows} == {killtest.HYBRID.label, "sarathi TP2 512"}
    assert all("role_changes" in r for r in rows if r["system"] == killtest.HYBRID.label)
    doc = tmp_path / "doc.md"
    doc.write_text(f"head\n{BEGIN}\nOLD\n{END}\ntail\n")
    render(rows, tmp_path, doc, None)
    text = doc.read_text()
    assert "OLD" not in text and "| 100 ms | 1 | sarathi TP2 512 |" in text
    assert (tmp_path / "report.md").exists()
