"""The hybrid topology's control plane without Triton: the config, the budgets file the
scheduler writes and the instances read, the scheduler's intake per budget, the ledger's
move, and a decode worker handing a decode on (its blocks held until the peer acks)."""

from __future__ import annotations

import dataclasses
import os
import queue
import time
from types import SimpleNamespace

import pytest
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.sampler import SampleOutput
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.engine.sequence import Sequence
from bucketserve.kv.handoff import HandoffTable
from bucketserve.kv.names import shm_name
from bucketserve.scheduling import SchedulerConfig, make_scheduler
from bucketserve.scheduling.memory import DecodeLedger, Reservation
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.contract import GenerateParams
from bucketserve.serving.core.decode_stream import Stream
from bucketserve.serving.core.decode_worker import DecodeWorker
from bucketserve.serving.core.messages import KIND_GENERATE, MIGRATED, Handoff
from bucketserve.serving.core.migration import Migration
from bucketserve.serving.core.roles_file import HybridControl, RolesReader, initial_budgets
from bucketserve.serving.core.scheduler_core import SchedulerCore

from .test_scheduler_core import ColocatedCluster, Recorder, wait_for


def hybrid_cfg(tmp_path, **kw) -> ServeConfig:
    return ServeConfig(topology="hybrid", run_dir=str(tmp_path), run_id=f"h{os.getpid() % 10**6}",
                       chunk_tokens=32, **kw)  # fmt: skip


def test_hybrid_takes_every_device_once_and_reads_back_the_same(tmp_path):
    cfg = hybrid_cfg(tmp_path)
    assert cfg.decode_devices == ["cpu", "cpu"] and cfg.prefill_devices == []
    assert cfg.is_hybrid and cfg.is_colocated and cfg.engine_prefill_devices == []
    again = ServeConfig(**dataclasses.asdict(cfg))  # what every stub reads
    assert again.decode_devices == ["cpu", "cpu"]


@pytest.mark.parametrize(
    ("kw", "message"),
    [({"prefill_devices": ["cuda:0"], "decode_devices": ["cuda:0"]}, "at least 2 instances"),
     ({"hybrid_layout": 2}, "hybrid_layout must be -1"),
     ({"hybrid_heavy_tokens": 512}, "hybrid_heavy_tokens must be in 1024"),
     ({"chunk_tokens": 2048}, "must be below 1024")],
)  # fmt: skip
def test_bad_hybrid_settings_name_the_field(tmp_path, kw, message):
    with pytest.raises(ValueError, match=message):
        ServeConfig(topology="hybrid", run_dir=str(tmp_path), **kw)


def test_instances_read_the_budgets_the_scheduler_writes(tmp_path):
    cfg = hybrid_cfg(tmp_path, hybrid_period_s=1.0)
    reader = RolesReader(cfg)
    assert reader.budgets() == initial_budgets(cfg) == (32, 32)  # adaptive starts all mixed
    control = HybridControl(cfg)
    control.tick(0.0)
    for _ in range(20):  # TPOT is what misses
        control.record((True, False))
    assert control.tick(1.5) and control.budgets == (2048, 0) and control.layout == 1
    reader._next = 0.0  # no need to wait for the next poll
    assert reader.budgets() == (2048, 0)
    other = RolesReader(dataclasses.replace(cfg, run_id="other1"))  # another run's file
    assert other.budgets() == (32, 32)


def test_a_fixed_layout_never_moves(tmp_path):
    control = HybridControl(hybrid_cfg(tmp_path, hybrid_layout=1))
    assert control.budgets == (2048, 0)
    for _ in range(40):
        control.record((False, False))
    assert not control.tick(100.0) and control.budgets == (2048, 0)


def test_the_scheduler_offers_prompts_only_to_instances_with_a_budget(tmp_path):
    cfg = hybrid_cfg(tmp_path, hybrid_layout=1)  # decode0 heavy, decode1 decode-only
    rec, cluster = Recorder(), ColocatedCluster(2)
    cluster.backlog = [600, 0]  # the heavy one is the more loaded, still under its budget
    rec_metrics = rec.metrics()
    rec_metrics.roles = lambda *a: None
    sched = make_scheduler("fcfs", SchedulerConfig(max_model_len=2048, block_size=16),
                           time.monotonic)  # fmt: skip
    core = SchedulerCore(sched, cluster.view, rec.prefill, rec.send_handoff, rec.send_error, 0,
                         rec_metrics, chunk_tokens=32, hybrid=HybridControl(cfg))  # fmt: skip
    core.start()
    try:
        for i in range(3):
            core.add(f"r{i}", [1, 2, 3], GenerateParams(sampling=SamplingParams(max_tokens=4)))
            wait_for(lambda n=i + 1: len(rec.handoffs) == n)
            cluster.received[0] += 1
    finally:
        core.close()
    assert {h.decode_index for _, h in rec.handoffs} == {0}
    assert all(h.tpot_slo_s > 0 and h.ttft_slo_s > 0 for _, h in rec.handoffs)


