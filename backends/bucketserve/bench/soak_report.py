"""RSS per process of a run, and the soak report (report.json + a short report.md + requests.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

import psutil

from bucketserve.serving.launch.procs import STUB_NAME, stub_instance
from bucketserve.serving.launch.serve_process import ServeProcess


def by_process(sp: ServeProcess, measure, stub_key=stub_instance) -> dict[str, float]:
    """{launcher | tritonserver | stub_key(stub's command line): measure(process)} over the live
    processes of a run; stubs that share a key add up (e.g. the instances of one model)."""
    out = {"launcher": measure(psutil.Process(sp.proc.pid))}
    for p in sp.processes():
        try:
            cmd, value = p.info["cmdline"], measure(p)
        except psutil.Error:
            continue
        if cmd[0].endswith("tritonserver"):
            key = "tritonserver"
        elif cmd[0].endswith(STUB_NAME):
            key = stub_key(cmd)
        else:
            continue
        out[key] = out.get(key, 0) + value
    return out


def rss_by_process(sp: ServeProcess, private: bool = False) -> dict[str, int]:
    """{launcher | tritonserver | stub instance: RSS bytes} for the live processes of a run;
    `private`: RSS less its shared pages (the stubs' shared-memory regions count in the RSS of
    every process that touched them, tritonserver's included)."""

    def size(p: psutil.Process) -> int:
        m = p.memory_info()
        return m.rss - m.shared if private else m.rss

    return by_process(sp, size)


def rss_growth(rss: dict) -> dict[str, float]:
    """Percent growth from the warm-up sample to the end, per process present in both with a
    non-zero first reading (a process caught dying reads 0: with --faults the first kill comes
    at the end of the warm-up)."""
    warm, end = rss.get("warm", {}), rss.get("end", {})
    return {k: round(100.0 * (end[k] - warm[k]) / warm[k], 2) for k in warm if k in end and warm[k]}


def second_half_growth(timeline: list[tuple[float, dict]], key: str = "rss") -> dict[str, float]:
    """Percent growth from the sample nearest the middle of the run to the last one: a leak
    keeps growing there, a process that only warms up its allocator does not."""
    if len(timeline) < 3:
        return {}
    mid, last = timeline[len(timeline) // 2][1][key], timeline[-1][1][key]
    return rss_growth({"warm": mid, "end": last})


def in_flight_peaks(spans: list[tuple[float, float]], t_warm: float) -> dict[str, int]:
    """Most requests in flight at once before and after the warm-up ended. Triton's and the
    stubs' memory follows this count (their allocators keep a high-water mark), so RSS growth
    after warm-up means little unless the warm-up reached the later peak."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peaks, n = {"warm_up": 0, "after": 0}, 0
    for t, step in events:
        if t >= t_warm:  # those in flight as the warm-up ends count in both phases
            peaks["after"] = max(peaks["after"], n)
        n += step
        phase = "warm_up" if t < t_warm else "after"
        peaks[phase] = max(peaks[phase], n)
    return peaks


def in_flight_at_kills(report: dict, outs_end: list[tuple[float, float]]) -> None:
    """For each fault: requests running at the kill, and how long the slowest took to end."""
    for f in report.get("faults", []):
        t = f["t_kill"]
        running = [end - t for start, end in outs_end if start < t < end]
        f["in_flight"] = len(running)
        f["slowest_end_after_kill_s"] = round(max(running), 2) if running else None


def write_report(report: dict, out: Path) -> None:
    """report.json and report.md (summaries, kept in git); requests.jsonl (one row per request,
    raw data that .gitignore keeps out of git)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = report.get("requests", [])
    (out / "requests.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    summary = {k: v for k, v in report.items() if k != "requests"}
    (out / "report.json").write_text(json.dumps(summary, indent=1, default=str))
    lines = [
        "# Soak report\n",
        "```",
        json.dumps(
            {
                k: v
                for k, v in report.items()
                if k not in ("rss", "args", "rss_timeline", "requests")
            },
            indent=1,
            default=str,
        ),
        "```",
        f"\nargs: `{json.dumps(report.get('args', {}), default=str)}`",
    ]
    (out / "report.md").write_text("\n".join(lines) + "\n")
