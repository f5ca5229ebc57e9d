"""Engine stats block: publish/read, validation, seqlock against torn reads across processes."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest
from bucketserve.kv import stats as stats_mod
from bucketserve.kv.stats import InstanceStatsSnapshot, StatsBlock

from tests.unit.kv.kv_workers import read_stats


def test_publish_then_read_from_another_opener(names):
    writer = StatsBlock.create(names("st"))
    reader = StatsBlock.open(writer.name)
    assert reader.read() == InstanceStatsSnapshot()  # all zero before the first publish
    writer.publish(total_blocks=64, free_blocks=10, block_size=16, step_latency_ema_s=0.025)
    writer.publish(running=3, tokens_processed=100, heartbeat=123.5)
    s = reader.read()
    assert (s.total_blocks, s.free_blocks, s.block_size, s.running) == (64, 10, 16, 3)
    assert s.step_latency_ema_s == 0.025 and s.tokens_processed == 100 and s.heartbeat == 123.5
    writer.publish(waiting=1)
    assert reader.read().heartbeat > 123.5  # stamped with time.time() when not given
    reader.close()
    writer.close()
    writer.unlink()


def test_open_before_create_is_a_clear_file_not_found(names):
    with pytest.raises(FileNotFoundError, match="has not started yet"):
        StatsBlock.open(names("st"))


def test_publish_validates(names):
    writer = StatsBlock.create(names("st"))
    with pytest.raises(ValueError, match="unknown stats field 'free'"):
        writer.publish(free=3)
    with pytest.raises(ValueError, match="running=-1 must be >= 0"):
        writer.publish(running=-1)
    writer.publish(tokens_processed=10)
    with pytest.raises(ValueError, match="must not decrease"):
        writer.publish(tokens_processed=9)
    with pytest.raises(RuntimeError, match="engine that created"):
        StatsBlock.open(writer.name).publish(running=1)
    writer.unlink()


def test_reader_gives_up_on_a_writer_that_died_mid_update(names, monkeypatch):
    writer = StatsBlock.create(names("st"))
    writer._words[2] = 1  # odd sequence: an update that never finished
    monkeypatch.setattr(stats_mod, "_READ_TIMEOUT_S", 0.05)
    with pytest.raises(RuntimeError, match="mid-update"):
        StatsBlock.open(writer.name).read()
    writer.unlink()


class SlowStatsBlock(StatsBlock):
    """Writes the record one field at a time, yielding between, so unguarded reads would tear."""

    __slots__ = ()

    def _store(self, staged):
        for i, value in enumerate(staged):
            self._words[stats_mod._HEADER_WORDS + i] = value
            time.sleep(0)


def test_seqlock_reader_in_another_process_never_sees_torn_values(names):
    writer = SlowStatsBlock.create(names("st"))
    target = 2_000
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=read_stats, args=(writer.name, target, out))
    child.start()
    assert out.get(timeout=60) == "ready"
    for k in range(1, target + 1):  # every field carries k: a torn snapshot shows mixed values
        writer.publish(
            total_blocks=k, free_blocks=k, block_size=k, running=k, waiting=k,
            step_latency_ema_s=float(k), tokens_processed=k, heartbeat=float(k),
        )  # fmt: skip
    reads, torn, backwards = out.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert reads > 0 and torn == 0 and backwards == 0
    writer.unlink()


def test_concurrent_writer_threads_leave_a_readable_block(names):
    writer = StatsBlock.create(names("st"))
    threads = [
        threading.Thread(target=lambda: [writer.publish(running=i) for i in range(2000)])
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert writer._words[2] == 2 * 3 * 2000  # every update closed its sequence (even)
    assert StatsBlock.open(writer.name).read().running == 1999
    writer.unlink()


def test_block_being_created_reads_as_not_there_yet(names):
    """shm_open happened, ftruncate not yet: a reader polling at that moment (the scheduler at
    start-up) must see "not created yet", not an error that kills its thread."""
    import os

    from bucketserve.kv import shm

    name = names("st")
    fd = os.open(os.path.join(shm.SHM_DIR, name), os.O_CREAT | os.O_RDWR, 0o600)  # size 0
    os.close(fd)
    with pytest.raises(FileNotFoundError, match="still being created"):
        shm.map_segment(name)
    with pytest.raises(
        FileNotFoundError, match="has not started yet"
    ):  # what cluster.ready() retries
        StatsBlock.open(name)
    assert shm.unlink_stale(name)
    writer = StatsBlock.create(name)  # then created for real: opens fine
    assert StatsBlock.open(writer.name).read() == InstanceStatsSnapshot()
