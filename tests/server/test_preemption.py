"""A decode pool too small for the batch's full growth: requests are preempted and recomputed,
never failed, and their greedy output equals an unpreempted run; with a shared prefix cached
and streams dropped mid-way too, nothing is refused and no block stays referenced."""

from __future__ import annotations

import concurrent.futures as cf
import uuid

import pytest
import requests

from .conftest import start_server
from .helpers import generate, metric_value, wait_all_blocks_free, wait_metric_above

pytestmark = pytest.mark.server

POOL_GB = 48 * 16 * 512 / 2**30  # dummy:tiny stores 512 bytes per token: 48 blocks of 16 tokens


@pytest.fixture(scope="module", params=["disaggregated", "colocated"])
def small_pool(tmp_path_factory, request):
    srv = start_server(  # the engine insists on one max_model_len sequence per pool
        tmp_path_factory, model="dummy:tiny", kv_cache_gb=POOL_GB, max_model_len=48 * 16,
        preprocessing_instances=1, topology=request.param, chunk_tokens=64,
    )  # fmt: skip
    yield srv
    srv.stop()


def payload(i: int) -> dict:
    words = " ".join(["lorem", "ipsum", "dolor", "sit", "amet"][(i + k) % 5] for k in range(40))
    # min_tokens = max_tokens: every request grows to its full length (EOS masked)
    return {"text_input": f"{i}: {words}", "max_tokens": 160, "min_tokens": 160,
            "temperature": 0.0}  # fmt: skip


def test_preempted_requests_finish_with_unpreempted_output(small_pool):
    srv = small_pool
    blocks = wait_all_blocks_free(srv, timeout_s=30)[1]
    assert blocks["decode0"][1] == 48, blocks  # the pool this test is sized for
    alone = [generate(srv, payload(i)).json() for i in range(6)]  # one at a time: no pressure
    before = metric_value(srv, "bucketserve_preemptions_total")
    with cf.ThreadPoolExecutor(6) as pool:  # 6 x ~13 blocks at full length > 48 blocks
        together = list(pool.map(lambda i: generate(srv, payload(i)), range(6)))
    assert [r.status_code for r in together] == [200] * 6, [r.text for r in together]
    assert [r.json()["text_output"] for r in together] == [a["text_output"] for a in alone]
    assert all(r.json()["num_output_tokens"] == 160 for r in together)
    assert wait_metric_above(srv, "bucketserve_preemptions_total", before) > before
    assert wait_metric_above(srv, "bucketserve_recomputed_tokens_total", 0) > 0
    waited, blocks = wait_all_blocks_free(srv, timeout_s=30)
    assert all(free == total for free, total in blocks.values()), blocks


SHARED = " ".join(["alpha", "beta", "gamma", "delta"][k % 4] for k in range(80))  # ~6 blocks


def shared_payload(i: int, salt: str) -> dict:
    return {"text_input": f"{SHARED}\n{i}: go on", "max_tokens": 160, "min_tokens": 160,
            "temperature": 0.0, "cache_salt": salt}  # fmt: skip


def drop_after_first_tokens(srv, payload: dict, events: int = 3) -> int:
    """Stream and hang up after `events` events; the HTTP status the stream started with."""
    url = f"http://{srv.http_url}/v2/models/bucketserve/generate_stream"
    with requests.post(url, json={**payload, "stream": True}, timeout=120, stream=True) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith(b"data: ")
            if seen >= events:
                break
        return r.status_code


def test_shared_prefix_load_that_fills_the_pool(small_pool):
    """Prefix caching under a load the pool cannot hold: 4 requests sharing a cached prefix
    plus 4 streams dropped after their first tokens. Every request is served (no busy answer,
    no failure), with the output of an uncached run; afterwards every block is free or
    evictable, the shared prefix still cached, and the dropped streams reference nothing."""
    srv = small_pool
    alone = [generate(srv, shared_payload(i, uuid.uuid4().hex)).json() for i in range(4)]
    assert all(a["num_cached_tokens"] == 0 for a in alone)  # own salts: computed afresh
    salt = uuid.uuid4().hex
    assert generate(srv, shared_payload(99, salt)).status_code == 200  # caches the prefix
    hits_before = metric_value(srv, "bucketserve_prefix_cache_hits_total")
    with cf.ThreadPoolExecutor(8) as pool:  # 8 x ~17 blocks at full length > 48 blocks
        served = [pool.submit(generate, srv, shared_payload(i, salt)) for i in range(4)]
        dropped = [pool.submit(drop_after_first_tokens, srv, shared_payload(i, salt))
                   for i in range(4, 8)]  # fmt: skip
        replies = [f.result() for f in served]
        assert [f.result() for f in dropped] == [200] * 4
    assert [r.status_code for r in replies] == [200] * 4, [r.text for r in replies]
    assert [r.json()["text_output"] for r in replies] == [a["text_output"] for a in alone]
    assert all(r.json()["num_cached_tokens"] >= 64 for r in replies)
    hits = wait_metric_above(srv, "bucketserve_prefix_cache_hits_total", hits_before)
    assert hits >= hits_before + 4 * 64
    waited, blocks = wait_all_blocks_free(srv, timeout_s=30)  # free counts evictable blocks
    assert all(free == total for free, total in blocks.values()), blocks
    assert metric_value(srv, "bucketserve_kv_blocks_cached") > 0  # the prefix, evictable
