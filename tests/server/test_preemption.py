"""A decode pool too small for the batch's full growth: requests are preempted and recomputed,
never failed, and their greedy output equals an unpreempted run."""

from __future__ import annotations

import concurrent.futures as cf

import pytest

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
