"""Faults and restarts for perf/reliability/soak.py: kill one part under load; start/SIGTERM cycles."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import httpx

from bucketserve.serving.launch.serve_process import ServeProcess

SERVER_ARGS = ("--kv-cache-gb", "0.5", "--max-model-len", "2048", "--drain-timeout-s", "5")


def kill_part(sp: ServeProcess, part: str) -> dict:
    """SIGKILL one part ("tritonserver" or a stub instance); time not-ready and ready-again."""
    pid = sp.server_pid() if part == "tritonserver" else sp.stub_pid(part)
    old = [p.pid for p in sp.processes()]  # the server and stubs that must all go away
    os.kill(pid, signal.SIGKILL)
    t_kill = time.monotonic()
    not_ready = None
    while time.monotonic() - t_kill < 10 and not_ready is None:
        if not sp.ready():
            not_ready = time.monotonic() - t_kill
        time.sleep(0.05)
    sp.wait_ready(timeout_s=900)
    back = time.monotonic() - t_kill
    survivors = [q for q in old if q in {p.pid for p in sp.processes()}]
    return {"part": part, "pid": pid, "t_kill": t_kill, "not_ready_after_s": not_ready,
            "serving_again_after_s": back, "old_processes_left": len(survivors)}  # fmt: skip


def one_request(sp: ServeProcess) -> bool:
    r = httpx.post(f"http://{sp.http_url}/v2/models/bucketserve/generate",
                   json={"text_input": "Hi", "max_tokens": 4}, timeout=120)  # fmt: skip
    return r.status_code == 200


def cycle(run_dir: Path) -> dict:
    """Start, serve one request, SIGTERM; what is left of this run afterwards."""
    sp = ServeProcess(run_dir, *SERVER_ARGS)
    sp.start()
    startup = sp.wait_ready()
    segments = len(sp.shm_segments())
    served = one_request(sp)
    took = sp.stop(signal.SIGTERM)
    time.sleep(1.5)  # stub watchdogs poll once a second
    return {"startup_s": startup, "served": served, "segments_while_up": segments,
            "sigterm_exit_s": took, "exit_code": sp.proc.returncode,
            "left_processes": len(sp.processes()), "left_shm": sorted(sp.shm_segments())}  # fmt: skip


def kill_everything(run_dir: Path) -> dict:
    """kill -9 the launcher and every process of its run; then a new start in the same run dir."""
    sp = ServeProcess(run_dir, *SERVER_ARGS)
    sp.start()
    sp.wait_ready()
    old_segments = sp.shm_segments()
    victims = [sp.proc.pid, *(p.pid for p in sp.processes())]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    sp.proc.wait()
    time.sleep(1.5)
    left_after_kill = len(sp.processes())
    shm_after_kill = len(old_segments & set(os.listdir("/dev/shm")))
    nxt = ServeProcess(run_dir, *SERVER_ARGS)
    nxt.start()
    nxt.wait_ready()
    cleaned = not (old_segments & set(os.listdir("/dev/shm")))
    nxt.stop(signal.SIGTERM)
    return {"predecessor_segments": len(old_segments), "left_after_kill9": left_after_kill,
            "shm_after_kill9": shm_after_kill, "cleaned_on_next_start": cleaned}  # fmt: skip


def kill_launcher_only(run_dir: Path) -> dict:
    """kill -9 of the launcher alone: its server and stubs must not outlive it."""
    sp = ServeProcess(run_dir, *SERVER_ARGS)
    sp.start()
    sp.wait_ready()
    sp.proc.kill()
    sp.proc.wait()
    t0, left = time.monotonic(), len(sp.processes())
    while left and time.monotonic() - t0 < 10:
        time.sleep(0.2)
        left = len(sp.processes())
    return {"left_after_5s_or_10s": left, "gone_after_s": time.monotonic() - t0,
            "shm_left": len(sp.shm_segments())}  # fmt: skip


def run_cycles(n: int) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="soak-cycles-")) / "run"
    cycles = [cycle(run_dir) for _ in range(n)]
    launcher = kill_launcher_only(run_dir)
    everything = kill_everything(run_dir)
    return {"cycles": cycles, "kill9_launcher_only": launcher, "kill9_everything": everything}
