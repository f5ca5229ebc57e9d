"""Decoupled BLS calls, and a keeper that can outlive the Triton 2.51 stub's own reference.

The stub keeps every decoupled BLS response iterator in a map until its utils thread handles
the iterator's cleanup message, and that thread erases the entry without holding the GIL
(`Stub::SendCleanupId`, checked in the 2.51 stub binary). If the model has already dropped its
own reference, the erase runs `~ResponseIterator` there: it frees every response the iterator
returned, and with them their numpy arrays, without the GIL. That corrupts the Python heap of
a stub that runs other threads: `bucketserve_bls` died with SIGSEGV in `pymalloc_alloc` under
`InferRequest::Exec` (core dump from a soak). Holding our reference `keep_s` seconds after the
stream ended makes Python the last owner. Measured: with a hold (5 s or 0.5 s) the stub never
died in 2,400 s of soak at 2x capacity (without: about one death per 3 minutes), but streams then
lost their last response or hung, in bursts (up to 100 of ~3,000 requests in 10 minutes), which
is worse than a death the supervisor turns into clean errors. So the hold is off by default
(`BUCKETSERVE_BLS_KEEP_S`, seconds) until that is understood (issue 13).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterator

KEEP_S = float(os.environ.get("BUCKETSERVE_BLS_KEEP_S", "0"))  # 0: drop at once (see above)


class IteratorKeeper:
    """Holds finished iterators for `keep_s`; expired ones are dropped by the next `keep` call."""

    def __init__(self, keep_s: float = KEEP_S, clock: Callable[[], float] = time.monotonic):
        self.keep_s, self.clock = keep_s, clock
        self.held: collections.deque = collections.deque()  # (release time, iterator)
        self.lock = threading.Lock()

    def keep(self, iterator) -> None:
        now = self.clock()
        expired = []
        with self.lock:
            self.held.append((now + self.keep_s, iterator))
            while self.held and self.held[0][0] <= now:
                expired.append(self.held.popleft()[1])
        del expired  # the last references go here, in a Python thread (GIL held)

    def __len__(self) -> int:
        return len(self.held)

    def clear(self) -> None:
        with self.lock:
            self.held.clear()


KEEPER = IteratorKeeper()


def decoupled_responses(request, keeper: IteratorKeeper = KEEPER) -> Iterator:
    """`request.exec(decoupled=True)` as a generator. However the caller stops, the iterator is
    read to its end in the caller's thread (its destructor would otherwise block to do so, in
    whichever thread drops it) and then handed to `keeper`."""
    responses = request.exec(decoupled=True)
    try:
        yield from responses
    finally:
        for _ in responses:  # after the last response: the stored ones again, then the end
            pass
        keeper.keep(responses)
