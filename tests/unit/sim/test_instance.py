"""The simulator's instances are the engine Scheduler over a real BlockManager."""

from __future__ import annotations

from dataclasses import replace

from bucketserve.engine.scheduler import Scheduler
from bucketserve.scheduling import RequestMeta
from bucketserve.sim.instance import SimInstance
from bucketserve.sim.simulator import Simulator
from bucketserve.sim.workload import SimRequest, WorkloadSpec, make_requests


class Source:
    """A prefill instance stand-in that records when its KV is pulled."""

    def __init__(self) -> None:
        self.released: list[int] = []

    def release(self, prompt_len: int) -> None:
        self.released.append(prompt_len)


def request(rid: str, prompt_len: int, output_len: int) -> SimRequest:
    return SimRequest(RequestMeta(rid, prompt_len, output_len, 0.0), output_len)


def test_a_handoff_decodes_only_once_its_kv_is_here(cluster):
    inst = SimInstance("decode0", "decode", cluster, handoff_time=lambda tokens: 0.5)
    src, req = Source(), request("a", 100, 3)
    inst.add_prefilled(req, source=src)
    step = inst.schedule(now=0.0)
    assert [s.seq_id for s in step.admitted] == ["a"] and src.released == [100]
    assert step.is_empty and inst.next_ready_s() == 0.5  # admitted, KV in flight
    assert inst.free_blocks == inst.total_blocks - 7  # 101 tokens in blocks of 16
    step = inst.schedule(now=0.5)
    assert [s.seq_id for s in step.decodes] == ["a"]
    assert inst.finish(step, 0.6) == [] and req.last_token_s == 0.6
    step = inst.schedule(now=0.6)
    assert inst.finish(step, 0.7) == [req]  # max_tokens = output length: the stop rule
    assert inst.free_blocks == inst.total_blocks and not inst.running


def test_a_prompt_is_chunked_by_the_token_budget(cluster):
    inst = SimInstance("gpu0", "mixed", cluster, token_budget=64)
    req = request("p", 150, 2)
    inst.add_prompt(req)
    sizes = []
    while req.first_token_s != req.first_token_s:
        step = inst.schedule(now=0.0)
        sizes.append([c.num_tokens for c in step.chunks])
        inst.finish(step, 1.0)
    assert sizes == [[64], [64], [22]]


def test_every_deployment_drives_the_engine_scheduler(cluster, latency):
    for topology in ("pd", "aggregated", "chunked", "bullet"):
        reqs = make_requests(WorkloadSpec("mixed", 40, 2.0, seed=3))
        sim = Simulator("fcfs", reqs, replace(cluster, topology=topology), latency)
        sim.run()
        workers = sim.decode if topology == "pd" else sim.engine.workers
        assert workers and all(isinstance(w.scheduler, Scheduler) for w in workers)
        assert all(w.free_blocks == w.total_blocks for w in workers)
