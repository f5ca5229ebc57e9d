"""Ports: bind the edge's sockets up front, check Triton's before it starts, name the flag.

A port that cannot be bound fails the start with the port and the flag that chose it, before
any model loads (Triton binds its own ports only after loading every model, then exits).
"""

from __future__ import annotations

import re
import socket
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass

# tritonserver's own words when it cannot bind (main.cc: "failed to start GRPC service: ...")
TRITON_IN_USE = re.compile(r"Socket '(?P<addr>[^']+):(?P<port>\d+)' already in use")


class PortUnavailable(RuntimeError):
    """A port the server needs cannot be bound; the message names the port and its flag."""

    def __init__(self, host: str, port: int, flag: str, why: str) -> None:
        super().__init__(
            f"cannot listen on {host}:{port} ({flag} {port}): {why}; stop whatever uses it"
            f" or start with another {flag}"
        )
        self.port, self.flag = port, flag


@dataclass(slots=True, frozen=True)
class Port:
    """One port of the server and the command-line flag that sets it."""

    port: int
    flag: str  # e.g. "--grpc-port"


def family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def bind(host: str, port: Port) -> socket.socket:
    """A listening socket on host:port (SO_REUSEADDR: a port in TIME_WAIT is free, one that
    something listens on is not); PortUnavailable otherwise."""
    sock = socket.socket(family(host), socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port.port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise PortUnavailable(host, port.port, port.flag, e.strerror or str(e)) from None
    sock.set_inheritable(False)
    return sock


def check_free(host: str, ports: list[Port]) -> None:
    """Raise PortUnavailable for the first of `ports` that cannot be bound now."""
    for port in ports:
        bind(host, port).close()


def local_host(host: str) -> str:
    """Where this host reaches a server listening on `host` (a wildcard address means here)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _ephemeral_port() -> int:
    """The port the kernel gives a loopback socket bound to port 0 (closed again)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_handed_out: set[int] = set()  # every port free_port returned in this process
_handed_out_lock = threading.Lock()
FREE_PORT_TRIES = 1000


def free_port() -> int:
    """A loopback port nothing listens on now and that this process has not handed out before
    (tests, internal endpoints). The kernel may give the same ephemeral port to two binds in a
    row once the first socket is closed: a server asked for three ports at once then got one
    port for gRPC and metrics, and tritonserver refused to start."""
    with _handed_out_lock:
        for _ in range(FREE_PORT_TRIES):
            port = _ephemeral_port()
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise RuntimeError(
        f"no loopback port this process has not handed out in {FREE_PORT_TRIES} tries"
    )


def triton_port_error(log_text: str, host: str, ports: list[Port]) -> PortUnavailable | None:
    """The PortUnavailable a tritonserver log reports (it could not bind), if any."""
    found = TRITON_IN_USE.search(log_text)
    if found is None:
        return None
    number = int(found["port"])
    flag = next((p.flag for p in ports if p.port == number), "a port flag")
    return PortUnavailable(host, number, flag, "address already in use")


def http_ready(http_url: str, timeout_s: float) -> bool:
    """One probe of /v2/health/ready at host:port: True on 200, False if it cannot answer."""
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
