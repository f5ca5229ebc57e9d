"""Two prefill and two decode CPU instances (dummy:tiny, so two cores suffice): every request
runs where the scheduler placed it, prefill batches overlap, greedy output is unchanged."""

from __future__ import annotations

import concurrent.futures as cf
import re

import pytest
import requests

from .conftest import start_server
from .helpers import generate, stream_events, wait_all_blocks_free
from .test_cancel import assert_blocks_return, check_stop_requests, start_streams

pytestmark = pytest.mark.server

COUNT_RE = re.compile(
    r'^bucketserve_(placed|instance)_requests_total\{instance="(\w+)"\} (\S+)$', re.M
)
SPAN_RE = re.compile(r"(prefill\d) batch seqs=\d+ tokens=\d+ span=([\d.]+)-([\d.]+)")
INSTANCES = ("prefill0", "prefill1", "decode0", "decode1")
# dummy:tiny decodes 512 tokens in seconds: on a loaded machine a stream that started first
# could finish before the last one started. Near the model's 2,048 positions, it cannot.
STREAM_TOKENS = 1900
WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi".split()
)


@pytest.fixture(scope="module")
def server_2p2d(tmp_path_factory):
    srv = start_server(
        tmp_path_factory,
        model="dummy:tiny",
        prefill_devices=["cpu", "cpu"],
        decode_devices=["cpu", "cpu"],
        kv_cache_gb=0.05,
        max_prefill_tokens=1200,  # about one long prompt per batch: many batches to place
        preprocessing_instances=1,
    )
    yield srv
    srv.stop()


def prompt(i: int) -> str:
    n = 150 + 40 * i  # words; several hundred tokens each
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n))


def payload(i: int) -> dict:
    return {"text_input": prompt(i), "max_tokens": 12, "temperature": 0.0}


def counts(server) -> dict[str, dict[str, float]]:
    text = requests.get(server.metrics_url, timeout=10).text
    out: dict[str, dict[str, float]] = {"placed": {}, "instance": {}}
    for kind, inst, value in COUNT_RE.findall(text):
        out[kind][inst] = float(value)
    return out


def spans(server) -> list[tuple[str, float, float]]:
    log = server.log_path.read_text(errors="replace")
    return [(i, float(a), float(b)) for i, a, b in SPAN_RE.findall(log)]


def run_all(server, n: int, model: str) -> list[str]:
    with cf.ThreadPoolExecutor(n) as pool:
        futs = [pool.submit(generate, server, payload(i), model) for i in range(n)]
        resps = [f.result() for f in futs]
    for r in resps:
        assert r.status_code == 200, r.text
    return [r.json()["text_output"] for r in resps]


def test_work_lands_where_the_scheduler_placed_it(server_2p2d):
    srv = server_2p2d
    sequential = [generate(srv, payload(i)).json()["text_output"] for i in range(8)]
    concurrent = run_all(srv, 8, "bucketserve")
    via_bls = run_all(srv, 8, "bucketserve_bls")
    assert concurrent == sequential and via_bls == sequential  # greedy: placement-independent
    for model in ("bucketserve", "bucketserve_bls"):  # streams relayed from the chosen decode_<i>
        events = stream_events(srv, payload(3), model)
        assert "".join(e["text_output"] for e in events) == sequential[3]
        assert events[-1]["finish_reason"] == "length"

    waited, blocks = wait_all_blocks_free(srv, timeout_s=30)
    assert all(free == total for free, total in blocks.values()), blocks
    assert set(blocks) == set(INSTANCES)

    c = counts(srv)
    assert all(c["placed"].get(i, 0) > 0 for i in INSTANCES), c  # both of each role used
    for inst in INSTANCES:  # what the scheduler decided == what the instance itself did
        assert c["placed"][inst] == c["instance"][inst], (inst, c)
    assert c["placed"]["decode0"] + c["placed"]["decode1"] == 26

    found = spans(srv)
    assert {i for i, _, _ in found} == {"prefill0", "prefill1"}
    overlaps = [
        (a, b)
        for a in found
        for b in found
        if a[0] == "prefill0" and b[0] == "prefill1" and a[1] < b[2] and b[1] < a[2]
    ]
    assert overlaps, f"no two prefill batches overlapped in time: {found}"


def test_stop_and_cancel_reach_the_decode_instance_holding_the_request(server_2p2d):
    """Stops name a request, not an instance: the router and bucketserve_bls send them to
    every decode_<i>; each stopped stream ends "cancelled" and every block comes back."""
    check_stop_requests(server_2p2d, "stop request (ensemble, 2 decode instances)", STREAM_TOKENS)
    client, _, _ = start_streams(server_2p2d, "bucketserve_bls", tokens=STREAM_TOKENS)
    client.stop_stream(cancel_requests=True)
    client.close()
    assert_blocks_return(server_2p2d, "gRPC cancel (bucketserve_bls, 2 decode instances)")
