"""The canary and the stopped-stage watch (serving/launch/canary.py) against a stand-in Triton: an
HTTP server whose generate_stream answers, fails, says busy or never finishes."""

from __future__ import annotations

import http.server
import signal
import subprocess
import threading
import time

import pytest
from bucketserve.serving.launch.canary import (
    STOPPED_GRACE_S,
    CanaryProbe,
    StoppedWatch,
    completed_requests,
    send_canary,
)
from bucketserve.serving.launch.procs import Stub

SUCCESS = 'nv_inference_request_success{model="bucketserve",version="1"} '


class StandIn(http.server.BaseHTTPRequestHandler):
    mode = "ok"  # ok | error | busy | hang | http500
    served = 0  # the /metrics success counter of the entry model

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # /metrics
        body = (f"{SUCCESS}{StandIn.served}\n"
                'nv_inference_request_success{model="prefill_0",version="1"} 99\n').encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        if StandIn.mode == "http500":
            self.send_response(500)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"oops")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        events = {"ok": [b'{"text_output": "x"}', b'{"text_output": "y"}'],
                  "error": [b'{"error": "decode_0: boom"}'],
                  "busy": [b'{"error": "server busy: 8 requests queued, retry later"}'],
                  "hang": [b'{"text_output": "x"}']}[StandIn.mode]  # fmt: skip
        for event in events:
            self.wfile.write(b"data: " + event + b"\n\n")
            self.wfile.flush()
        if StandIn.mode == "hang":
            time.sleep(3)


@pytest.fixture
def stand_in():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    StandIn.mode, StandIn.served = "ok", 0
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_send_canary_judges_each_answer(stand_in):
    assert send_canary(stand_in, 5).ok
    StandIn.mode = "busy"  # a full queue is a chain that answers
    r = send_canary(stand_in, 5)
    assert r.ok and "busy" in r.error
    StandIn.mode = "error"
    r = send_canary(stand_in, 5)
    assert not r.ok and r.error == "decode_0: boom"
    StandIn.mode = "http500"
    r = send_canary(stand_in, 5)
    assert not r.ok and r.error.startswith("HTTP 500")
    StandIn.mode = "hang"
    r = send_canary(stand_in, 1.0)
    assert not r.ok and r.error == "no FINAL within 1s" and 0.9 <= r.latency_s < 3
    r = send_canary("http://127.0.0.1:9", 1.0)  # nothing listens
    assert not r.ok and "ConnectionError" in r.error


def test_completed_requests_counts_entry_model_successes(stand_in):
    StandIn.served = 7
    assert completed_requests(stand_in + "/metrics") == 7.0  # prefill_0's 99 is not an entry
    assert completed_requests("http://127.0.0.1:9/metrics") is None


def wait_poll(probe: CanaryProbe, timeout_s: float = 10) -> str | None:
    """Poll until the probe has judged one more canary (or timeout_s)."""
    judged = probe.judged
    deadline = time.monotonic() + timeout_s
    while probe.judged == judged and time.monotonic() < deadline:
        cause = probe.poll()
        if cause is not None:
            return cause
        time.sleep(0.02)
    return None


def test_probe_fails_after_consecutive_failures_only(stand_in):
    probe = CanaryProbe(stand_in, stand_in + "/metrics", interval_s=0.01, timeout_s=1.0,
                        failures=2)  # fmt: skip
    assert wait_poll(probe) is None and probe.failed == 0
    StandIn.mode = "error"
    assert wait_poll(probe) is None and probe.failed == 1
    StandIn.mode = "ok"  # a success in between starts the count over
    assert wait_poll(probe) is None and probe.failed == 0
    StandIn.mode = "error"
    assert wait_poll(probe) is None
    cause = wait_poll(probe)
    assert cause == "the canary request failed (2 in a row): decode_0: boom"


def test_a_late_canary_while_other_requests_finish_is_slow_not_stuck(stand_in):
    StandIn.mode = "hang"
    probe = CanaryProbe(stand_in, stand_in + "/metrics", interval_s=0.01, timeout_s=0.5,
                        failures=1)  # fmt: skip
    bump = threading.Timer(0.2, lambda: setattr(StandIn, "served", StandIn.served + 1))
    bump.start()
    assert wait_poll(probe) is None and probe.failed == 0  # real work finished meanwhile
    assert wait_poll(probe) == "the canary request failed (1 in a row): no FINAL within 0.5s"


def test_probe_off_sends_nothing(stand_in):
    probe = CanaryProbe(stand_in, stand_in + "/metrics", interval_s=0, timeout_s=1, failures=1)
    assert probe.poll() is None and probe.thread is None


def test_stopped_watch_names_a_stopped_process_after_the_grace():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        watch, stub = StoppedWatch(), Stub(proc.pid, "decode_0_0")
        assert watch.check([stub]) is None
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while watch.check([stub]) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.check([stub]) == stub
        assert time.monotonic() - watch.since[proc.pid] >= STOPPED_GRACE_S
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.2)
        assert watch.check([stub]) is None and proc.pid not in watch.since
    finally:
        proc.kill()
        proc.wait()
