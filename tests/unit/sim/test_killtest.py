"""The kill test: bisection finds each cell's goodput, the hybrid runs per cell, the report."""

from __future__ import annotations

import pytest
from bucketserve.sim import killtest
from bucketserve.sim.grid import goodput, knee_sweep
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
    rows = knee_sweep(fake_probe(calls), RATES, CELLS)
    for cell, knee in KNEE.items():
        sel = [r for r in rows if (r["tpot_s"], r["ttft_scale"]) == cell]
        assert goodput(sel) == pytest.approx(knee + 0.2)  # (1 - 0.9) / (1 - 0.5) of a step
    assert len(calls) == len(set(calls)) <= 14  # memoised; a full sweep would take 20


def test_nothing_passes_gives_zero():
    rows = knee_sweep(lambda r: [{"rate": r, "tpot_s": 0.04, "ttft_scale": 1.0,
                                             "effective": 0.1}], RATES, [(0.04, 1.0)])  # fmt: skip
    assert goodput(rows) == 0.0


@pytest.mark.parametrize("start", [0, 5, 7, 8, 12, 19])
def test_a_hint_walks_to_the_same_knee(start):
    calls: list[float] = []
    cell = (0.04, 1.0)
    rows = knee_sweep(fake_probe(calls), RATES, [cell], hint={cell: start})
    assert goodput(rows) == pytest.approx(KNEE[cell] + 0.2)
    assert len(calls) == len(set(calls)) == abs(start - 6) + 1 + (start <= 6)
    known: dict[float, list[dict]] = {}  # rows already run are not run again
    for r in rows:
        known.setdefault(r["rate"], []).append(r)
    again: list[float] = []
    assert knee_sweep(fake_probe(again), RATES, [cell], hint={cell: start}, known=known) == rows
    assert again == []


def row(system, w, seed, rate, cell, eff):
    return {"system": system, "workload": w, "seed": seed, "rate": rate,
            "tpot_s": cell[0], "ttft_scale": cell[1], "effective": eff}  # fmt: skip


def test_candidates_are_the_seed0_grid_winners_and_sarathi_tp2():
    cells = killtest.CELLS
    grid_rows = [row("distserve 1P3D", w, 0, rate, c, 1.0 if rate <= 4 else 0.0)
                 for w in ("mixed",) for c in cells for rate in (4.0, 5.0)]  # fmt: skip
    grid_rows += [row("bullet", "mixed", 0, rate, cells[0], 1.0) for rate in (4.0, 5.0)]
    grid_rows += [row("bullet", "mixed", 1, rate, c, 1.0) for c in cells for rate in (4.0, 5.0)]
    assert killtest.candidates(grid_rows) == ("sarathi TP2 512", "bullet", "distserve 1P3D")


def test_units_reuse_the_grids_seed0_and_start_the_hybrid_at_the_best_knee():
    grid_rows = [row("sarathi 256", "mixed", 0, r, c, 1.0) for c in killtest.CELLS
                 for r in (1.0, 2.0)]  # fmt: skip
    statics = killtest.static_units(
        ("sarathi 256", "sarathi TP2 512"), (0, 1), ("mixed",), grid_rows
    )
    assert len(statics) == 4 and all(u[3] is None for u in statics)
    reused = [u for u in statics if u[5]]
    assert [(u[0], u[2]) for u in reused] == [("sarathi 256", 0)] and sorted(reused[0][5]) == [
        1.0,
        2.0,
    ]
    done = [row("sarathi 256", "mixed", 0, r, c, 1.0 if r <= 6 else 0.0) for c in killtest.CELLS
            for r in (6.0, 7.0)]  # fmt: skip
    done += [row("sarathi TP2 512", "mixed", 0, r, c, 1.0 if r <= 9 else 0.0)
             for c in killtest.CELLS for r in (9.0, 10.0)]  # fmt: skip
    hybrid = killtest.hybrid_units((0,), ("mixed",), done)
    assert len(hybrid) == 9 and {u[3] for u in hybrid} == set(killtest.CELLS)
    assert {u[4] for u in hybrid} == {killtest.RATES["mixed"].index(9.0)}  # best knee: 9 req/s


def test_a_real_unit_and_the_report(tmp_path, monkeypatch):
    monkeypatch.setitem(killtest.DURATION, "alpaca", 4.0)
    monkeypatch.setitem(killtest.RATES, "alpaca", (8.0, 16.0))
    rows = killtest.unit((killtest.HYBRID.label, "alpaca", 0, (0.1, 1.0), 1, None))
    rows += killtest.unit(("sarathi TP2 512", "alpaca", 0, None, None, None))
    assert {r["system"] for r in rows} == {killtest.HYBRID.label, "sarathi TP2 512"}
    assert all("role_changes" in r for r in rows if r["system"] == killtest.HYBRID.label)
    doc = tmp_path / "doc.md"
    doc.write_text(f"head\n{BEGIN}\nOLD\n{END}\ntail\n")
    render(rows, tmp_path, doc, None)
    text = doc.read_text()
    assert "OLD" not in text and "| 100 ms | 1 | sarathi TP2 512 |" in text
    assert (tmp_path / "report.md").exists()
