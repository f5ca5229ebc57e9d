"""Run the front under uvicorn on a thread of the launcher, next to the supervisor."""

from __future__ import annotations

import threading
import time

import uvicorn

from bucketserve.serving.front.app import Front

START_TIMEOUT_S = 30.0


class FrontServer:
    """uvicorn serving one Front on host:port; start() returns once it listens."""

    def __init__(self, front: Front, host: str, port: int) -> None:
        config = uvicorn.Config(
            front.app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            timeout_keep_alive=30,
            lifespan="on",
        )
        self.front = front
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # the launcher owns SIGTERM/SIGINT
        self.thread = threading.Thread(target=self.server.run, name="front", daemon=True)

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP front did not start (is the port in use?)")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
