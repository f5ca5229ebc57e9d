"""GuardedSender: no is_cancelled() reaches Triton during or after the FINAL send."""

from __future__ import annotations

import threading
import time

from bucketserve.serving.models.guarded_sender import FINAL_FLAG, GuardedSender


class RecordingSender:
    """Records calls; a FINAL send takes a while, so a racing poll would land inside it."""

    def __init__(self) -> None:
        self.final_sent = False
        self.polls_after_final = 0
        self.sent: list[int] = []

    def send(self, response=None, flags=0):
        if flags & FINAL_FLAG:
            time.sleep(0.05)
            self.final_sent = True
        self.sent.append(flags)

    def is_cancelled(self) -> bool:
        if self.final_sent:
            self.polls_after_final += 1  # what crashed tritonserver: a freed response factory
        return False


def test_polls_never_reach_triton_after_final():
    raw = RecordingSender()
    sender = GuardedSender(raw)
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            sender.is_cancelled()

    pollers = [threading.Thread(target=poll) for _ in range(4)]
    for t in pollers:
        t.start()
    sender.send("delta", flags=0)
    sender.send("last", flags=FINAL_FLAG)
    time.sleep(0.05)
    stop.set()
    for t in pollers:
        t.join()
    assert raw.sent == [0, FINAL_FLAG]
    assert raw.polls_after_final == 0
    assert sender.is_cancelled() is False


def test_cancellation_is_seen_before_final():
    raw = RecordingSender()
    raw.is_cancelled = lambda: True
    assert GuardedSender(raw).is_cancelled() is True


def test_barrier_is_a_round_trip_only_while_the_request_is_live_and_not_cancelled():
    raw = RecordingSender()
    sender = GuardedSender(raw)
    assert sender.barrier() is True  # asked Triton, got "not cancelled"
    raw.is_cancelled = lambda: True  # the stub caches True: later answers never ask
    assert sender.barrier() is False
    raw.is_cancelled = lambda: False
    sender.send("last", flags=FINAL_FLAG)
    assert sender.barrier() is False  # after FINAL nothing may ask
