"""Prefill->decode hand-off ownership: ack, timeout reclaim, no ABA, no block returned twice."""

from __future__ import annotations

import os

import pytest
from bucketserve.kv.handoff import HandoffTable
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.unit.kv.kv_workers import ShmNames

NUM_BLOCKS = 8
TIMEOUT_S = 10.0


@pytest.fixture
def tables(names):
    producer = HandoffTable.create(names("ho"), NUM_BLOCKS, TIMEOUT_S)
    consumer = HandoffTable.open(producer.name)
    yield producer, consumer
    consumer.close()
    producer.close()
    producer.unlink()


def test_ack_then_reclaim_returns_blocks_once(tables):
    producer, consumer = tables
    hid = producer.publish([3, 5], now=0.0)
    assert producer.num_pending == 1 and producer.num_pending_blocks == 2
    assert producer.reclaim(now=1.0) == []  # neither acked nor expired
    assert consumer.ack(hid) is True
    assert sorted(producer.reclaim(now=1.0)) == [3, 5]
    assert producer.reclaim(now=100.0) == []
    assert producer.num_pending == 0 and producer.num_acked == 1


def test_timeout_reclaims_unpulled_blocks(tables):
    producer, consumer = tables
    producer.publish([1], now=0.0)
    hid = producer.publish([2, 4], now=5.0)
    assert producer.reclaim(now=TIMEOUT_S - 0.01) == []
    assert producer.reclaim(now=TIMEOUT_S) == [1]  # deadline is inclusive
    assert sorted(producer.reclaim(now=5.0 + TIMEOUT_S)) == [2, 4]
    assert producer.num_expired == 2 and producer.num_pending == 0
    assert consumer.ack(hid) is False  # late ack: harmless and detectable


def test_double_ack_is_idempotent(tables):
    producer, consumer = tables
    hid = producer.publish([0], now=0.0)
    assert consumer.ack(hid) is True
    assert consumer.ack(hid) is True
    assert producer.reclaim(now=0.0) == [0]
    assert consumer.ack(hid) is True  # still True after the producer reclaimed it as acked
    assert producer.reclaim(now=0.0) == []


def test_late_ack_cannot_release_a_reused_slot(names):
    producer = HandoffTable.create(names("ho"), 1, TIMEOUT_S)  # one slot: reused every time
    consumer = HandoffTable.open(producer.name)
    old = producer.publish([0], now=0.0)
    assert producer.reclaim(now=TIMEOUT_S) == [0]  # expired
    new = producer.publish([0], now=TIMEOUT_S)
    assert new != old
    assert consumer.ack(old) is False  # ABA: the old id does not ack the new hand-off
    assert producer.reclaim(now=TIMEOUT_S + 1) == []
    assert consumer.ack(new) is True
    assert producer.reclaim(now=TIMEOUT_S + 1) == [0]
    consumer.close()
    producer.unlink()


def test_cached_prefix_blocks_may_be_pending_in_several_handoffs(tables):
    """Prefix caching shares blocks: each hand-off holds its own reference, returned once per
    hand-off; only the declared shared prefix may overlap another pending hand-off."""
    producer, consumer = tables
    first = producer.publish([1, 2, 3], now=0.0)
    second = producer.publish([1, 2, 4], now=0.0, num_shared=2)
    with pytest.raises(ValueError, match="already pending"):
        producer.publish([1, 3], now=0.0, num_shared=1)  # 3 is not a shared prefix block
    assert producer.num_pending_blocks == 4
    assert consumer.ack(first) is True
    assert producer.reclaim(now=1.0) == [1, 2, 3]
    assert producer.num_pending_blocks == 3  # 1 and 2 still held by the second
    assert producer.reclaim(now=TIMEOUT_S) == [1, 2, 4] and producer.num_pending_blocks == 0
    assert consumer.ack(second) is False


