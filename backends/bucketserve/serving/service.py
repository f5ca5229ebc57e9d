"""`bucketserve serve`: the HTTP front on the public port, the supervised tritonserver behind it."""

from __future__ import annotations

import signal
from collections.abc import Callable

from bucketserve.serving.config import ServeConfig
from bucketserve.serving.front.app import Front
from bucketserve.serving.front.health import Health
from bucketserve.serving.front.metrics import FrontMetrics
from bucketserve.serving.front.server import FrontServer
from bucketserve.serving.launcher import TritonServer
from bucketserve.serving.leftovers import claim_run_dir, release_run_dir, sweep_unmapped_shm
from bucketserve.serving.procs import become_subreaper
from bucketserve.serving.supervisor import Supervisor


def openai_url(cfg: ServeConfig) -> str:
    return f"http://{cfg.host}:{cfg.openai_port}/v1" if cfg.openai_port else "off (--openai-port 0)"


def grpc_target(cfg: ServeConfig) -> str:
    """Where the front reaches Triton's gRPC port (a wildcard address means this host)."""
    host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::", "") else cfg.host
    return f"{host}:{cfg.grpc_port}"


def banner(cfg: ServeConfig, log_path) -> str:
    base = f"http://{cfg.host}:{cfg.http_port}"
    return (
        f"BucketServe ready: model={cfg.model} policy={cfg.policy}\n"
        f"  HTTP     {base}/v2/models/bucketserve/generate_stream"
        f"  (bodies up to {cfg.max_request_bytes} bytes)\n"
        f"  gRPC     {cfg.host}:{cfg.grpc_port}  (models: bucketserve, bucketserve_bls)\n"
        f"  metrics  http://{cfg.host}:{cfg.metrics_port}/metrics (Triton, models),"
        f" {base}/metrics (restarts, front)\n"
        f"  OpenAI   {openai_url(cfg)}\n"
        f"  log      {log_path}\n"
        f"Ctrl-C to stop."
    )


def serve(cfg: ServeConfig, log: Callable[[str], None] = print) -> int:
    """Run until SIGTERM/SIGINT; restarts tritonserver when it or one of its stubs dies."""
    become_subreaper()  # orphaned stubs of a crashed server come back to us, not to pid 1
    cfg = TritonServer(cfg).cfg  # resolves the run id and the model directory once
    for note in claim_run_dir(cfg.run_path, cfg.run_id):
        log(note)
    swept = sweep_unmapped_shm()
    if swept:
        log(f"removed {len(swept)} shared-memory segment(s) no live process uses: {swept[:4]} ...")
    health, metrics = Health(), FrontMetrics()
    front = Front(health, metrics, cfg.max_request_bytes, grpc_target(cfg),
                  cfg.max_concurrent_requests)  # fmt: skip
    web = FrontServer(front, cfg.host, cfg.http_port)
    sup = Supervisor(cfg, health, metrics, log)
    for sig in (signal.SIGTERM, signal.SIGINT):  # docker stop, kill, Ctrl-C: the same drain
        signal.signal(sig, lambda *_: sup.request_stop())
    log(f"starting tritonserver (log: {cfg.run_path / 'server.log'}) ...")
    web.start()
    try:
        sup.run(on_first_ready=lambda: log(banner(cfg, cfg.run_path / "server.log")))
    finally:
        log("stopping ...")
        sup.shutdown(lambda: front.inflight, front.release_upstream)
        web.stop()
        release_run_dir(cfg.run_path)
    return 0
