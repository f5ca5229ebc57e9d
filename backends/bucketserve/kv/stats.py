"""Per-engine-instance stats in shared memory, written by the engine, read by the monitor."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, fields
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from bucketserve.kv import shm

_MAGIC = 0x42535354415453  # "BSSTATS"
_VERSION = 2
_HEADER_WORDS = 4  # magic, version, seq, reserved
_READ_TIMEOUT_S = 1.0  # a writer stuck mid-update this long has died while publishing


@dataclass(slots=True, frozen=True)
class InstanceStatsSnapshot:
    """One consistent reading of an engine instance's stats block."""

    total_blocks: int = 0
    free_blocks: int = 0
    block_size: int = 0
    running: int = 0
    waiting: int = 0
    step_latency_ema_s: float = 0.0
    tokens_processed: int = 0  # monotonic
    kv_bytes_per_token: int = 0
    heartbeat: float = 0.0  # writer's time.time() at its last publish; 0 = never published
    pending_handoffs: int = 0
    num_received: int = 0  # requests this instance has taken in (monotonic)
    prefill_backlog: int = 0  # prompt tokens queued or running here whose KV is not yet computed


_FIELDS = tuple(f.name for f in fields(InstanceStatsSnapshot))
_FLOATS = frozenset(f.name for f in fields(InstanceStatsSnapshot) if f.type == "float")
_INDEX = {name: i for i, name in enumerate(_FIELDS)}


class StatsBlock:
    """Seqlock-protected record: one writer (the engine), any number of cheap readers."""

    __slots__ = ("name", "_owner", "_words", "_values", "_lock")

    def __init__(self, name: str, words: np.ndarray, owner: SharedMemory | None):
        self.name, self._words, self._owner = name, words, owner
        self._values = words[_HEADER_WORDS:].copy()  # writer's staged record (int64 bit patterns)
        self._lock = threading.Lock()  # the seqlock allows one writer: serialise writer threads

    @classmethod
    def create(cls, name: str) -> StatsBlock:
        """Create the block (engine side), all fields zero."""
        nbytes = 8 * (_HEADER_WORDS + len(_FIELDS))
        owner = shm.create_segment(name, nbytes, f"stats block {name!r}")
        words = np.frombuffer(shm.map_segment(name, nbytes), dtype=np.int64)
        words[1] = _VERSION
        shm.full_fence()
        words[0] = _MAGIC  # last: openers treat a block without magic as not yet created
        return cls(name, words, owner)

    @classmethod
    def open(cls, name: str) -> StatsBlock:
        """Open an engine's block by name (reader side); FileNotFoundError if not created yet."""
        try:
            words = np.frombuffer(shm.map_segment(name), dtype=np.int64)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"stats block {name!r} not found in {shm.SHM_DIR}: the engine instance has not "
                "started yet (or has exited); retry after it creates the block"
            ) from None
        if words.size < _HEADER_WORDS + len(_FIELDS) or int(words[0]) != _MAGIC:
            raise FileNotFoundError(f"stats block {name!r} exists but is not initialised yet")
        if int(words[1]) != _VERSION:
            raise ValueError(f"stats block {name!r} has version {int(words[1])}, need {_VERSION}")
        return cls(name, words, None)

    def publish(self, **values: float) -> None:
        """Update the given fields (others keep their value) and stamp heartbeat unless given."""
        if self._owner is None:
            raise RuntimeError(
                f"publish() is for the engine that created stats block {self.name!r}"
            )
        values.setdefault("heartbeat", time.time())
        with self._lock:
            staged = self._values.copy()
            for name, value in values.items():
                self._stage(staged, name, value)
            seq = int(self._words[2])
            self._words[2] = seq + 1  # odd: update in progress
            shm.full_fence()
            self._store(staged)
            shm.full_fence()
            self._words[2] = seq + 2
            self._values = staged

    def read(self) -> InstanceStatsSnapshot:
        """Return a consistent snapshot, retrying while the writer is mid-update."""
        deadline = time.monotonic() + _READ_TIMEOUT_S
        while True:
            seq = int(self._words[2])
            shm.full_fence()
            raw = self._words[_HEADER_WORDS:].copy()
            shm.full_fence()
            if seq % 2 == 0 and int(self._words[2]) == seq:
                return _snapshot(raw)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"stats block {self.name!r} stayed mid-update for {_READ_TIMEOUT_S}s: "
                    "its writer died while publishing"
                )
            time.sleep(0)  # let a descheduled writer finish

    def close(self) -> None:
        """Drop this process's mapping (the block stays for other processes)."""
        self._words = None  # the last view gone unmaps the block

    def unlink(self) -> None:
        """Remove the block's name (engine, at shutdown)."""
        if self._owner is None:
            raise RuntimeError(f"unlink() is for the engine that created stats block {self.name!r}")
        self._owner.unlink()

    def _store(self, staged: np.ndarray) -> None:
        self._words[_HEADER_WORDS:] = staged

    @staticmethod
    def _stage(staged: np.ndarray, name: str, value: float) -> None:
        i = _INDEX.get(name)
        if i is None:
            raise ValueError(f"unknown stats field {name!r}; fields are {_FIELDS}")
        if name in _FLOATS:
            staged.view(np.float64)[i] = float(value)
            return
        if int(value) < 0:
            raise ValueError(f"{name}={value} must be >= 0")
        if name == "tokens_processed" and int(value) < int(staged[i]):
            raise ValueError(f"tokens_processed={value} must not decrease (was {int(staged[i])})")
        staged[i] = int(value)


def _snapshot(raw: np.ndarray) -> InstanceStatsSnapshot:
    floats = raw.view(np.float64)
    return InstanceStatsSnapshot(
        **{n: float(floats[i]) if n in _FLOATS else int(raw[i]) for n, i in _INDEX.items()}
    )
