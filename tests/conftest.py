"""Test-run layout for `make test` (pytest-xdist, `-n 2`).

The server tests run one after another on one worker, as they would without xdist: each
starts tritonserver and a stub per model instance (an engine stub holds ~2.1 GB), and two
modules' servers at once do not fit a 2-core, 24 GiB machine. The parity tests (transformers'
model and references, the engine on one thread: up to ~3.3 GB) run as one unit on the other
worker, then the unit tests a module at a time. The server tests' two shared servers are
stopped after their last test (tests/server/conftest.py), so the server worker peaks near one
module's servers, not three.

xdist's own `--dist loadgroup` would say this with marks, but with pytest 9.2 it groups
nothing (it renames `item._nodeid`, which pytest 9 no longer reads: pytest-xdist#1386,
docs/platform-notes.md#p37-xdist-loadgroup-under-pytest-9), hence the scheduler here.
"""

from __future__ import annotations

import pytest

UNITS = ("parity", "server")  # folders whose tests are one unit of work each, in collection order


def work_unit(nodeid: str) -> str:
    """xdist's unit of work for a test: its folder for the folders in UNITS, else its module."""
    path = nodeid.split("::")[0]
    folder = path.split("/")[1]
    return folder if folder in UNITS else path


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (requirements.txt)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class FolderScheduling(LoadScopeScheduling):
        """LoadScopeScheduling over work_unit, in collection order: the parity tests (first
        collected) go to one worker, the server tests to the other, and the unit modules to
        whichever worker is all but done first. (xdist's default order, the unit with the most
        tests first, queued the 16 parity tests, the longest unit after the server tests,
        behind every unit module with more tests.)"""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # read by LoadScopeScheduling.schedule
    return FolderScheduling(config, log)
