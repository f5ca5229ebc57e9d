"""A response sender that other threads may poll for cancellation, safely after its FINAL.

Asking Triton 2.51 whether a request is cancelled after its FINAL response was sent reads a
freed response factory: under soak load (10 % client cancellations) `tritonserver` died with
SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled, and a decode stub with SIGSEGV. Watcher
threads (bucketserve_bls' cancel watcher, decode's cancel_gone) race the FINAL send; this
wrapper orders them: after FINAL, is_cancelled() answers False without asking Triton.
docs/platform-notes.md#p24-cancellation-poll-after-final
"""

from __future__ import annotations

import threading

FINAL_FLAG = 1  # pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL (kept import-free for tests)


class GuardedSender:
    """Wraps pb_utils' InferenceResponseSender: same send / is_cancelled calls."""

    __slots__ = ("sender", "lock", "done", "packed")

    def __init__(self, sender, packed: bool = False) -> None:
        self.sender = sender
        self.lock = threading.Lock()
        self.done = False
        self.packed = packed  # decode: the caller (a relay) asked for contract.PACKED_OUTPUT

    def send(self, response=None, flags: int = 0) -> None:
        if not flags & FINAL_FLAG:
            self.sender.send(response, flags=flags)
            return
        with self.lock:  # no is_cancelled() may run during or after the FINAL send
            self.done = True
            self.sender.send(response, flags=flags)

    def is_cancelled(self) -> bool:
        with self.lock:
            return not self.done and self.sender.is_cancelled()

    def barrier(self) -> bool:
        """True when an is_cancelled() round trip through the stub's utils queue completed just
        now (see bls_stream): not after FINAL, and not once cancelled (the stub then answers
        from its cache without asking). The lock also waits out a watcher's query in flight."""
        with self.lock:
            return not self.done and not self.sender.is_cancelled()
