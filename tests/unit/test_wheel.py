"""The wheel ships every package: build it, install it alone in a fresh venv, import, run the CLI.

The fresh venv sees the project venv's dependencies through a .pth file naming its
site-packages (a .pth path line adds the folder, not the .pth files in it, so the project's
editable install of bucketserve stays out of sight); the source tree is never on its path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
TOP_PACKAGES = {"bucketserve": ROOT / "backends", "bucketserve_client": ROOT / "client"}

# Runs inside the fresh venv: import every package the installed wheel holds.
IMPORT_ALL = """
import importlib, json, pkgutil, sys
names = []
for top in ("bucketserve", "bucketserve_client"):
    pkg = importlib.import_module(top)
    names.append(top)
    for info in pkgutil.walk_packages(pkg.__path__, top + "."):
        if info.ispkg:
            importlib.import_module(info.name)
            names.append(info.name)
import bucketserve
print(json.dumps({"file": bucketserve.__file__, "packages": names}))
"""


def source_packages() -> set[str]:
    """Every folder of Python files under the two top-level packages, as a dotted name."""
    names = set()
    for top, parent in TOP_PACKAGES.items():
        for py in (parent / top).rglob("*.py"):
            if "__pycache__" not in py.parts:
                names.add(".".join(py.parent.relative_to(parent).parts))
    return names


def build_wheel(dest: Path) -> Path:
    """`pip wheel` from a clean copy of the tree (a stale build/ folder cannot hide a gap)."""
    src = dest / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src / "pyproject.toml")
    for parent in TOP_PACKAGES.values():
        shutil.copytree(parent, src / parent.name, ignore=skip)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    subprocess.run([*cmd, "-q", "-w", str(dest / "dist"), str(src)], check=True, timeout=300)
    (wheel,) = (dest / "dist").glob("bucketserve-*.whl")
    return wheel


def fresh_venv(path: Path, wheel: Path) -> Path:
    """A venv with only the wheel installed, seeing the project venv's site-packages."""
    venv.create(path, with_pip=False, symlinks=True)
    python = path / "bin" / "python"
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    own = Path(out.stdout.strip())
    (own / "project_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
    subprocess.run([*pip, str(wheel)], check=True, timeout=300)
    return path / "bin"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    work = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(work)
    return wheel, fresh_venv(work / "venv", wheel)


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return env | {"PYTHONNOUSERSITE": "1"}


def test_every_source_package_and_the_kernel_sources_are_in_the_wheel(installed):
    wheel, _ = installed
    files = zipfile.ZipFile(wheel).namelist()
    shipped = {name.rsplit("/", 1)[0].replace("/", ".") for name in files if name.endswith(".py")}
    assert source_packages() - shipped == set()
    assert "bucketserve/engine/csrc/cpu_ops.cpp" in files


def test_every_package_imports_from_the_installed_wheel(installed, tmp_path):
    _, bin_dir = installed
    out = subprocess.run(
        [str(bin_dir / "python"), "-c", IMPORT_ALL],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(found["file"]).is_relative_to(bin_dir.parent), found["file"]
    assert source_packages() <= set(found["packages"])


def test_the_cli_runs_from_the_installed_wheel(installed, tmp_path):
    _, bin_dir = installed
    out = subprocess.run(
        [str(bin_dir / "bucketserve"), "--help"],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "serve" in out.stdout
