"""Decoupled BLS iterators: read to the end, then dropped after a barrier or held (Triton 2.51 stub)."""

from __future__ import annotations

import weakref

import pytest
from bucketserve.serving.core.bls_stream import IteratorKeeper, decoupled_responses


class FakeIterator:
    """Stands in for pb_utils' ResponseIterator: responses, then StopIteration."""

    def __init__(self, items) -> None:
        self.items, self.read = list(items), 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.read >= len(self.items):
            raise StopIteration
        self.read += 1
        return self.items[self.read - 1]


class FakeRequest:
    def __init__(self, items) -> None:
        self.iterator = FakeIterator(items)

    def exec(self, decoupled: bool):
        assert decoupled
        return self.iterator


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_keeper_holds_an_iterator_for_keep_s_then_drops_it_on_a_later_keep():
    clock = Clock()
    keeper = IteratorKeeper(keep_s=5.0, clock=clock)
    first = FakeIterator([])
    gone = weakref.ref(first)
    keeper.keep(first)
    del first
    clock.now = 4.9
    keeper.keep(FakeIterator([]))
    assert gone() is not None  # still ours: the stub's utils thread may not have erased it
    clock.now = 5.0
    keeper.keep(FakeIterator([]))
    assert gone() is None  # dropped by this thread, not by the stub's
    assert len(keeper) == 2


def test_keeper_with_no_delay_drops_at_once():
    keeper = IteratorKeeper(keep_s=0.0, clock=Clock())
    keeper.keep(FakeIterator([]))
    assert len(keeper) == 0


def test_a_stream_read_to_the_end_is_kept():
    keeper = IteratorKeeper(keep_s=5.0, clock=Clock())
    request = FakeRequest(["a", "b"])
    assert list(decoupled_responses(request, keeper=keeper)) == ["a", "b"]
    assert len(keeper) == 1 and keeper.held[0][1] is request.iterator


def test_a_consumer_that_stops_early_still_reads_the_stream_to_its_end():
    keeper = IteratorKeeper(keep_s=5.0, clock=Clock())
    request = FakeRequest(["a", "b", "c"])
    stream = decoupled_responses(request, keeper=keeper)
    assert next(stream) == "a"
    stream.close()  # what a `return` inside the caller's for loop does
    assert request.iterator.read == 3
    assert len(keeper) == 1


def test_a_consumer_that_raises_still_hands_the_iterator_over():
    keeper = IteratorKeeper(keep_s=5.0, clock=Clock())
    request = FakeRequest(["a", "b"])
    with pytest.raises(RuntimeError):
        for _ in decoupled_responses(request, keeper=keeper):
            raise RuntimeError("client gone")
    assert request.iterator.read == 2 and len(keeper) == 1


def test_after_a_barrier_the_iterator_is_dropped_here_not_kept():
    keeper = IteratorKeeper(keep_s=5.0, clock=Clock())
    request = FakeRequest(["a", "b", "c"])
    gone = weakref.ref(request.iterator)
    seen = []

    def barrier() -> bool:
        seen.append(gone().read)  # the stream was read to its end first
        return True

    stream = decoupled_responses(request, barrier, keeper)
    assert next(stream) == "a"
    del request.iterator
    stream.close()
    assert seen == [3] and len(keeper) == 0
    assert gone() is None  # the last reference went in this thread


def test_a_failed_barrier_falls_back_to_the_keeper():
    keeper = IteratorKeeper(keep_s=5.0, clock=Clock())
    request = FakeRequest(["a"])
    assert list(decoupled_responses(request, lambda: False, keeper)) == ["a"]
    assert len(keeper) == 1
