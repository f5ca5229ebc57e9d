"""Faults in the colocated topology: a killed engine stub (it prefills and decodes) ends every
stream with an error naming it, the supervisor restarts the server, and SIGTERM after a stub
died leaves nothing behind — what test_faults.py holds for the disaggregated default."""

from __future__ import annotations

import pytest

from tests.server.test_faults import (
    check_killed_stub_recovers,
    check_sigterm_after_a_stub_died,
    running,
)

pytestmark = [pytest.mark.server, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("faults-colocated") / "run"
    with running(run_dir, "--topology", "colocated", "--kv-cache-gb", "0.5",
                 "--max-model-len", "2048", "--drain-timeout-s", "5") as sp:  # fmt: skip
        yield sp


def test_killed_engine_stub_ends_every_stream_with_an_error_and_the_server_recovers(svc):
    assert svc.stub_pid("prefill_0") is None  # colocated: no prefill instance at all
    check_killed_stub_recovers(svc, "decode_0_0")


def test_sigterm_after_the_engine_stub_died_leaves_no_process_and_no_shm(svc):
    check_sigterm_after_a_stub_died(svc, "decode_0_0")
