"""The server in bfloat16 (the CPU default where bf16 is native; `--dtype bfloat16` on AVX2
CPUs): prefill and decode instances on the bf16 paths, the KV handed over in bf16, and the
default colocated topology. Requests
sent one at a time come back token for token as the engine generates them in this process in
bf16 (the same kernels on the same shapes: each prompt prefilled alone, decoded at batch 1;
batched, a row's bf16 rounding depends on which kernel its batch size picks, and the engine's
own outputs at 4 sequences per step differ from 1 on one of these prompts), concurrent ones
all finish, and every KV block comes back. The check can fail: float32 differs from bf16 on
two of these prompts within 24 tokens."""

from __future__ import annotations

import concurrent.futures as cf

import pytest
import torch
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.llm_engine import LLMEngine
from bucketserve.engine.sampling_params import SamplingParams

from tests.parity.bf16_refs import engine_bf16_skip_reason

from .conftest import start_server
from .helpers import greedy_text, wait_all_blocks_free
from .test_parity_server import PROMPTS as PARITY_PROMPTS

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(
        engine_bf16_skip_reason() is not None, reason=str(engine_bf16_skip_reason())
    ),
]

PROMPTS = [PARITY_PROMPTS[i] for i in (0, 1, 2, -1)]  # France, fibonacci, village, SELECT
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def bf16_server(tmp_path_factory):
    """P/D (the tests' topology): one prefill and one decode instance, the KV handed over."""
    srv = start_server(tmp_path_factory, dtype="bfloat16")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def bf16_colocated(tmp_path_factory):
    """The default topology (`auto`: colocated instances, chunked prefill fused with decode)."""
    srv = start_server(tmp_path_factory, dtype="bfloat16", topology="auto")
    yield srv
    srv.stop()


def ask(server, prompt: str) -> str:
    return greedy_text(server, prompt, NEW_TOKENS)


def test_instances_run_bf16_and_say_so(bf16_server):
    log = bf16_server.server.log_path.read_text(errors="replace")
    for role in ("prefill0", "decode0"):
        line = next(line for line in log.splitlines() if f'"{role}: ' in line)
        assert "on cpu bfloat16 (--dtype bfloat16)" in line, line


def test_sequential_requests_equal_the_engine_in_bf16(bf16_server):
    from transformers import AutoTokenizer

    model_dir = bf16_server.cfg.model_dir
    tok = AutoTokenizer.from_pretrained(model_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each server instance runs
    try:
        engine = LLMEngine(EngineConfig(model=model_dir, device="cpu", dtype="bfloat16",
                                        max_num_seqs=1, kv_cache_gb=0.25,
                                        max_model_len=2048))  # fmt: skip
        params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)
        ids = [tok(p).input_ids for p in PROMPTS]
        expected = [tok.decode(out, skip_special_tokens=True)
                    for out in engine.generate(ids, [params] * len(ids))]  # fmt: skip
        engine.close()
    finally:
        torch.set_num_threads(threads)
    got = [ask(bf16_server, p) for p in PROMPTS]  # one at a time: prefill alone, decode batch 1
    mismatches = {p: (g, e) for p, g, e in zip(PROMPTS, got, expected, strict=True) if g != e}
    assert not mismatches, mismatches


@pytest.mark.parametrize("topology", ["bf16_server", "bf16_colocated"])
def test_concurrent_requests_all_finish_and_free_their_blocks(topology, request):
    server = request.getfixturevalue(topology)
    prompts = [f"{p} (variant {i})" for i in range(2) for p in PROMPTS]  # 8: batched steps
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        texts = list(pool.map(lambda p: ask(server, p), prompts))
    assert all(texts), texts
    waited, blocks = wait_all_blocks_free(server, timeout_s=10)
    assert all(free == total > 0 for free, total in blocks.values()), (waited, blocks)
