"""POSIX shared-memory segments: create with a /dev/shm space check, map by name, unlink."""

from __future__ import annotations

import mmap
import os
import threading
from multiprocessing.shared_memory import SharedMemory

SHM_DIR = "/dev/shm"
_FENCE_LOCK = threading.Lock()


class ShmSpaceError(RuntimeError):
    """/dev/shm has too little free space for a segment we were asked to create."""


def shm_free_bytes() -> int:
    """Return the bytes an unprivileged process may still allocate in /dev/shm."""
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def check_shm_space(nbytes: int, what: str) -> None:
    """Raise ShmSpaceError naming requested bytes, free bytes and the fix if nbytes do not fit.

    Docker's /dev/shm is 64 MiB by default:
    docs/platform-notes.md#p33-dockers-small-shared-memory
    """
    free = shm_free_bytes()
    if nbytes > free:
        raise ShmSpaceError(
            f"{what} needs {nbytes} bytes ({nbytes / 2**30:.2f} GiB) of shared memory but "
            f"{SHM_DIR} has only {free} bytes ({free / 2**30:.2f} GiB) free. Enlarge {SHM_DIR} "
            "(docker run --shm-size=16g, or `shm_size: 16gb` in the compose service; Docker's "
            "default is 64 MiB) or shrink the pool (fewer KV blocks)."
        )


def create_segment(name: str, nbytes: int, what: str) -> SharedMemory:
    """Create a zeroed segment, replacing a stale one of the same name; the caller unlinks it."""
    if nbytes <= 0:
        raise ValueError(f"nbytes={nbytes} must be > 0")
    unlink_stale(name)
    check_shm_space(nbytes, what)
    # Tracked by this (owner) process's resource_tracker: if the owner dies, the tracker unlinks
    # the segment; peers that mapped it keep their mapping.
    shm = SharedMemory(name=name, create=True, size=nbytes)
    shm.close()  # we map by path ourselves (see map_segment); keep the object for unlink()
    fd = os.open(_path(name), os.O_RDWR)
    try:
        # Reserve the pages now: on tmpfs a full /dev/shm otherwise shows up later as SIGBUS.
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        shm.unlink()
        raise ShmSpaceError(f"{what}: cannot reserve {nbytes} bytes in {SHM_DIR}: {e}") from e
    finally:
        os.close(fd)
    return shm


def map_segment(name: str, nbytes: int | None = None, whole: bool = False) -> mmap.mmap:
    """Map an existing segment read-write; the mapping lives as long as the returned object.
    `whole`: every page mapped now (`populate`), as KV pools are."""
    # Mapping by path (not SharedMemory(name)) keeps openers out of CPython's resource_tracker,
    # which would otherwise unlink the owner's segment when an opener exits (cpython#82300).
    try:
        fd = os.open(_path(name), os.O_RDWR)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"shared-memory segment {name!r} does not exist ({_path(name)}): its owner has not "
            "created it yet, or has exited"
        ) from None
    try:
        size = os.fstat(fd).st_size
        if size == 0:  # shm_open done, ftruncate not yet: the owner is still creating it
            raise FileNotFoundError(f"shared-memory segment {name!r} is still being created")
        if nbytes is not None and size < nbytes:
            raise ValueError(f"segment {name!r} has {size} bytes, expected at least {nbytes}")
        mapping = mmap.mmap(fd, size if nbytes is None else nbytes)
    finally:
        os.close(fd)
    if whole:
        populate(mapping)
    return mapping


MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14


def populate(mapping: mmap.mmap) -> None:
    """Map every page of `mapping` into this process now, without changing its bytes.

    A KV pool's pages are reserved at creation (posix_fallocate) but enter a process's page
    tables one fault at a time, the first time a request uses each block: RSS then climbs for
    minutes of serving (prefill 94 -> 512 MB, decode 184 -> 1,024 MB in a soak) though nothing
    was allocated, and the faults land on serving steps. Mapping it all at start makes RSS
    say what the pool costs from the first request on
    (docs/platform-notes.md#p31-shared-memory-pages-fault-in-lazily)."""
    try:
        mapping.madvise(MADV_POPULATE_WRITE)
    except OSError:  # an older kernel: read one byte per page instead
        bytes(memoryview(mapping)[:: mmap.PAGESIZE])


def unlink_stale(name: str) -> bool:
    """Unlink a leftover segment of this name (e.g. from a crashed run); True if one existed."""
    try:
        os.unlink(_path(name))
    except FileNotFoundError:
        return False
    return True


def full_fence() -> None:
    """Order this process's earlier shared-memory stores before its later loads."""
    # numpy loads/stores carry no ordering; an uncontended lock acquire+release is an atomic
    # read-modify-write pair, a full barrier on x86 and a release/acquire pair on ARMv8.
    _FENCE_LOCK.acquire()
    _FENCE_LOCK.release()


def _path(name: str) -> str:
    if not name or "/" in name:
        raise ValueError(f"shm name {name!r} must be non-empty and contain no '/'")
    return os.path.join(SHM_DIR, name)
