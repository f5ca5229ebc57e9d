"""Test-run layout for `make test` (pytest-xdist, `-n 2`).

The parity and server tests run one after another on one worker, as they would without
xdist: a server test starts tritonserver and a stub per model instance, a parity session holds
transformers' model and references and runs the engine on one thread, and two of either at
once do not fit a 2-core, 24 GiB machine (run side by side, a parity worker and a server
worker met the kernel's OOM killer). The unit tests, a module at a time, fill the core that a
parity or server test leaves idle on the other worker.

xdist's own `--dist loadgroup` would say this with marks, but with pytest 9.2 it groups
nothing (it renames `item._nodeid`, which pytest 9 no longer reads: pytest-xdist#1386,
docs/platform-notes.md#p37-xdist-loadgroup-under-pytest-9), hence the scheduler here.
"""

from __future__ import annotations

import pytest

SERIAL = ("parity", "server")  # folders whose tests share one worker, in collection order


def work_unit(nodeid: str) -> str:
    """xdist's unit of work for a test: one for every test under SERIAL, else its module."""
    path = nodeid.split("::")[0]
    return "serial" if path.split("/")[1] in SERIAL else path


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (requirements.txt)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class FolderScheduling(LoadScopeScheduling):
        """LoadScopeScheduling over work_unit; the largest unit goes out first (the serial
        one), and a worker takes another only once its own is all but done."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return FolderScheduling(config, log)
