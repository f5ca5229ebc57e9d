"""`bucketserve serve`: the HTTP edge on the public port(s), the supervised tritonserver behind it."""

from __future__ import annotations

import signal
from collections.abc import Callable

from bucketserve.serving.config import ServeConfig
from bucketserve.serving.front.allowlist import AccessPolicy, grpc_metadata
from bucketserve.serving.front.app import Front
from bucketserve.serving.front.health import Health
from bucketserve.serving.front.metrics import FrontMetrics
from bucketserve.serving.front.server import FrontServer
from bucketserve.serving.launcher import TritonServer
from bucketserve.serving.leftovers import claim_run_dir, release_run_dir, sweep_unmapped_shm
from bucketserve.serving.openai.app import Settings
from bucketserve.serving.ports import Port, check_free
from bucketserve.serving.procs import become_subreaper
from bucketserve.serving.supervisor import Supervisor


def local_host(cfg: ServeConfig) -> str:
    """Where the edge reaches Triton (a wildcard address means this host)."""
    return "127.0.0.1" if cfg.host in ("0.0.0.0", "::", "") else cfg.host


def grpc_target(cfg: ServeConfig) -> str:
    return f"{local_host(cfg)}:{cfg.grpc_port}"


def triton_metrics_url(cfg: ServeConfig) -> str:
    return f"http://{local_host(cfg)}:{cfg.metrics_port}/metrics"


def public_ports(cfg: ServeConfig) -> list[Port]:
    """Every port `serve` listens on, the edge's first, with the flags that set them."""
    ports = [Port(cfg.http_port, "--http-port")]
    if cfg.openai_port and cfg.openai_port != cfg.http_port:
        ports.append(Port(cfg.openai_port, "--openai-port"))
    return [*ports, Port(cfg.grpc_port, "--grpc-port"), Port(cfg.metrics_port, "--metrics-port")]


def access_policy(cfg: ServeConfig) -> AccessPolicy:
    """The entry models only; the keys from the command line (or environment)."""
    return AccessPolicy(admin_key=cfg.admin_key, api_key=cfg.api_key,
                        metrics_need_key=cfg.metrics_need_api_key)  # fmt: skip


def openai_settings(cfg: ServeConfig) -> Settings:
    """The OpenAI routes' settings; the tokenizer (chat template) loads on the first chat."""
    from bucketserve.serving.model_info import load_tokenizer, model_info

    return Settings(cfg.model, load_tokenizer=lambda: load_tokenizer(model_info(cfg)))


def banner(cfg: ServeConfig, log_path) -> str:
    """What listens now, and nothing else (every port was bound or Triton would not be ready)."""
    base = f"http://{cfg.host}:{cfg.http_port}"
    openai = [f"{base}/v1"] + [f"http://{cfg.host}:{p.port}/v1" for p in public_ports(cfg)
                               if p.flag == "--openai-port"]  # fmt: skip
    return (
        f"BucketServe ready: model={cfg.model} policy={cfg.policy}\n"
        f"  HTTP     {base}/v2/models/bucketserve/generate_stream"
        f"  (bodies up to {cfg.max_request_bytes} bytes)\n"
        f"  OpenAI   {', '.join(openai)}\n"
        f"  gRPC     {cfg.host}:{cfg.grpc_port}  (models: bucketserve, bucketserve_bls)\n"
        f"  metrics  {base}/metrics (edge, Triton, models),"
        f" http://{cfg.host}:{cfg.metrics_port}/metrics (Triton, models)\n"
        f"  log      {log_path}\n"
        f"Ctrl-C to stop."
    )


def serve(cfg: ServeConfig, log: Callable[[str], None] = print) -> int:
    """Run until SIGTERM/SIGINT; restarts tritonserver when it or one of its stubs dies."""
    become_subreaper()  # orphaned stubs of a crashed server come back to us, not to pid 1
    check_free(cfg.host, public_ports(cfg))  # before the model is resolved or loaded
    cfg = TritonServer(cfg).cfg  # resolves the run id and the model directory once
    health, metrics = Health(), FrontMetrics()
    front = Front(health, metrics, cfg.max_request_bytes, grpc_target(cfg),
                  cfg.max_concurrent_requests, openai_settings(cfg), triton_metrics_url(cfg),
                  access_policy(cfg), grpc_metadata(cfg.api_key))  # fmt: skip
    edge_ports = [p for p in public_ports(cfg) if p.flag in ("--http-port", "--openai-port")]
    web = FrontServer(front, cfg.host, edge_ports[0], tuple(edge_ports[1:]))  # binds them now
    try:
        for note in claim_run_dir(cfg.run_path, cfg.run_id):
            log(note)
    except BaseException:
        web.close_sockets()
        raise
    swept = sweep_unmapped_shm()
    if swept:
        log(f"removed {len(swept)} shared-memory segment(s) no live process uses: {swept[:4]} ...")
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
