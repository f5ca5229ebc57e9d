"""ServeConfig validation and the scheduler overrides it carries (ablations)."""

from __future__ import annotations

import pytest
from bucketserve.bench.ablations import ablation_targets
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.launch.cli import main as cli_main
from bucketserve.serving.launch.cli import serve_config


def test_scheduler_overrides_reach_the_scheduler_config(tmp_path):
    cfg = ServeConfig(scheduler={"enable_bucketing": False, "max_wait_s": 5.0}, block_size=32)
    cfg.write(tmp_path / "run.json")
    sched = ServeConfig.read(tmp_path / "run.json").scheduler_config(max_model_len=4096)
    assert (sched.enable_bucketing, sched.max_wait_s, sched.block_size) == (False, 5.0, 32)
    assert sched.enable_batch_controller and sched.enable_priority and sched.max_model_len == 4096


@pytest.mark.parametrize(
    ("scheduler", "message"),
    [
        ({"enable_buckets": False}, r"scheduler: unknown option\(s\) \['enable_buckets'\]"),
        ({"max_model_len": 10}, r"unknown option\(s\) \['max_model_len'\]"),  # derived
        ({"enable_priority": "no"}, "scheduler.enable_priority must be true or false"),
        ({"watermark": 0.9}, r"watermark must be in \[0.0, 0.5\]"),
    ],
)
def test_bad_scheduler_overrides_name_the_option(scheduler, message):
    with pytest.raises(ValueError, match=message):
        ServeConfig(scheduler=scheduler)


def test_context_dependent_limits_wait_for_the_model():
    ServeConfig(scheduler={"max_batched_tokens": 1024})  # fine for a 1,024-token model
    with pytest.raises(ValueError, match="max_batched_tokens must be >= max_model_len=4096"):
        ServeConfig(scheduler={"max_batched_tokens": 1024}, max_model_len=4096)


def test_cli_scheduler_json_reaches_serve_config(monkeypatch):
    seen = {}
    monkeypatch.setattr(
        "bucketserve.serving.launch.cli.cmd_serve", lambda a: seen.setdefault("a", a)
    )
    cli_main(["serve", "--scheduler", '{"enable_priority": false}'])
    assert serve_config(seen["a"]).scheduler == {"enable_priority": False}


def test_every_ablation_has_a_switch():
    targets, notes = ablation_targets()
    assert {t.label: t.overrides for t in targets} == {
        "bucketserve-no-bucketing": {"scheduler": {"enable_bucketing": False}},
        "bucketserve-no-batch-controller": {"scheduler": {"enable_batch_controller": False}},
        "bucketserve-no-priority": {"scheduler": {"enable_priority": False}},
    }
    assert not any("not run" in n for n in notes)
    for target in targets:  # each one is a valid server configuration
        ServeConfig(policy=target.policy, **target.overrides)


def test_concurrency_cap_comes_from_the_command_line_and_is_checked():
    import argparse

    from bucketserve.serving.launch.cli import add_serve_args

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    a = parser.parse_args(["--max-concurrent-requests", "64"])
    assert serve_config(a).max_concurrent_requests == 64
    assert ServeConfig().max_concurrent_requests == 0  # no cap unless asked
    with pytest.raises(ValueError, match="max_concurrent_requests must be >= 0, got -1"):
        ServeConfig(max_concurrent_requests=-1)


def test_auto_topology_runs_colocated_on_the_devices_of_both_roles():
    cfg = ServeConfig()  # auto: the default
    assert cfg.topology == "colocated" and cfg.decode_devices == ["cpu", "cpu"]
    assert cfg.engine_prefill_devices == [] and cfg.iteration_tokens >= 32
    gpu = ServeConfig(prefill_devices=["cuda:0"], decode_devices=["cuda:0", "cuda:1"])
    assert gpu.decode_devices == ["cuda:0", "cuda:1"]  # one instance per GPU
    split = ServeConfig(topology="disaggregated")
    assert split.prefill_devices == ["cpu"] and split.decode_devices == ["cpu"]


def test_a_resolved_config_reads_back_unchanged(tmp_path):
    cfg = ServeConfig()
    cfg.write(tmp_path / "run_config.json")
    again = ServeConfig.read(tmp_path / "run_config.json")
    assert (again.topology, again.decode_devices) == ("colocated", ["cpu", "cpu"])


def test_bucketserve_serve_without_flags_runs_the_auto_topology():
    """The command line's defaults are the declared ones: `bucketserve serve` resolves auto
    itself (defaults read from a resolved ServeConfig passed "colocated" back with one device)."""
    import argparse

    from bucketserve.serving.launch.cli import add_serve_args

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    cfg = serve_config(parser.parse_args([]))
    assert (cfg.topology, cfg.decode_devices) == ("colocated", ["cpu", "cpu"])
    assert cfg == ServeConfig()  # every other field as the dataclass declares it
    split = serve_config(parser.parse_args(["--topology", "disaggregated"]))
    assert (split.prefill_devices, split.decode_devices) == (["cpu"], ["cpu"])
