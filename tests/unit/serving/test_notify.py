"""Decode -> scheduler notices over the Unix datagram socket: finished (with the SLO outcome
the hybrid role controller reads) and moved (a hybrid decode handed to a peer)."""

from __future__ import annotations

import threading
import time

from bucketserve.serving.core.notify import FinishListener, FinishNotifier, socket_path


def test_notices_arrive_with_a_deep_run_dir(tmp_path):
    run_dir = tmp_path.joinpath(*(["a-rather-long-directory-name"] * 6))  # > 108 bytes
    run_dir.mkdir(parents=True)
    got, done = [], threading.Event()

    def on_finished(key: str, n: int, slo_met) -> None:
        got.append(("finished", key, n, slo_met))
        if key == "req-3":  # the last one sent (a datagram socket keeps their order)
            done.set()

    def on_moved(key: str, index: int) -> None:
        got.append(("moved", key, index))

    listener = FinishListener(socket_path(str(run_dir), "abc123"), on_finished, on_moved)
    thread = threading.Thread(target=listener.serve, daemon=True)
    thread.start()
    notifier = FinishNotifier(socket_path(str(run_dir), "abc123"))
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:  # the listener may not be bound yet
        notifier.finished("req-0", 1)
        time.sleep(0.05)
    got.clear()
    notifier.moved("req-1", 1)
    notifier.finished("req-1", 7, (True, False))
    notifier.finished("req-2", 0)
    notifier.finished("req-3", 3, (False, True))
    done.wait(5)
    listener.close()
    notifier.close()
    thread.join(timeout=2)
    assert [g for g in got if g[1] != "req-0"] == [
        ("moved", "req-1", 1),
        ("finished", "req-1", 7, (True, False)),
        ("finished", "req-2", 0, None),
        ("finished", "req-3", 3, (False, True)),
    ]
    assert not thread.is_alive()
