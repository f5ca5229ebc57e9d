"""Process bookkeeping for supervision: subreaper, parent-death signals, stub discovery, shm sweep.

When tritonserver dies its Python stubs may live on as orphans (docs/platform-notes.md#p18-orphaned-stubs).
Three layers stop that: the launcher is a child subreaper (orphans come back to it, not to pid 1, and it kills
them), tritonserver gets SIGKILL when the launcher dies (PR_SET_PDEATHSIG survives the exec of
tritonserver itself), and every stub starts a watchdog that kills it once its parent is gone (the death
signal does not reach the stubs: Triton forks them, and the setting is cleared on fork).
"""

from __future__ import annotations

import ctypes
import glob
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
STUB_NAME = "triton_python_backend_stub"
PARENT_POLL_S = 1.0
TRITON_COMM = "tritonserver"
RUN_CONFIG_ENV = "BUCKETSERVE_RUN_CONFIG"  # set for tritonserver and its stubs by the launcher


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")


def become_subreaper() -> None:
    """Orphaned descendants (stubs of a dead tritonserver) are re-parented to this process."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


# Runs in the child, before it becomes the real program: set the death signal, then make sure
# the parent did not die before that (the signal would never come), then exec in place (same pid).
_DIE_WITH_PARENT_PY = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\n"  # PR_SET_PDEATHSIG, SIGKILL
    "os.getppid() == int(sys.argv[1]) or os._exit(137)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def die_with_parent(argv: list[str]) -> list[str]:
    """`argv` run so that it gets SIGKILL when the thread that starts it exits.

    Through a small exec wrapper, not a Popen `preexec_fn`: Python code between fork and exec
    in a process with other threads can crash or deadlock the child (seen: tritonserver
    "exited (-11)" with an empty log, started by a test process whose gRPC client threads
    were busy). PR_SET_PDEATHSIG survives the exec; the pid stays the child's.
    """
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT_PY, str(os.getpid()), *argv]


# Reads the stub's parent from /proc: a pid number alone could be reused by a new process.
WATCHDOG_SH = (
    'while read -r _ _ _ pp _ < /proc/$1/stat && [ "$pp" = "$2" ]; do sleep $3; done 2>/dev/null;'
    " kill -9 $1 2>/dev/null"
)


def exit_when_orphaned(poll_s: float = PARENT_POLL_S) -> None:
    """Start a watchdog that SIGKILLs this process once its parent (tritonserver) is gone.

    A separate `sh` process, not a thread: a stub stuck in finalize can hold the GIL forever
    (seen: orphaned decode/prefill stubs of a server that died while unloading). A stub of a
    run whose tritonserver is already gone when it gets here dies at once: seen, a decode stub
    stopped (SIGSTOP) while loading, its server killed meanwhile, resumed as an orphan of pid 1
    and watching pid 1 forever.
    """
    if os.environ.get(RUN_CONFIG_ENV) and not is_tritonserver(os.getppid()):
        os.kill(os.getpid(), signal.SIGKILL)
    me, parent = str(os.getpid()), str(os.getppid())
    subprocess.Popen(
        ["/bin/sh", "-c", WATCHDOG_SH, "bucketserve-stub-watchdog", me, parent, str(poll_s)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def is_tritonserver(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == TRITON_COMM
    except OSError:
        return False


@dataclass(slots=True, frozen=True)
class Stub:
    """One Python-backend stub process: its pid and the model instance it serves."""

    pid: int
    instance: str  # e.g. "decode_0_0"


def stubs_of(server_pid: int) -> list[Stub]:
    """The stub processes tritonserver `server_pid` has started, named by model instance."""
    try:
        children = psutil.Process(server_pid).children()
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if cmd and cmd[0].endswith(STUB_NAME):
            found.append(Stub(child.pid, stub_instance(cmd)))
    return found


def stub_instance(cmdline: list[str]) -> str:
    """The model instance name in a stub's argv (argv[8] in Triton 2.51), else the model path."""
    if len(cmdline) > 8 and cmdline[8]:
        return cmdline[8]
    return Path(cmdline[1]).parent.parent.name if len(cmdline) > 1 else "?"


def is_alive(pid: int) -> bool:
    """Running and not a zombie (a dead stub stays a zombie until tritonserver reaps it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_tree(pgid: int, extra_pids: list[int]) -> None:
    """SIGKILL the server's process group and any stub that left it (reaping is the caller's)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in extra_pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def reap_children() -> None:
    """Collect exit statuses of orphans re-parented to us (we are a subreaper), never blocking."""
    for child in psutil.Process().children():
        if child.status() == psutil.STATUS_ZOMBIE:
            try:
                os.waitpid(child.pid, os.WNOHANG)
            except ChildProcessError:
                pass


def mapped_shm_names() -> set[str]:
    """Names of /dev/shm files mapped by any process we can inspect (for the leftover sweep)."""
    names = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            text = Path(maps).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            i = line.find("/dev/shm/")
            if i >= 0:
                names.add(line[i + len("/dev/shm/") :].removesuffix(" (deleted)"))
    return names
