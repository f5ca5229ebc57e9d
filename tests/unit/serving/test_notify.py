"""Decode -> scheduler finish notices over the Unix datagram socket."""

from __future__ import annotations

import threading
import time

from bucketserve.serving.core.notify import FinishListener, FinishNotifier, socket_path


def test_notices_arrive_with_a_deep_run_dir(tmp_path):
    run_dir = tmp_path.joinpath(*(["a-rather-long-directory-name"] * 6))  # > 108 bytes
    run_dir.mkdir(parents=True)
    got, done = [], threading.Event()

    def on_finished(key: str, n: int) -> None:
        got.append((key, n))
        done.set()

    listener = FinishListener(socket_path(str(run_dir), "abc123"), on_finished)
    thread = threading.Thread(target=listener.serve, daemon=True)
    thread.start()
    notifier = FinishNotifier(socket_path(str(run_dir), "abc123"))
    deadline = time.monotonic() + 5
    while not done.is_set() and time.monotonic() < deadline:
        notifier.finished("req-1", 7)
        done.wait(0.05)
    listener.close()
    notifier.close()
    thread.join(timeout=2)
    assert got and got[0] == ("req-1", 7)
    assert not thread.is_alive()
