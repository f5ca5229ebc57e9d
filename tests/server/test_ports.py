"""A port that cannot be bound fails `bucketserve serve` at once, naming the port and its flag;
nothing of the server is left running (before, a second server printed an OpenAI URL whose
process had died with EADDRINUSE, and requests to it reached the first server)."""

from __future__ import annotations

import socket
import time

import pytest
from bucketserve.serving.launch.serve_process import ServeProcess

pytestmark = pytest.mark.server

FLAGS = ("--http-port", "--openai-port", "--grpc-port", "--metrics-port")


@pytest.fixture
def taken():
    """A port something else listens on (as another server's would)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("flag", FLAGS)
def test_a_port_in_use_fails_the_start_naming_port_and_flag(tmp_path, taken, flag):
    sp = ServeProcess(tmp_path / "run", "--kv-cache-gb", "0.5", flag, str(taken))
    t0 = time.monotonic()
    sp.start()
    try:
        rc = sp.proc.wait(timeout=120)
    finally:
        sp.stop()
    took = time.monotonic() - t0
    log = sp.log_tail()
    print(f"{flag} {taken} in use: exit {rc} after {took:.1f} s: {log.splitlines()[-1]}")
    assert rc == 1, log
    assert f"({flag} {taken})" in log and "in use" in log, log
    assert "BucketServe ready" not in log and "Traceback" not in log, log
    assert sp.processes() == []  # no tritonserver, no stub, no edge
    assert not (tmp_path / "run" / "server.log").exists()  # refused before any model loads
