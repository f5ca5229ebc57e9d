"""`bucketserve serve`: the HTTP and gRPC edges on the public ports, the supervised tritonserver
behind them (its HTTP and gRPC on internal loopback ports: docs/security.md)."""

from __future__ import annotations

import signal
from collections.abc import Callable

from bucketserve.serving.config import ServeConfig
from bucketserve.serving.front.allowlist import AccessPolicy, grpc_metadata
from bucketserve.serving.front.app import Front
from bucketserve.serving.front.grpc_edge import GrpcEdge
from bucketserve.serving.front.health import Health
from bucketserve.serving.front.metrics import FrontMetrics
from bucketserve.serving.front.server import FrontServer
from bucketserve.serving.launch.launcher import TritonServer, triton_metrics_url
from bucketserve.serving.launch.leftovers import claim_run_dir, release_run_dir, sweep_unmapped_shm
from bucketserve.serving.launch.ports import Port, check_free, free_port
from bucketserve.serving.launch.procs import become_subreaper
from bucketserve.serving.launch.supervisor import Supervisor
from bucketserve.serving.openai.app import Settings


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


def grpc_edge(
    cfg: ServeConfig, triton_grpc: str, metrics: FrontMetrics, host: str, port: int
) -> GrpcEdge:
    """The public gRPC port on host:port (0: a free one) in front of Triton's gRPC at
    `triton_grpc`; its refusals are counted with the HTTP edge's."""
    return GrpcEdge(access_policy(cfg), triton_grpc, host, Port(port, "--grpc-port"),
                    grpc_metadata(cfg.api_key), lambda why: metrics.rejected.labels(why).inc())  # fmt: skip


def openai_settings(cfg: ServeConfig) -> Settings:
    """The OpenAI routes' settings; the tokenizer (chat template) loads on the first chat."""
    from bucketserve.serving.core.model_info import load_tokenizer, model_info

    return Settings(cfg.model, load_tokenizer=lambda: load_tokenizer(model_info(cfg)))


def describe_topology(cfg: ServeConfig) -> str:
    """e.g. 'topology=colocated on cpu, cpu' or 'topology=disaggregated prefill cpu, decode cpu'."""
    if cfg.is_colocated:
        layout = (
            ""
            if not cfg.is_hybrid
            else (
                " (adaptive roles)" if cfg.hybrid_layout < 0 else f" (layout {cfg.hybrid_layout})"
            )
        )
        return f"topology={cfg.topology} on {', '.join(cfg.decode_devices)}{layout}"
    return (f"topology=disaggregated prefill {', '.join(cfg.prefill_devices)},"
            f" decode {', '.join(cfg.decode_devices)}")  # fmt: skip


def banner(cfg: ServeConfig, log_path) -> str:
    """What listens now, and nothing else (every port was bound or Triton would not be ready)."""
    base = f"http://{cfg.host}:{cfg.http_port}"
    openai = [f"{base}/v1"] + [f"http://{cfg.host}:{p.port}/v1" for p in public_ports(cfg)
                               if p.flag == "--openai-port"]  # fmt: skip
    return (
        f"BucketServe ready: model={cfg.model} policy={cfg.policy} {describe_topology(cfg)}\n"
        f"  HTTP     {base}/v2/models/bucketserve/generate_stream"
        f"  (bodies up to {cfg.max_request_bytes} bytes)\n"
        f"  OpenAI   {', '.join(openai)}\n"
        f"  gRPC     {cfg.host}:{cfg.grpc_port}  (the gRPC edge; models: bucketserve,"
        f" bucketserve_bls)\n"
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
    # Triton's gRPC: one internal port for every (re)start, so the edges' channels stay valid
    triton_grpc_port = free_port()
    triton_grpc = f"127.0.0.1:{triton_grpc_port}"
    health, metrics = Health(), FrontMetrics()
    front = Front(health, metrics, cfg.max_request_bytes, triton_grpc,
                  cfg.max_concurrent_requests, openai_settings(cfg), triton_metrics_url(cfg),
                  access_policy(cfg), grpc_metadata(cfg.api_key))  # fmt: skip
    edge_ports = [p for p in public_ports(cfg) if p.flag in ("--http-port", "--openai-port")]
    web = FrontServer(front, cfg.host, edge_ports[0], tuple(edge_ports[1:]))  # binds them now
    rpc = None
    try:
        rpc = grpc_edge(cfg, triton_grpc, metrics, cfg.host, cfg.grpc_port)  # binds and serves now
        for note in claim_run_dir(cfg.run_path, cfg.run_id):
            log(note)
    except BaseException:
        web.close_sockets()
        if rpc is not None:
            rpc.stop(grace_s=0)
        raise
    swept = sweep_unmapped_shm()
    if swept:
        log(f"removed {len(swept)} shared-memory segment(s) no live process uses: {swept[:4]} ...")
    sup = Supervisor(cfg, health, metrics, log, triton_grpc_port=triton_grpc_port)
    for sig in (signal.SIGTERM, signal.SIGINT):  # docker stop, kill, Ctrl-C: the same drain
        signal.signal(sig, lambda *_: sup.request_stop())
    log(f"starting tritonserver (log: {cfg.run_path / 'server.log'}) ...")
    web.start()
    try:
        sup.run(on_first_ready=lambda: log(banner(cfg, cfg.run_path / "server.log")))
    finally:
        log("stopping ...")
        sup.shutdown(lambda: front.inflight, front.release_upstream)
        rpc.stop(grace_s=1.0)  # Triton has ended (or drained) every call it was forwarding
        web.stop()
        release_run_dir(cfg.run_path)
    return 0
