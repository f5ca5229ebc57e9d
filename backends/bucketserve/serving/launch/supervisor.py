"""Supervision: keep tritonserver and every Python stub alive, restart the server when one dies.

A dead stub stays dead in Triton 2.51 and its in-flight requests hang
(docs/platform-notes.md#p12-dead-stub-stays-dead), so any
death is answered the same way: mark the server degraded (the front says not-ready and names the
cause), SIGKILL the whole server (which closes every client connection: nothing hangs), free its
shared memory, and start it again with exponential backoff.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable

from bucketserve.serving.config import ServeConfig
from bucketserve.serving.front.health import DEGRADED, READY, STARTING, STOPPING, Health
from bucketserve.serving.front.metrics import FrontMetrics
from bucketserve.serving.launch.canary import CanaryProbe, StoppedWatch
from bucketserve.serving.launch.launcher import TritonServer, triton_metrics_url
from bucketserve.serving.launch.ports import PortUnavailable, free_port
from bucketserve.serving.launch.procs import Stub, is_alive, stubs_of

WATCH_INTERVAL_S = 0.2
STABLE_S = 60.0  # healthy this long after a restart: the next failure starts the backoff over
START_TIMEOUT_S = 600.0


def exit_cause(returncode: int) -> str:
    if returncode < 0:
        return f"tritonserver died ({signal.Signals(-returncode).name})"
    return f"tritonserver exited with status {returncode}"


def model_of(instance: str) -> str:
    """decode_0_0 -> decode: the restart metric's label stays low-cardinality."""
    return re.sub(r"(_\d+)+$", "", instance)


class Supervisor:
    """Runs on the launcher's main thread (PR_SET_PDEATHSIG is tied to the starting thread)."""

    def __init__(
        self, cfg: ServeConfig, health: Health, metrics: FrontMetrics, log: Callable = print,
        triton_grpc_port: int | None = None,
    ) -> None:  # fmt: skip
        self.cfg = cfg
        # the edges' gRPC channels point at one internal port: every restart reuses it
        self.triton_grpc_port = triton_grpc_port
        self.health, self.metrics, self.log = health, metrics, log
        self.stopping = threading.Event()
        self.server: TritonServer | None = None
        self.stubs: list[Stub] = []
        self.port_error: PortUnavailable | None = None  # why the last start failed, if a port

    def request_stop(self) -> None:
        self.stopping.set()

    def run(self, on_first_ready: Callable[[], None]) -> None:
        """Start, watch, restart with backoff until a stop is requested."""
        delay, ever_ready = 1.0, False
        while not self.stopping.is_set():
            cause, part = self.start_once()
            if self.stopping.is_set():
                return
            if cause is None:
                if not ever_ready:
                    on_first_ready()
                ever_ready, since = True, time.monotonic()
                cause, part = self.watch()
                if cause is None:
                    return
                if time.monotonic() - since > STABLE_S:
                    delay = 1.0
            elif not ever_ready:  # never served: a configuration error, not worth a retry
                if self.port_error is not None:
                    raise self.port_error
                raise RuntimeError(f"{cause}:\n{self.server.log_tail()}")
            if self.stopping.is_set():
                return
            self.fail(cause, part, delay)
            if self.stopping.wait(delay):
                return
            delay = min(delay * 2, self.cfg.restart_backoff_max_s)

    def start_once(self) -> tuple[str | None, str]:
        """A fresh server on a fresh internal HTTP port (gRPC: the same internal port every
        time); (None, "") once ready, else (cause, part)."""
        self.port_error = None
        try:
            return self.start_server()
        except PortUnavailable as e:  # taken by another process: after a restart, retried
            self.port_error = e
            return str(e), "tritonserver"
        except Exception as e:  # e.g. the run folder could not be rendered: retry with backoff
            return f"tritonserver could not start: {type(e).__name__}: {e}", "tritonserver"

    def start_server(self) -> tuple[str | None, str]:
        port = free_port()
        self.server = TritonServer(
            self.cfg, triton_http_port=port, triton_grpc_port=self.triton_grpc_port
        )
        self.health.set(STARTING, self.health.cause, upstream=f"http://127.0.0.1:{port}")
        self.server.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.stopping.wait(0.5):
            rc = self.server.proc.poll()
            if rc is not None:
                error = self.server.exit_error()
                if isinstance(error, PortUnavailable):
                    self.port_error = error
                    return str(error), "tritonserver"
                return f"{exit_cause(rc)} during start-up", "tritonserver"
            if self.server.is_ready():
                self.stubs = stubs_of(self.server.proc.pid)
                self.health.set(READY)
                self.log(f"supervisor: tritonserver ready, watching {len(self.stubs)} stubs")
                return None, ""
            if time.monotonic() > deadline:
                return f"tritonserver not ready after {START_TIMEOUT_S:.0f}s", "tritonserver"
        return None, ""

    def watch(self) -> tuple[str | None, str]:
        """Block until the server or a stub dies, a stub stops, or the canary fails: (cause,
        part); (None, "") on a stop request (serving/launch/canary.py)."""
        stopped = StoppedWatch()
        canary = CanaryProbe(self.health.upstream, triton_metrics_url(self.cfg),
                             self.cfg.canary_interval_s, self.cfg.canary_timeout_s,
                             self.cfg.canary_failures, self.metrics)  # fmt: skip
        while not self.stopping.wait(WATCH_INTERVAL_S):
            rc = self.server.proc.poll()
            if rc is not None:
                return exit_cause(rc), "tritonserver"
            for stub in self.stubs:
                if not is_alive(stub.pid):
                    return f"stub process {stub.instance} (pid {stub.pid}) died", model_of(
                        stub.instance
                    )
            stub = stopped.check(self.stubs)
            if stub is not None:
                return (f"stage {stub.instance} (pid {stub.pid}) is stopped: alive but making"
                        " no progress", model_of(stub.instance))  # fmt: skip
            failed = canary.poll()
            if failed is not None:
                return failed, "chain"
        return None, ""

    def fail(self, cause: str, part: str, delay: float) -> None:
        """Degraded first (the front names the cause), then kill: the resets carry the reason."""
        self.health.set(DEGRADED, f"{cause}; the server is restarting")
        self.log(f"supervisor: {cause}; killing tritonserver, restarting it in {delay:.0f}s")
        self.server.kill()
        self.health.restarts += 1
        self.metrics.restarts.labels(part).inc()

    def shutdown(self, inflight: Callable[[], int], release: Callable[[], None]) -> None:
        """Stop taking requests, let in-flight ones finish (bounded), let go of Triton's gRPC
        streams (`release`), stop the server."""
        self.health.set(STOPPING, "server shutting down")
        deadline = time.monotonic() + self.cfg.drain_timeout_s
        while inflight() > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            release()
        except Exception as e:  # the server stops anyway; it only takes longer
            self.log(f"supervisor: could not close the front's gRPC streams: {e!r}")
        if self.server is not None:
            # Triton itself waits --exit-timeout-secs for gRPC requests still running
            self.server.stop(timeout_s=15.0)
