"""Decoupled BLS calls that never leave a response iterator's last reference to the stub.

The Triton 2.51 stub keeps every decoupled BLS response iterator in a map until its utils thread
handles the iterator's cleanup message, and that thread erases the entry without holding the GIL
(`Stub::SendCleanupId`, checked in the 2.51 stub binary). If the model has already dropped its
own reference, the erase runs `~ResponseIterator` there: it frees every response the iterator
returned, and with them their numpy arrays, without the GIL. That corrupts the Python heap of a
stub that runs other threads: `bucketserve_bls` died with SIGSEGV in `pymalloc_alloc` (core dump
from a soak), numpy reported "Reference count error detected: an attempt was made to deallocate
the dtype 17 (O)", and corrupted shared memory then killed tritonserver itself (SIGSEGV and
std::bad_alloc in libtriton_python.so, on a loaded 2-prefill/2-decode test server).
docs/platform-notes.md#p23-bls-iterator-freed-without-the-gil

The cleanup message is queued when the iterator reads its last response, on the same FIFO queue
and the same thread that answer `is_cancelled()`. So once a stream is read to its end, one
`is_cancelled()` round trip (the `barrier`) proves the stub has erased its entry, and dropping ours
afterwards runs the destructor here, with the GIL. Where no round trip is possible (the request
is already cancelled: the stub answers that from a cache; or its FINAL was sent) the iterator is
held `BUCKETSERVE_BLS_KEEP_S` seconds instead, which also kept the stub alive in soaks.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterator

KEEP_S = float(os.environ.get("BUCKETSERVE_BLS_KEEP_S", "1"))  # without a barrier (see above)


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


def decoupled_responses(
    request, barrier: Callable[[], bool] | None = None, keeper: IteratorKeeper = KEEPER
) -> Iterator:
    """`request.exec(decoupled=True)` as a generator. However the caller stops, the iterator is
    read to its end in the caller's thread (its destructor would otherwise block to do so, in
    whichever thread drops it). Then `barrier()` (True: the stub's utils queue was passed) lets
    this thread drop it; otherwise it goes to `keeper`."""
    responses = request.exec(decoupled=True)
    try:
        yield from responses
    finally:
        for _ in responses:  # after the last response: the stored ones again, then the end
            pass
        if barrier is None or not barrier():
            keeper.keep(responses)
