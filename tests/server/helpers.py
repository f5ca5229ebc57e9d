"""Small clients used by the server tests: HTTP generate, SSE streams, metric scraping."""

from __future__ import annotations

import json
import re
import threading
import time

import requests

KV_RE = re.compile(r'^bucketserve_kv_blocks_(free|total)\{instance="(\w+)"\} (\S+)$', re.M)


def generate(
    server, payload: dict, model: str = "bucketserve", timeout: float = 120
) -> requests.Response:
    return requests.post(
        f"http://{server.http_url}/v2/models/{model}/generate", json=payload, timeout=timeout
    )


def greedy_text(server, prompt: str, max_tokens: int) -> str:
    """The text of one greedy (temperature 0) generate call, which must answer 200."""
    r = generate(server, {"text_input": prompt, "max_tokens": max_tokens, "temperature": 0.0})
    assert r.status_code == 200, r.text
    return r.json()["text_output"]


def stream_events(
    server, payload: dict, model: str = "bucketserve", timeout: float = 120
) -> list[dict]:
    """All SSE events of one generate_stream call, parsed."""
    url = f"http://{server.http_url}/v2/models/{model}/generate_stream"
    with requests.post(url, json={**payload, "stream": True}, timeout=timeout, stream=True) as r:
        r.raise_for_status()
        return [
            json.loads(line[len(b"data: ") :])
            for line in r.iter_lines()
            if line.startswith(b"data: ")
        ]


def kv_blocks(server) -> dict[str, tuple[int, int]]:
    """{instance: (free, total)} from the Prometheus endpoint."""
    found: dict[str, dict[str, int]] = {}
    for kind, inst, value in KV_RE.findall(requests.get(server.metrics_url, timeout=10).text):
        found.setdefault(inst, {})[kind] = int(float(value))
    return {k: (v.get("free", -1), v.get("total", -2)) for k, v in found.items()}


def wait_all_blocks_free(server, timeout_s: float) -> tuple[float, dict]:
    """Poll until every instance reports free == total; returns (seconds waited, last reading)."""
    start = time.monotonic()
    while True:
        blocks = kv_blocks(server)
        # total 0: the instance has not published its pool yet (its gauges read 0 until then)
        if blocks and all(free == total > 0 for free, total in blocks.values()):
            return time.monotonic() - start, blocks
        if time.monotonic() - start > timeout_s:
            return time.monotonic() - start, blocks
        time.sleep(0.05)


def metric_value(server, name: str) -> float:
    """Sum of all samples of one metric."""
    total = 0.0
    for line in requests.get(server.metrics_url, timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_metric_above(server, name: str, floor: float, timeout_s: float = 10.0) -> float:
    """Poll a metric until it exceeds `floor` (decode publishes its counters every 0.25 s, so a
    read right after a request finished can miss its last step); returns the last reading."""
    end = time.monotonic() + timeout_s
    while (value := metric_value(server, name)) <= floor and time.monotonic() < end:
        time.sleep(0.1)
    return value


def openai_client(server, timeout_s: float = 300):
    """An `openai` client on the server's OpenAI port, once that port answers /health."""
    import openai

    base = f"http://{server.cfg.host}:{server.cfg.openai_port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{base}/health", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=timeout_s)


def streams_that_leave(url: str, payloads: list[dict], while_held=lambda: None) -> None:
    """One HTTP stream per payload; once every one has sent its first event, run
    `while_held()`, then close them all (Triton cancels a request whose client left)."""
    started = threading.Barrier(len(payloads) + 1, timeout=300)
    release = threading.Event()

    def one(payload: dict) -> None:
        with requests.post(url, json={**payload, "stream": True}, stream=True, timeout=300) as r:
            lines = r.iter_lines()
            while not next(lines).startswith(b"data: "):
                pass
            started.wait()
            release.wait(300)

    threads = [threading.Thread(target=one, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    try:
        started.wait()
        while_held()
    finally:
        release.set()
        for t in threads:
            t.join()
