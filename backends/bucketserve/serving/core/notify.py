"""Decode -> scheduler notices over a Unix datagram socket (cheap, one-way).

The scheduler's admission reserves decode blocks per request; it releases a reservation when
decode reports the request done ("finished", with whether it met its TTFT and TPOT SLOs: the
hybrid role controller's input), and moves it when a hybrid instance handed the request's
decode to a peer ("moved"). Losing a notice only delays that release (the scheduling core also
clears reservations of an idle decode instance), so sends never block.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable

RECV_TIMEOUT_S = 0.2


def socket_path(run_dir: str, run_id: str) -> str:
    """The scheduler's address for this run. Linux: the abstract namespace (no file to clean
    up, and no 108-byte sun_path limit for deep run dirs); elsewhere a file in the run dir."""
    if sys.platform.startswith("linux"):
        return f"\0bucketserve-{run_id}-sched"
    return os.path.join(run_dir, f"sched-{run_id}.sock")


def _is_file(path: str) -> bool:
    return not path.startswith("\0") and os.path.exists(path)


class FinishNotifier:
    """Decode side: fire-and-forget notices."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)

    def finished(self, key: str, num_output_tokens: int,
                 slo_met: tuple[bool, bool] | None = None) -> None:  # fmt: skip
        self._send({"finished": key, "n": num_output_tokens, "slo": slo_met})

    def moved(self, key: str, decode_index: int) -> None:
        self._send({"moved": key, "to": decode_index})

    def _send(self, notice: dict) -> None:
        try:
            self.sock.sendto(json.dumps(notice).encode(), self.path)
        except OSError:  # scheduler not listening (yet) or its buffer is full
            pass

    def close(self) -> None:
        self.sock.close()


class FinishListener:
    """Scheduler side: `serve()` runs in a thread and calls `on_finished(key, n, slo_met)` or
    `on_moved(key, decode_index)` per notice."""

    def __init__(self, path: str, on_finished: Callable[..., None],
                 on_moved: Callable[[str, int], None] | None = None) -> None:  # fmt: skip
        if _is_file(path):
            os.unlink(path)
        self.path, self.on_finished, self.on_moved = path, on_finished, on_moved
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(RECV_TIMEOUT_S)
        self.closing = False

    def serve(self) -> None:
        while not self.closing:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            notice = json.loads(data)
            if "moved" in notice:
                if self.on_moved is not None:
                    self.on_moved(str(notice["moved"]), int(notice["to"]))
                continue
            slo = notice.get("slo")
            self.on_finished(str(notice["finished"]), int(notice["n"]),
                             tuple(bool(x) for x in slo) if slo else None)  # fmt: skip

    def close(self) -> None:
        self.closing = True
        self.sock.close()
        if _is_file(self.path):
            os.unlink(self.path)