def test_a_moved_request_takes_its_reservation_along():
    ledger = DecodeLedger()
    ledger.reserve(Reservation("a", "decode0", 2, 5, 1, 3.0))
    ledger.reserve(Reservation("b", "decode0", 1, 2, 1, 1.0))
    ledger.move("a", "decode1")
    assert (ledger.reserved("decode0"), ledger.reserved("decode1")) == (2, 5)
    assert (ledger.count("decode0"), ledger.count("decode1")) == (1, 1)
    ledger.clear("decode0")  # the moved request is not decode0's any more
    assert ledger.count("decode1") == 1
    ledger.release("a")
    assert ledger.reserved("decode1") == 0 and len(ledger) == 0


class StepRunner:
    """Returns token 7 for every sampled row; each step takes `step_s`."""

    model_config = SimpleNamespace(eos_token_ids=(2,), max_model_len=4096)

    def __init__(self, step_s: float = 0.0) -> None:
        self.step_s = step_s

    def step_sampled(self, decodes, chunks):
        time.sleep(self.step_s)
        rows = decodes + [c.seq for c in chunks if c.is_last]
        return SampleOutput([7] * len(rows), [None] * len(rows))


def test_a_decode_out_of_slack_moves_and_its_blocks_wait_for_the_ack(tmp_path):
    cfg = hybrid_cfg(tmp_path, hybrid_layout=1)
    blocks, outbox = BlockManager(64, 4), queue.Queue()
    migration = Migration(cfg, 0, blocks.num_total_blocks)
    try:
        worker = DecodeWorker(StepRunner(), blocks, None, None, outbox, timeout_s=30.0, run=cfg,
                              token_budget=32, migration=migration)  # fmt: skip
        worker.publish = lambda: None
        params = SamplingParams(max_tokens=50)
        text = SimpleNamespace(push=lambda t: ("x", False), flush=lambda: "", sent=5)

        def running(key: int, tpot_slo_s: float) -> Stream:
            h = Handoff(KIND_GENERATE, GenerateParams(sampling=params, request_id=f"r{key}"),
                        prompt_ids=[1, 2, 3, 4, 5], tpot_slo_s=tpot_slo_s)  # fmt: skip
            seq = Sequence([1, 2, 3, 4, 5, 9], params, seq_id=key, num_prompt_tokens=5,
                           num_computed_tokens=5)  # fmt: skip
            s = Stream(key, h, seq=seq, text=text, first_sent=True, first_token_s=time.time())
            worker.streams[key] = s
            worker.scheduler.add(seq)
            return s

        running(1, tpot_slo_s=1e-6)  # no step meets this
        running(2, tpot_slo_s=100.0)
        worker.iterate()  # admits both (one step: each decodes a token)
        free_before = blocks.num_free_blocks
        worker.iterate()  # the first is out of slack now: it moves before the step
        items = []
        while not outbox.empty():
            items.append(outbox.get_nowait())
        moved = [d for d in items if d.finish_reason == MIGRATED]
        assert [d.key for d in moved] == [1] and worker.budget == 2048
        h = moved[0].handoff
        assert (h.source_role, h.prefill_index, h.decode_index) == ("decode", 0, 1)
        assert h.output_ids == [9, 7] and h.text_sent == 5 and h.migrations == 1
        assert [s.seq_id for s in worker.scheduler.running] == [2]
        assert blocks.num_free_blocks < free_before + len(h.block_ids)  # held for the peer
        held = blocks.num_free_blocks
        peer = HandoffTable.open(shm_name(cfg.run_id, "decode", 0, "ho"))
        assert peer.ack(h.handoff_id)
        peer.close()
        worker.iterate()
        assert blocks.num_free_blocks >= held + len(h.block_ids) - 1  # freed after the ack
    finally:
        migration.close()
