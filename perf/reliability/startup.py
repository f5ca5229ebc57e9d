"""Start-up of `bucketserve serve`: seconds until the front says ready, and the CPU seconds each
process spent getting there (the launcher, tritonserver, every stub instance). The same cost
comes back in every recovery after a dead process (the supervisor restarts the server).

  .venv/bin/python perf/reliability/startup.py --rounds 3 --topologies disaggregated,auto

Topologies alternate within each round. One JSON line per start (--out appends), then a median
per topology. To compare two checkouts in one run, alternate this script between them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import psutil
from bucketserve.bench.runinfo import cpu_model, git_commit, machine_name
from bucketserve.bench.soak_report import by_process
from bucketserve.serving.launch.procs import stub_instance
from bucketserve.serving.launch.serve_process import ServeProcess


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def cpu_by_process(sp: ServeProcess) -> dict[str, float]:
    """CPU seconds so far: the launcher, tritonserver, each stub (by model, instances summed)."""
    return by_process(sp, cpu_s, lambda cmd: stub_instance(cmd).rsplit("_", 2)[0])


def one_start(topology: str, args: argparse.Namespace) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="startup-")) / "run"
    extra = ("--model", args.model, "--dtype", args.dtype, "--kv-cache-gb", str(args.kv_cache_gb))
    sp = ServeProcess(run_dir, "--topology", topology, *extra)
    sp.start()
    try:
        ready_s = sp.wait_ready()
        cpu = cpu_by_process(sp)
    finally:
        stop_s = sp.stop()
    return {"topology": topology, "ready_s": round(ready_s, 2), "stop_s": round(stop_s, 2),
            "cpu_s": round(sum(cpu.values()), 1),
            "cpu_by_process_s": {k: round(v, 2) for k, v in sorted(cpu.items())}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--topologies", default="disaggregated,auto")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kv-cache-gb", type=float, default=0.5)
    ap.add_argument("--label", default="", help="carried into every line (e.g. the checkout)")
    ap.add_argument("--out", help="append the JSON lines to this file")
    args = ap.parse_args(argv)
    info = {"label": args.label, "commit": git_commit(), "machine": machine_name(),
            "cpu": cpu_model(), "model": args.model, "dtype": args.dtype}  # fmt: skip
    rows = []
    for r in range(args.rounds):
        for topology in args.topologies.split(","):
            row = info | {"round": r} | one_start(topology, args)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    for topology in args.topologies.split(","):
        mine = [row for row in rows if row["topology"] == topology]
        ready = [row["ready_s"] for row in mine]
        cpu = [row["cpu_s"] for row in mine]
        print(f"{args.label or info['commit']} {topology}: ready median {statistics.median(ready):.1f} s "
              f"({min(ready):.1f}-{max(ready):.1f}), CPU median {statistics.median(cpu):.1f} s "
              f"({min(cpu):.1f}-{max(cpu):.1f}) over {len(mine)} starts")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
