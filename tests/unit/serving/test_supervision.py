"""Process bookkeeping of the supervisor, with real processes (no tritonserver needed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from bucketserve.serving.launch import leftovers, procs
from bucketserve.serving.launch.supervisor import exit_cause, model_of


def wait_gone(pid: int, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if not procs.is_alive(pid):
            return True
        time.sleep(0.05)
    return False


def parent_and_child(setup: str, start_child: str) -> tuple[subprocess.Popen, int]:
    """A Python parent that runs `setup`, starts `start_child` (a Popen expression), prints the
    child's pid and sleeps; returns (the parent, the child's pid)."""
    code = f"{setup}child = {start_child}\nprint(child.pid, flush=True)\ntime.sleep(60)\n"
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    return parent, int(parent.stdout.readline())


def test_stub_watchdog_kills_a_process_whose_parent_died():
    """Parent P starts child C; C calls exit_when_orphaned(); P dies -> C dies within ~1 s."""
    parent, child = parent_and_child(
        "import os, subprocess, sys, time\n",
        "subprocess.Popen([sys.executable, '-c', "
        "'from bucketserve.serving.launch.procs import exit_when_orphaned as w; "
        "import time; w(0.1); time.sleep(60)'])",
    )
    time.sleep(1.0)  # the watchdog has started
    assert procs.is_alive(child)
    parent.kill()
    parent.wait()
    assert wait_gone(child, 5.0)


def test_every_model_shim_starts_the_stub_watchdog():
    """docs/platform-notes.md#p18-orphaned-stubs: each Python model's stub watches its parent."""
    repo = Path(__file__).resolve().parents[3] / "model_repository"
    shims = sorted(repo.glob("*/1/model.py"))
    assert len(shims) >= 8
    assert [str(p) for p in shims if "\nexit_when_orphaned()" not in p.read_text()] == []


def test_stub_watchdog_holds_while_the_parent_lives():
    code = (
        "from bucketserve.serving.launch.procs import exit_when_orphaned as w\n"
        "import time; w(0.05); time.sleep(1.0); print('alive', flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "alive"


def test_a_stub_whose_tritonserver_is_already_gone_dies_at_once():
    """A stub of a run (BUCKETSERVE_RUN_CONFIG set) whose parent is not tritonserver (it died
    while the stub was still loading) must not live on watching its new parent."""
    code = "from bucketserve.serving.launch.procs import exit_when_orphaned as w; w(0.05); print('alive')"
    env = {**os.environ, procs.RUN_CONFIG_ENV: "/nonexistent/run_config.json"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, env=env)  # fmt: skip
    assert out.returncode == -signal.SIGKILL and "alive" not in out.stdout


def test_kill_tree_kills_the_group_and_reaps():
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    procs.kill_tree(proc.pid, [])
    assert proc.wait(timeout=5) == -signal.SIGKILL


def test_exit_cause_and_model_names():
    assert exit_cause(-11) == "tritonserver died (SIGSEGV)"
    assert exit_cause(1) == "tritonserver exited with status 1"
    assert (
        model_of("decode_0_0") == "decode" and model_of("bucketserve_bls_0_0") == "bucketserve_bls"
    )
    assert procs.stub_instance(["stub", "/r/decode/1/model.py", *["x"] * 6, "decode_0_0"]) == (
        "decode_0_0"
    )


def test_claim_run_dir_refuses_a_live_owner_and_cleans_a_dead_one(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    state = run_dir / leftovers.STATE_FILE
    state.write_text(
        json.dumps({"pid": os.getppid(), "run_id": "abc123"})
    )  # alive: pytest's parent
    with pytest.raises(RuntimeError, match="in use"):
        leftovers.claim_run_dir(run_dir, "new1")
    dead = subprocess.Popen(["true"])
    dead.wait()
    seg = f"/dev/shm/bs_dead{os.getpid() % 10000}_p0_kv"
    open(seg, "wb").close()
    leftover = subprocess.Popen(
        ["sh", "-c", "sleep 60", str(run_dir)]
    )  # "a process of the dead run"
    state.write_text(json.dumps({"pid": dead.pid, "run_id": f"dead{os.getpid() % 10000}"}))
    notes = leftovers.claim_run_dir(run_dir, "new1")
    assert "1 process(es) killed" in notes[0]
    assert leftover.wait(timeout=5) == -signal.SIGKILL
    assert not os.path.exists(seg)
    assert json.loads(state.read_text()) == {"pid": os.getpid(), "run_id": "new1"}


def test_sweep_removes_only_old_unmapped_segments_of_our_kind(tmp_path):
    old, new, other = tmp_path / "bs_zz1_p0_kv", tmp_path / "bs_zz2_p0_kv", tmp_path / "foo"
    for p in (old, new, other):
        p.write_bytes(b"x")
    past = time.time() - 3600
    os.utime(old, (past, past))
    os.utime(other, (past, past))
    assert leftovers.sweep_unmapped_shm(tmp_path) == ["bs_zz1_p0_kv"]
    assert new.exists() and other.exists()


def test_mapped_names_include_a_segment_this_process_maps():
    import mmap

    path = f"/dev/shm/bs_map{os.getpid() % 10000}_x"
    with open(path, "wb+") as f:
        f.truncate(4096)
        m = mmap.mmap(f.fileno(), 4096)
    try:
        assert os.path.basename(path) in procs.mapped_shm_names()
        assert psutil.pid_exists(os.getpid())
    finally:
        m.close()
        os.unlink(path)


def test_die_with_parent_execs_in_place_and_dies_with_the_starting_process():
    """The launcher's way of starting tritonserver, from a parent whose other threads are busy
    (a Popen preexec_fn there crashed the child): same pid, the real program, gone with P."""
    parent, child = parent_and_child(
        "import subprocess, threading, time\n"
        "from bucketserve.serving.launch.procs import die_with_parent\n"
        "def spin():\n"
        "    while True: [bytearray(4096) for _ in range(100)]\n"
        "for _ in range(4): threading.Thread(target=spin, daemon=True).start()\n",
        "subprocess.Popen(die_with_parent(['/bin/sleep', '60']))",
    )
    deadline = time.monotonic() + 10
    while psutil.Process(child).name() != "sleep" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert psutil.Process(child).name() == "sleep"
    assert psutil.Process(child).ppid() == parent.pid
    parent.kill()
    parent.wait()
    assert wait_gone(child, 5.0)
