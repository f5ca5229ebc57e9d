"""The engine's C++ CPU kernels (csrc/*.cpp), built once with torch's extension loader.

The build is tuned for the machine that runs it (-march=native), so the cache key includes
the CPU's feature flags as well as the sources, the flags and the torch version. The first
load compiles (56 s on 2 idle cores; `make setup` does it ahead of time); later loads only open the
cached library. Without a C++ compiler the engine falls back to torch ops (SDPA attention).

    python -m bucketserve.engine.cpu_ops     # build now and report
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCES = tuple(sorted(CSRC.glob("*.cpp")))  # cpu_ops.cpp registers the ops the others define
CFLAGS = (
    "-O3", "-march=native", "-fopenmp",
    # Let the compiler reorder float sums into vector lanes (dot products, softmax sums).
    "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math", "-fno-math-errno",
)  # fmt: skip
LDFLAGS = ("-fopenmp",)  # libgomp resolves to the copy torch already loaded (same soname)
STALE_LOCK_S = 300.0  # a build takes ~1 min on 2 cores; a lock this old belongs to a killed build
CACHE_ROOT = Path(os.environ.get("BUCKETSERVE_CACHE", Path.home() / ".cache" / "bucketserve"))

_loaded: bool | None = None
_error = ""


def _cpu_tag() -> str:
    """The CPU's feature flags (what -march=native compiles for)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def library_name() -> str:
    """Extension name unique to these sources, these flags, this torch and this CPU."""
    texts = [p.read_text() for p in sorted(CSRC.glob("*.[ch]*"))]  # .cpp and .h
    key = "\n".join([*texts, *CFLAGS, *LDFLAGS, torch.__version__, _cpu_tag()])
    return "bucketserve_cpu_ops_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def load() -> bool:
    """Register torch.ops.bucketserve.* (building on first use); False when unavailable."""
    global _loaded, _error
    if _loaded is None:
        try:
            _load_library()
            _loaded = True
        except Exception as e:  # no compiler, no ninja, compile error: fall back to torch ops
            _loaded, _error = False, f"{type(e).__name__}: {e}".strip()[:2000]
            log.warning("C++ CPU kernels unavailable, using torch ops instead: %s", _error)
    return _loaded


def unavailable_reason() -> str:
    """Why load() returned False ("" when it did not)."""
    return _error


def _load_library() -> None:
    name = library_name()
    build_dir = CACHE_ROOT / "torch_extensions" / name
    built = build_dir / f"{name}.so"
    if built.exists():  # cached: no compiler or ninja needed
        torch.ops.load_library(str(built))
        return
    log.info("building C++ CPU kernels into %s (once)", build_dir)
    build(name, SOURCES, build_dir)


def build(name: str, sources: Sequence[Path], build_dir: Path) -> None:
    """Compile and load `sources` as the op library `name`, past a lock a killed build left."""
    from torch.utils import cpp_extension

    try:  # the ninja wheel's binary, when PATH does not have one (e.g. inside Triton's stub)
        import ninja

        os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
    except ImportError:
        pass
    build_dir.mkdir(parents=True, exist_ok=True)
    lock = build_dir / "lock"  # torch's build lock; a killed build leaves it and later loads wait
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
        log.warning("removing a stale build lock %s", lock)
        lock.unlink(missing_ok=True)
    cpp_extension.load(
        # Copies: torch's loader appends to the flag lists it is given.
        name=name, sources=[str(p) for p in sources], extra_cflags=list(CFLAGS),
        extra_ldflags=list(LDFLAGS), build_directory=str(build_dir), is_python_module=False,
        verbose=False,
    )  # fmt: skip


def main() -> int:
    """Build (or find) the kernels and say which; exit 0 either way: they are optional."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if load():
        print(f"C++ CPU kernels ready: {library_name()}")
    else:
        print(f"C++ CPU kernels not built, the engine will use torch ops: {_error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
