"""Fault tolerance of `bucketserve serve` (front + supervisor + tritonserver), end to end.

One real launcher for the module; the tests run in file order: bad requests, a burst over the
queue limit, a killed decode stub (the server restarts), and a SIGTERM right after a stub died.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest
import requests
from bucketserve.serving.launch.serve_process import ServeProcess

from tests.server.test_errors import grpc_call, tensor

QUEUE_LIMIT = 8
MB = 1_000_000
G = "/v2/models/bucketserve/generate"
GS = "/v2/models/bucketserve/generate_stream"
INFER = "/v2/models/bucketserve/infer"  # refused at the edge before Triton sees it
FORM = "application/x-www-form-urlencoded"

pytestmark = [pytest.mark.server, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("faults") / "run"
    with running(run_dir, "--topology", "disaggregated", "--kv-cache-gb", "0.5", "--max-model-len", "2048",
                 "--max-queued-requests", str(QUEUE_LIMIT), "--drain-timeout-s", "5") as sp:  # fmt: skip
        yield sp


@contextlib.contextmanager
def running(run_dir, *args: str):
    """`bucketserve serve *args` in its own process, ready; killed at the end unless a test
    stopped it already."""
    sp = ServeProcess(run_dir, *args)
    sp.start()
    try:
        sp.wait_ready()
        yield sp
    finally:
        sp.stop(signal.SIGKILL if sp.proc.poll() is None else signal.SIGTERM)


def url(svc, path: str) -> str:
    return f"http://{svc.http_url}{path}"


def served(svc) -> str:
    r = requests.post(url(svc, G), json={"text_input": "Hi", "max_tokens": 4}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["text_output"]


def body_of(path: str, size: int) -> bytes:
    text = "a " * (size // 2)
    if path == INFER:
        doc = {
            "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [text]}]
        }
    else:
        doc = {"text_input": text, "max_tokens": 4}
    return json.dumps(doc).encode()


@pytest.mark.parametrize("size", [5 * MB, 50 * MB])
def test_oversize_bodies_get_413_and_the_server_keeps_serving(svc, size):
    for path in (G, GS, INFER):
        body = body_of(path, size)
        for ctype in (FORM, "application/json"):
            r = requests.post(
                url(svc, path), data=body, headers={"Content-Type": ctype}, timeout=60
            )
            assert r.status_code == 413, (path, ctype, r.status_code, r.text[:200])
            assert "max_request_bytes" in r.json()["error"]
    assert svc.ready()
    assert served(svc)


def test_form_encoded_body_under_the_limit_is_served(svc):
    """What `curl -d` sends: Triton crashed on it above ~4 MB; now read as JSON.

    docs/platform-notes.md#p11-large-form-body-crash
    """
    body = json.dumps({"text_input": "Hi", "max_tokens": 4})
    r = requests.post(url(svc, G), data=body, headers={"Content-Type": FORM}, timeout=120)
    assert r.status_code == 200 and r.json()["text_output"]


MALFORMED = {
    "nested 200k levels (SIGSEGV in Triton)": (
        G, b'{"text_input": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", {}, "levels"),
    "nested inputs (SIGSEGV in Triton)": (
        INFER, b'{"inputs": [{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}", {}, "levels"),
    "not UTF-8": (G, b'{"text_input": "\xff\xfe", "max_tokens": 2}', {}, "UTF-8"),
    "not JSON": (G, b'{"text_input": ', {}, "not valid"),
    "binary header longer than body": (
        INFER, b'{"inputs": []}', {"Inference-Header-Content-Length": "999999"},
        "Inference-Header-Content-Length"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_requests_get_400_and_the_server_keeps_serving(svc, case):
    path, body, headers, expect = MALFORMED[case]
    headers = {"Content-Type": "application/json", **headers}
    r = requests.post(url(svc, path), data=body, headers=headers, timeout=60)
    assert r.status_code == 400 and expect in r.json()["error"], r.text[:300]
    assert svc.ready()


def test_prompt_over_the_byte_limit_is_refused_before_tokenizing(svc):
    """Under the body limit but far beyond any context: refused by size, not after 10 s."""
    r = requests.post(url(svc, G), json={"text_input": "a " * 1_500_000, "max_tokens": 2})
    assert r.status_code == 400 and "bytes; no prompt over" in r.json()["error"]


def test_grpc_50mb_prompt_is_refused_and_the_server_keeps_serving(svc):
    """Triton 2.51 takes gRPC messages of any size (no flag caps it): the prompt check does."""
    text = np.array([b"a " * (25 * MB)], dtype=np.object_)
    inputs = [tensor("text_input", text, "BYTES"), tensor("max_tokens", np.int32([2]), "INT32")]
    _, errors = grpc_call(svc, inputs)
    assert errors and "bytes; no prompt over" in errors[0], errors
    assert served(svc)


def test_burst_over_the_queue_limit_gets_busy_and_the_rest_is_served(svc):
    n = 5 * QUEUE_LIMIT
    results: list[tuple[int, float, str]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        t0 = time.monotonic()
        payload = {"text_input": f"Count to {i}.", "max_tokens": 8}
        r = requests.post(url(svc, G), json=payload, timeout=300)
        with lock:
            results.append((r.status_code, time.monotonic() - t0, r.text[:200]))

    sched = psutil.Process(svc.stub_pid("scheduler_0_0"))
    rss_before = sched.memory_info().rss
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    grew_mb = (sched.memory_info().rss - rss_before) / 2**20
    print(f"\nscheduler stub RSS grew {grew_mb:.1f} MiB over the burst")
    assert grew_mb < 64  # the queue is bounded: a burst cannot grow it without limit
    busy = [r for r in results if r[0] == 503]
    ok = [r for r in results if r[0] == 200]
    print(f"\nburst {n}: served {len(ok)}, busy {len(busy)};"
          f" busy answered in {max((r[1] for r in busy), default=0):.2f}s at most,"
          f" served in {min((r[1] for r in ok), default=0):.2f}s at least")  # fmt: skip
    assert len(ok) + len(busy) == n, [r for r in results if r[0] not in (200, 503)]
    assert len(busy) >= 1 and len(ok) >= QUEUE_LIMIT
    assert all("server busy" in r[2] for r in busy)
    assert svc.ready()


def stream_until_error(svc, started: list, out: list, i: int) -> None:
    payload = {"text_input": f"Tell a long story number {i}.", "max_tokens": 400,
               "min_tokens": 400, "stream": True}  # fmt: skip
    events, t_end = [], None
    try:
        with requests.post(url(svc, GS), json=payload, stream=True, timeout=300) as r:
            if r.status_code != 200:  # the server went away before the stream began
                events.append(r.json())
            for line in r.iter_lines() if r.status_code == 200 else ():
                if line.startswith(b"data: "):
                    events.append(json.loads(line[6:]))
                    if len(events) == 1:
                        started.append(i)
    except requests.RequestException as e:
        events.append({"error": f"client: {e}"})
    t_end = time.monotonic()
    out.append((i, events[-1] if events else {}, t_end))


def test_killed_decode_stub_ends_every_stream_with_an_error_and_the_server_recovers(svc):
    check_killed_stub_recovers(svc, "decode_0_0")


def test_the_canary_passes_through_the_chain(svc):
    """The supervisor's canary (every 5 s by default) walks every stage of a healthy server and
    never fails there: its latency is exported, its failures stay 0."""
    deadline, count = time.monotonic() + 60, 0.0
    while time.monotonic() < deadline:
        text = requests.get(url(svc, "/metrics"), timeout=10).text
        count = metric(text, "bucketserve_canary_latency_seconds_count")
        if count >= 2:
            break
        time.sleep(1)
    assert count >= 2, text
    assert metric(text, "bucketserve_canary_failures_total") == 0
    total = metric(text, "bucketserve_canary_latency_seconds_sum")
    print(f"\ncanary: {count:.0f} sent, mean {total / count * 1000:.0f} ms through every stage")


@pytest.mark.parametrize("stub", ["decode_0_0", "prefill_0_0"])
def test_stopped_stub_is_named_and_the_server_recovers(svc, stub):
    """A stage alive but stuck (SIGSTOP) under 8 streams: readiness 503 naming it within 15 s,
    every stream ends with an error naming it within 20 s, served again within 120 s."""
    check_killed_stub_recovers(svc, stub, sig=signal.SIGSTOP)


def check_killed_stub_recovers(svc, stub: str, n: int = 8, sig=signal.SIGKILL) -> None:
    """`n` streams decoding, `sig` sent to `stub`: every stream ends with an error naming it
    (SIGKILL: within 5 s; SIGSTOP: 20 s), readiness drops naming it (SIGSTOP: within 15 s), the
    supervisor restarts the server (counted), and it serves again, over HTTP and over the gRPC
    edge."""
    part = stub.split("_")[0]
    restarts = f'bucketserve_server_restarts_total{{part="{part}"}}'
    before = metric(requests.get(url(svc, "/metrics"), timeout=10).text, restarts)
    started: list = []
    out: list = []
    threads = [threading.Thread(target=stream_until_error, args=(svc, started, out, i))
               for i in range(n)]  # fmt: skip
    for t in threads:
        t.start()
    deadline = time.monotonic() + 300
    while len(started) < n and time.monotonic() < deadline:  # every stream has a first token
        time.sleep(0.05)
    assert len(started) == n, out
    old_server, victim = svc.server_pid(), svc.stub_pid(stub)
    os.kill(victim, sig)
    t_kill = time.monotonic()
    not_ready = None
    while time.monotonic() - t_kill < 60:
        r = requests.get(url(svc, "/v2/health/ready"), timeout=10)
        if r.status_code == 503:
            not_ready = time.monotonic() - t_kill, r.text
            break
        time.sleep(0.1)
    assert not_ready is not None and stub in not_ready[1], not_ready
    for t in threads:
        t.join(timeout=60)
    waits = sorted(t_end - t_kill for _, _, t_end in out)
    print(f"\n{sig.name} {stub}: readiness 503 after {not_ready[0]:.1f}s ({not_ready[1][:120]});"
          f" {n} streams ended {waits[0]:.2f}..{waits[-1]:.2f}s after it")  # fmt: skip
    assert len(out) == n
    for _, last, _ in out:
        assert "error" in last and stub in last["error"], last
    assert waits[-1] < (5.0 if sig == signal.SIGKILL else 20.0)
    assert not_ready[0] < 15.0
    svc.wait_ready(timeout_s=600)
    recovered = time.monotonic() - t_kill
    print(f"serving again {recovered:.0f}s after the {sig.name}")
    assert recovered < (600 if sig == signal.SIGKILL else 120)
    assert served(svc)
    # the gRPC edge too: Triton came back on the same internal gRPC port
    inputs = [tensor("text_input", [b"Hi"], "BYTES"), tensor("max_tokens", np.int32([4]), "INT32")]
    results, errors = grpc_call(svc, inputs)
    assert results and not errors, errors
    metrics = requests.get(url(svc, "/metrics"), timeout=10).text
    assert metric(metrics, restarts) == before + 1
    assert not any(p.pid in (old_server, victim) for p in svc.processes())


def metric(text: str, series: str) -> float:
    """The value of one series in a Prometheus scrape; 0 if absent (a counter never touched)."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_sigterm_after_a_stub_died_leaves_no_process_and_no_shm(svc):
    check_sigterm_after_a_stub_died(svc, "prefill_0_0")


def check_sigterm_after_a_stub_died(svc, stub: str) -> None:
    assert svc.shm_segments(), "the run's segments should exist while it serves"
    os.kill(svc.stub_pid(stub), signal.SIGKILL)
    time.sleep(0.5)
    took = svc.stop(signal.SIGTERM)
    print(f"\nlauncher exited {took:.1f}s after SIGTERM (code {svc.proc.returncode})")
    assert svc.proc.returncode == 0
    time.sleep(1.5)  # stub watchdogs poll once a second
    assert svc.processes() == []
    assert svc.shm_segments() == set()
