"""`bucketserve simulate` end to end on a tiny grid."""

from __future__ import annotations

import csv

from bucketserve.sim.cli import main


def test_cli_writes_table_csv_and_plots(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--workload", "mixed", "--workload", "alpaca", "--policy", "all", "--rates", "2,8",
            "--num-requests", "40", "--duration", "0", "--seed", "3", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "bucketserve+" in text and "goodput@90" in text
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 2 * 5 * 2
    for name in ("attainment_vs_rate_mixed.png", "throughput_vs_rate_alpaca.png", "goodput.csv"):
        assert (out / name).stat().st_size > 0
    assert main(argv) == 0  # deterministic for the seed
    assert (
        list(csv.DictReader((out / "results.csv").open()))[0]["attainment"] == rows[0]["attainment"]
    )


def test_cli_rejects_bad_policy(capsys):
    assert main(["--policy", "lifo"]) == 2
    assert "policy" in capsys.readouterr().err


def test_cli_scheduler_overrides_change_the_run(tmp_path):
    """The bucketing ablation keeps one bucket, so its runs differ from the full scheduler's."""
    argv = ["--workload", "mixed", "--policy", "bucketserve", "--rates", "12",
            "--num-requests", "200", "--duration", "0", "--seed", "1"]  # fmt: skip
    results = {}
    for label, extra in (
        ("full", []),
        ("one bucket", ["--scheduler", '{"enable_bucketing": false}']),
    ):
        assert main([*argv, "--out", str(tmp_path / label), *extra]) == 0
        results[label] = next(csv.DictReader((tmp_path / label / "results.csv").open()))
    assert results["full"] != results["one bucket"]


def test_cli_rejects_bad_scheduler_overrides(capsys):
    assert main(["--policy", "bucketserve", "--scheduler", '{"bogus": 1}']) == 2
    assert "bogus" in capsys.readouterr().err


def test_cli_seeds_give_confidence_intervals(tmp_path):
    out = tmp_path / "out"
    argv = ["--workload", "alpaca", "--policy", "sjf", "--rates", "4,8", "--num-requests", "30",
            "--duration", "0", "--seeds", "3", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    (row,) = list(csv.DictReader((out / "goodput.csv").open()))
    assert row["seeds"] == "3" and "goodput@90_ci" in row
    assert len(list(csv.DictReader((out / "results.csv").open()))) == 3 * 2
