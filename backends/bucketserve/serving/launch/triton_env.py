"""Locate a tritonserver and assemble the Python-backend folder and environment for it."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Triton 2.51.0 comes from pip, no container needed (docs/platform-notes.md#p1-triton-from-pip)
PYTRITON_HINT = "pip install nvidia-pytriton==0.7.0 (ships Triton 2.51.0), or run inside the NGC tritonserver image"


@dataclass(slots=True, frozen=True)
class TritonInstall:
    """Where the server binary, its Python backend and its shared libraries live."""

    server_bin: Path
    python_backend: Path  # folder holding libtriton_python.so (+ utils, maybe a stub)
    stub: Path | None  # triton_python_backend_stub for this Python version, when shipped apart
    lib_dirs: tuple[Path, ...]


def find_triton() -> TritonInstall:
    """PATH first, then /opt/tritonserver (NGC image), then the PyPI server (nvidia-pytriton)."""
    on_path = shutil.which("tritonserver")
    if on_path:
        root = Path(on_path).resolve().parent.parent
        if (root / "backends" / "python").is_dir():
            return TritonInstall(Path(on_path), root / "backends" / "python", None, ())
    opt = Path("/opt/tritonserver")
    if (opt / "bin" / "tritonserver").exists():
        return TritonInstall(opt / "bin" / "tritonserver", opt / "backends" / "python", None, ())
    return _pypi_triton()


def _pypi_triton() -> TritonInstall:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"no tritonserver found on PATH or in /opt/tritonserver; {PYTRITON_HINT}"
        )
    root = Path(spec.submodule_search_locations[0]) / "tritonserver"
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.exists():
        raise RuntimeError(f"nvidia-pytriton ships no Python backend stub for Python {ver}")
    libs = root.parent.parent / "nvidia_pytriton.libs"
    return TritonInstall(root / "bin" / "tritonserver", root / "backends" / "python", stub, (libs,))


def assemble_backends(install: TritonInstall, run_dir: Path) -> Path:
    """A backend folder = the Python backend plus the stub for the running Python.

    docs/platform-notes.md#p2-backend-folder-and-library-path
    """
    if install.stub is None:
        return install.python_backend.parent
    dst = run_dir / "backends" / "python"
    dst.mkdir(parents=True, exist_ok=True)
    for src in (
        install.python_backend / "libtriton_python.so",
        install.python_backend / "triton_python_backend_utils.py",
        install.stub,
    ):
        target = dst / src.name
        if not target.exists():
            shutil.copy2(src, target)
    return dst.parent


# glibc malloc for tritonserver and every stub (docs/architecture.md,
# docs/platform-notes.md#p29-glibc-arenas): by default each thread may get its own arena (up to
# 8 per core), each keeping what its burst took; two arenas bound the heaps that bursts of
# request threads spread over. The mmap threshold stays adaptive: fixing it (4 MiB or 256 KiB)
# kept the engines' heaps flat but made each decode step ~21 % slower (its per-step logits then
# come from fresh, page-faulted mappings).
GLIBC_MALLOC = {"MALLOC_ARENA_MAX": "2"}


def server_env(install: TritonInstall, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The stub takes sys.path from the first python3 on PATH: put ours first.

    docs/platform-notes.md#p3-stub-path-from-path (and p2: the library path, p5: libpython)
    """
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    lib_dirs = [str(p) for p in install.lib_dirs]
    # the stub links libpython3.X.so.1.0 (docs/platform-notes.md#p5-stub-links-libpython)
    libpython = sysconfig.get_config_var("LIBDIR")
    if libpython:
        lib_dirs.append(libpython)
    if env.get("LD_LIBRARY_PATH"):
        lib_dirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_dirs)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name, value in GLIBC_MALLOC.items():  # the caller's own settings win
        env.setdefault(name, value)
    env.update(extra or {})
    return env
