"""The SLO grid: cells judged from one run, goodput interpolation, the doc splice."""

from __future__ import annotations

import pytest
from bucketserve.scheduling import RequestMeta
from bucketserve.sim import grid
from bucketserve.sim.grid_report import BEGIN, END, render
from bucketserve.sim.workload import SimRequest


def done(prompt_len: int, ttft: float, tpot: float, out: int = 11) -> SimRequest:
    r = SimRequest(RequestMeta("r", prompt_len, out, 0.0), out)
    r.first_token_s, r.finish_s = ttft, ttft + tpot * (out - 1)
    return r


def test_a_cell_scales_the_default_ttft_and_sets_the_tpot():
    r = done(100, ttft=0.3, tpot=0.05)  # default TTFT for 100 tokens: 0.25 s
    assert not grid.cell_ok(r, 0.1, 1.0) and grid.cell_ok(r, 0.1, 2.0)
    assert not grid.cell_ok(r, 0.04, 2.0)


def test_goodput_interpolates_to_the_first_miss():
    rows = [{"rate": r, "effective": e} for r, e in ((1, 1.0), (2, 0.95), (3, 0.85), (4, 0.2))]
    assert grid.goodput(rows) == pytest.approx(2.5)
    assert grid.goodput([{"rate": 1, "effective": 0.5}]) == 0.0


def test_slo_aware_systems_run_once_per_tpot():
    units = grid.units(workloads=("mixed",))
    per = {}
    for system, _, _, tpots in units:
        per.setdefault(system.label, []).append(tpots)
    assert per["edf chunked 512"] == [(t,) for t in grid.TPOTS]
    assert per["distserve 2P2D"] == [grid.TPOTS]


def test_one_run_is_judged_in_every_cell_and_rendered(tmp_path, monkeypatch):
    monkeypatch.setitem(grid.DURATION, "alpaca", 5.0)
    system = next(s for s in grid.SYSTEMS if s.label == "distserve TP2 1P1D")
    rows = grid.run_cells(system, "alpaca", 0, 8.0, grid.TPOTS)
    assert len(rows) == len(grid.TPOTS) * len(grid.TTFT_SCALES)
    assert {(r["tpot_s"], r["ttft_scale"]) for r in rows} == {
        (t, s) for t in grid.TPOTS for s in grid.TTFT_SCALES
    }
    doc = tmp_path / "doc.md"
    doc.write_text(f"head\n{BEGIN}\nSTALE BLOCK\n{END}\ntail\n")
    render(rows, tmp_path, doc, None)
    text = doc.read_text()
    assert "STALE BLOCK" not in text and "#### Alpaca" in text and text.endswith("tail\n")
