"""The soak report's RSS arithmetic (growth from warm-up, over the second half) and its files."""

from __future__ import annotations

import json

from bucketserve.bench.soak_report import (
    in_flight_peaks,
    rss_growth,
    second_half_growth,
    write_report,
)


def sample(t: float, rss: int, private: int) -> tuple[float, dict]:
    return t, {"rss": {"decode": rss}, "private": {"decode": private}}


def test_growth_is_percent_from_the_warm_sample_for_processes_in_both():
    assert rss_growth({"warm": {"a": 100, "b": 50}, "end": {"a": 110}}) == {"a": 10.0}
    assert rss_growth({"warm": {"a": 100, "dying": 0}, "end": {"a": 90, "dying": 80}}) == {
        "a": -10.0
    }


def test_second_half_growth_reads_the_middle_and_the_last_sample():
    timeline = [sample(0, 100, 80), sample(30, 150, 90), sample(60, 200, 100), sample(90, 210, 100)]
    assert second_half_growth(timeline) == {"decode": 5.0}  # sample 2 of 0..3 (200) -> 210
    assert second_half_growth(timeline, "private") == {"decode": 0.0}


def test_too_few_samples_give_no_second_half():
    assert second_half_growth([sample(0, 1, 1), sample(30, 2, 2)]) == {}


def test_in_flight_peaks_split_at_the_end_of_warm_up():
    # three overlap at t=2..3 (warm-up), two at t=11..12 (after); one that ends as another
    # starts does not overlap it
    spans = [(0.0, 3.0), (1.0, 4.0), (2.0, 5.0), (10.0, 12.0), (11.0, 13.0), (13.0, 14.0)]
    assert in_flight_peaks(spans, t_warm=6.0) == {"warm_up": 3, "after": 2}
    assert in_flight_peaks(spans, t_warm=2.5) == {"warm_up": 3, "after": 3}  # still 3 at 2.5
    assert in_flight_peaks([], t_warm=1.0) == {"warm_up": 0, "after": 0}


def test_per_request_rows_go_to_requests_jsonl_and_the_summaries_keep_the_rest(tmp_path):
    rows = [{"idx": 0, "outcome": "finished"}, {"idx": 1, "outcome": "cancelled"}]
    write_report({"sent": 2, "requests": rows, "args": {"seed": 0}}, tmp_path)
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == rows
    assert json.loads((tmp_path / "report.json").read_text()) == {"sent": 2, "args": {"seed": 0}}
    assert '"sent": 2' in (tmp_path / "report.md").read_text()


def test_soak_runs_disaggregated_and_faults_refuse_a_topology_without_prefill():
    import pytest
    from bucketserve.bench.soak import parse

    assert parse([]).topology == "disaggregated"  # as the stored reports ran
    assert parse(["--topology", "auto"]).topology == "auto"
    with pytest.raises(SystemExit):
        parse(["--faults", "--topology", "auto"])  # no prefill stub to kill
