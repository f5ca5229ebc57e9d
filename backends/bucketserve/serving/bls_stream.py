"""Decoupled BLS calls whose response iterators are destroyed under the GIL (Triton 2.51 stub).

The stub keeps every decoupled BLS response iterator in a map until its utils thread handles
the iterator's cleanup message, and that thread erases the entry without holding the GIL
(`Stub::SendCleanupId`, python_backend r24.10). If the model has already dropped its own
reference, the erase runs `~ResponseIterator` there: it frees every response the iterator
returned, and with them their numpy arrays, without the GIL. That corrupts the Python heap of
a stub that runs other threads; `bucketserve_bls` then died with SIGSEGV in `pymalloc_alloc`
under `InferRequest::Exec` (core dump from a soak; docs/architecture.md). Keeping our reference
for a few seconds after the stream ended makes Python the last owner, so the destructor runs
in a Python thread, with the GIL held.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator

KEEP_S = 5.0  # the utils thread erases an entry within milliseconds; seconds leave margin


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
