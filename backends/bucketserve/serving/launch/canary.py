"""Health that tells the truth about a stage that is alive but stuck.

The supervisor's liveness watch catches a stub that dies. A stub that is alive but stopped,
deadlocked or spinning is, to Triton, healthy (upstream server#7230, #8604, #8841): every
request through it hangs while readiness says 200. Two probes, run by the supervisor:

* **Stopped stages.** A stub process found in the stopped state (SIGSTOP, a tracer) for
  STOPPED_GRACE_S is named at once: `stage decode_0_0 (pid N) is stopped`.
* **The canary.** Every `canary_interval_s` a 2-token greedy request to `bucketserve`, over
  Triton's internal HTTP, walks every stage: preprocessing, scheduler, a prefill instance,
  decode_router, a decode instance (in `colocated` the engine instance). A canary that gets no
  FINAL within `canary_timeout_s`, or an error other than "busy" (a full queue is a chain that
  answers), fails; `canary_failures` failures in a row mark the chain wedged, named by the
  stopped stage if one is, else by the canary's own error.

Either way the supervisor answers as it does for a dead stub (serving/launch/supervisor.py): readiness
503 naming the cause, the server killed (every in-flight request ends with that cause) and
started again.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass

import psutil
import requests

from bucketserve.serving.front.allowlist import ENTRY_MODELS
from bucketserve.serving.front.errors import OVERLOAD
from bucketserve.serving.launch.procs import Stub

STOPPED_GRACE_S = 1.0  # a tracer may stop a process for an instant (py-spy, gdb attach)
CANARY_BODY = {"text_input": "Hi", "max_tokens": 2, "min_tokens": 2, "temperature": 0.0}
STOPPED = frozenset({psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP})
SUCCESS = re.compile(
    r'^nv_inference_request_success\{.*?model="(?P<model>[^"]+)".*\} (?P<value>\S+)$'
)


@dataclass(slots=True, frozen=True)
class CanaryResult:
    """One canary: did the chain answer (`ok`), how long it took, and if not, why."""

    ok: bool
    latency_s: float
    error: str = ""


def send_canary(upstream: str, timeout_s: float, model: str = "bucketserve") -> CanaryResult:
    """One canary through Triton's internal HTTP `upstream` (http://127.0.0.1:PORT); a FINAL
    or a "busy" answer is a chain that works; no answer within `timeout_s` is not."""
    start, error = time.monotonic(), ""
    try:
        with requests.post(f"{upstream}/v2/models/{model}/generate_stream", json=CANARY_BODY,
                           stream=True, timeout=timeout_s) as resp:  # fmt: skip
            if not resp.ok:
                error = f"HTTP {resp.status_code}: {resp.text[:200]}"
            for line in resp.iter_lines() if resp.ok else ():
                if time.monotonic() - start > timeout_s:
                    error = f"no FINAL within {timeout_s:g}s"
                    break
                if line.startswith(b"data:") and "error" in (event := json.loads(line[5:])):
                    error = str(event["error"])[:200]
    except requests.RequestException as e:  # a read timeout mid-stream is a ConnectionError
        late = time.monotonic() - start >= timeout_s * 0.9
        error = f"no FINAL within {timeout_s:g}s" if late else f"{type(e).__name__}: {e}"[:200]
    return CanaryResult(not error or bool(OVERLOAD.search(error)), time.monotonic() - start, error)


def completed_requests(metrics_url: str) -> float | None:
    """Requests the entry models have served to the end so far (Triton's success counters);
    None if the scrape fails. A canary that is late while this grows is queued behind real
    work: the chain is slow, not stuck. Failures do not count: "busy" answers go on while a
    stage downstream is stuck, and so does the first step (preprocessing) of every request."""
    try:
        text = requests.get(metrics_url, timeout=5).text
    except requests.RequestException:
        return None
    total = 0.0
    for line in text.splitlines():
        found = SUCCESS.match(line)
        if found and found["model"] in ENTRY_MODELS:
            total += float(found["value"])
    return total


class CanaryProbe:
    """Sends a canary every `interval_s` on a thread of its own; `poll()` (the supervisor's
    watch loop) returns the cause once `failures` canaries in a row have failed."""

    def __init__(self, upstream: str, metrics_url: str, interval_s: float, timeout_s: float,
                 failures: int, metrics=None) -> None:  # fmt: skip
        self.upstream, self.metrics_url, self.metrics = upstream, metrics_url, metrics
        self.interval_s, self.timeout_s, self.failures = interval_s, timeout_s, failures
        self.thread: threading.Thread | None = None
        self.result: CanaryResult | None = None
        self.next_at = time.monotonic() + interval_s
        self.failed = 0  # failures in a row
        self.judged = 0  # canaries judged so far

    def poll(self, now: float | None = None) -> str | None:
        now = time.monotonic() if now is None else now
        if self.interval_s <= 0:
            return None
        if self.thread is None and now >= self.next_at:
            self.thread = threading.Thread(target=self.run, name="canary", daemon=True)
            self.thread.start()
        if self.thread is None or self.thread.is_alive():
            return None
        self.thread, result = None, self.result
        self.next_at, self.judged = now + self.interval_s, self.judged + 1
        if self.metrics is not None:
            self.metrics.canary_latency.observe(result.latency_s)
            if not result.ok:
                self.metrics.canary_failures.inc()
        self.failed = 0 if result.ok else self.failed + 1
        if self.failed >= self.failures:
            return f"the canary request failed ({self.failed} in a row): {result.error}"
        return None

    def run(self) -> None:
        before = completed_requests(self.metrics_url)
        result = send_canary(self.upstream, self.timeout_s)
        if not result.ok and result.error.startswith("no FINAL"):
            after = completed_requests(self.metrics_url)
            if before is not None and after is not None and after > before:
                result = CanaryResult(True, result.latency_s, "slow: queued behind real work")
        self.result = result


class StoppedWatch:
    """Which stubs have been in the stopped state for at least STOPPED_GRACE_S."""

    def __init__(self) -> None:
        self.since: dict[int, float] = {}

    def check(self, stubs: list[Stub], now: float | None = None) -> Stub | None:
        now = time.monotonic() if now is None else now
        found = None
        for stub in stubs:
            if is_stopped(stub.pid):
                first = self.since.setdefault(stub.pid, now)
                if found is None and now - first >= STOPPED_GRACE_S:
                    found = stub
            else:
                self.since.pop(stub.pid, None)
        return found


def is_stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() in STOPPED
    except psutil.NoSuchProcess:
        return False