def test_publish_and_ack_validate(tables):
    producer, consumer = tables
    with pytest.raises(ValueError, match="must not be empty"):
        producer.publish([], now=0.0)
    with pytest.raises(ValueError, match=r"must be in \[0, 8\)"):
        producer.publish([8], now=0.0)
    producer.publish([1, 2], now=0.0)
    with pytest.raises(ValueError, match="already pending"):
        producer.publish([2], now=0.0)
    with pytest.raises(ValueError, match="repeats"):
        producer.publish([3, 3], now=0.0)
    with pytest.raises(ValueError, match="never published"):
        consumer.ack(5 * NUM_BLOCKS)
    with pytest.raises(RuntimeError, match="producer"):
        consumer.publish([4], now=0.0)
    with pytest.raises(RuntimeError, match="producer"):
        consumer.reclaim(now=0.0)


def test_create_validates_and_open_needs_table(names):
    with pytest.raises(ValueError, match="num_blocks"):
        HandoffTable.create(names("a"), 0, 1.0)
    with pytest.raises(ValueError, match="timeout_s"):
        HandoffTable.create(names("b"), 4, 0.0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        HandoffTable.open(names("missing"))
    with open(f"/dev/shm/{names('blank')}", "wb") as f:
        f.write(bytes(64))  # created but not yet initialised
    with pytest.raises(FileNotFoundError, match="not initialised"):
        HandoffTable.open(names.made[-1])


def test_unlink_removes_name(names):
    producer = HandoffTable.create(names("ho"), 2, 1.0)
    producer.close()
    producer.unlink()
    assert not os.path.exists(f"/dev/shm/{producer.name}")


# One step of a random schedule: (op, choice, dt); op 0 publish, 1 ack, 2 reclaim, 3 stale ack.
# Time moves by nothing, a little, or a whole timeout, so expiry and slot reuse happen often.
_steps = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 1000), st.sampled_from([0.0, 1.5, TIMEOUT_S])),
    min_size=10,
    max_size=80,
)
# Expire, reuse the slot, then ack the old id: the stale ack must not release the new hand-off.
_ABA = [(0, 0, 0.0), (2, 0, TIMEOUT_S), (0, 0, 0.0), (3, 0, 0.0), (2, 0, 0.0)]


@settings(max_examples=200, deadline=None)
@example(steps=_ABA, num_blocks=1)
@given(steps=_steps, num_blocks=st.integers(1, 5))
def test_random_schedules_never_return_a_block_twice(steps, num_blocks):
    made = ShmNames()
    producer = HandoffTable.create(made("hp"), num_blocks, TIMEOUT_S)
    consumer = HandoffTable.open(producer.name)
    try:
        _run_schedule(producer, consumer, steps, num_blocks)
    finally:
        consumer.close()
        producer.unlink()
        made.cleanup()


def _run_schedule(producer, consumer, steps, num_blocks):
    free = set(range(num_blocks))  # stands in for the block manager, the owner of block ids
    live: dict[int, tuple[list[int], float]] = {}  # handoff id -> (blocks, deadline), unreclaimed
    acked: set[int] = set()
    expired: set[int] = set()
    seen: list[int] = []
    now = 0.0
    for op, choice, dt in steps:
        now += dt
        if op == 0 and free:
            blocks = sorted(free)[: 1 + choice % len(free)]
            free.difference_update(blocks)
            hid = producer.publish(blocks, now)
            assert hid not in seen  # ids are never reused
            seen.append(hid)
            live[hid] = (blocks, now + TIMEOUT_S)
        elif op == 1 and live:
            hid = sorted(live)[choice % len(live)]
            assert consumer.ack(hid) is True  # not reclaimed yet, so never expired
            acked.add(hid)
        elif op == 2:
            returned = producer.reclaim(now)
            assert len(returned) == len(set(returned)) and not free.intersection(returned)
            due = {h for h, (_, deadline) in live.items() if h in acked or now >= deadline}
            assert sorted(returned) == sorted(b for h in due for b in live[h][0])
            for h in due:
                del live[h]
            expired.update(due - acked)
            free.update(returned)
        elif op == 3 and seen:
            hid = seen[choice % len(seen)]  # any id, often one already reclaimed
            ok = consumer.ack(hid)
            assert not (hid in expired and ok)  # an expired hand-off never acks as good
            if hid in live:
                acked.add(hid)
    free.update(producer.reclaim(now + TIMEOUT_S))
    assert free == set(range(num_blocks)) and producer.num_pending == 0
