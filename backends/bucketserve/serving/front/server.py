"""Run the edge under uvicorn on a thread of the launcher, next to the supervisor.

One app on one or more sockets (the HTTP port and, by default, the OpenAI port too). The sockets
are bound here, in the constructor, so a port in use fails the start at once with the port and
its flag (serving/launch/ports.py), before tritonserver loads a model.
"""

from __future__ import annotations

import threading
import time

import uvicorn

from bucketserve.serving.front.app import Front
from bucketserve.serving.launch.ports import Port, bind

START_TIMEOUT_S = 30.0


class FrontServer:
    """uvicorn serving one Front on host:port (and `more` ports); start() returns once it listens."""

    def __init__(
        self, front: Front, host: str, port: int | Port, more: tuple[Port, ...] = ()
    ) -> None:
        ports = [port if isinstance(port, Port) else Port(port, "--http-port"), *more]
        self.sockets = []
        try:
            for p in ports:
                self.sockets.append(bind(host, p))
        except BaseException:
            self.close_sockets()
            raise
        self.ports = [s.getsockname()[1] for s in self.sockets]
        config = uvicorn.Config(
            front.app,
            log_level="warning",
            access_log=False,
            timeout_keep_alive=30,
            lifespan="on",
        )
        self.front = front
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # the launcher owns SIGTERM/SIGINT
        self.thread = threading.Thread(target=self.run, name="front", daemon=True)
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self.server.run(sockets=self.sockets)
        except BaseException as e:  # carried back to start()
            self.failure = e

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                why = f": {self.failure!r}" if self.failure else ""
                raise RuntimeError(f"the HTTP edge did not start on ports {self.ports}{why}")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=10)
        self.close_sockets()

    def close_sockets(self) -> None:
        for s in self.sockets:
            s.close()
