"""`bucketserve` command line: serve, generate, chat, simulate."""

from __future__ import annotations

import argparse
import json
import os
import sys

from bucketserve.serving.config import KNOWN_POLICIES, TOPOLOGIES, ServeConfig


def add_serve_args(p: argparse.ArgumentParser) -> None:
    d = ServeConfig()
    p.add_argument(
        "--model", default=d.model, help="HF checkpoint dir, .gguf file, 'smollm2' or dummy:<shape>"
    )
    p.add_argument("--policy", default=d.policy, choices=KNOWN_POLICIES)
    p.add_argument(
        "--topology", default=d.topology, choices=TOPOLOGIES,
        help="disaggregated: prefill instances hand KV to decode instances; colocated: each "
        "--decode-devices instance runs fused decode + prompt-chunk iterations (no hand-off)",
    )  # fmt: skip
    p.add_argument(
        "--chunk-tokens", type=int, default=d.chunk_tokens,
        help="colocated: tokens per iteration (every running decode's token, then prompt "
        "chunks); 0 (default): 32 per thread of a CPU instance, 512 on GPU",
    )  # fmt: skip
    p.add_argument(
        "--prefill-devices", action="append", help="cpu or cuda:N (repeatable; default cpu)"
    )
    p.add_argument(
        "--decode-devices", action="append", help="cpu or cuda:N (repeatable; default cpu)"
    )
    p.add_argument("--host", default=d.host)
    p.add_argument("--http-port", type=int, default=d.http_port)
    p.add_argument(
        "--grpc-port", type=int, default=d.grpc_port,
        help="the gRPC edge: Triton's gRPC protocol for the entry models (tritonserver's own"
        " gRPC listens on an internal loopback port; docs/security.md)",
    )  # fmt: skip
    p.add_argument("--metrics-port", type=int, default=d.metrics_port)
    p.add_argument("--run-dir", default=d.run_dir)
    p.add_argument(
        "--dtype",
        default=d.dtype,
        help="auto: bfloat16 on GPUs and on CPUs with "
        "AVX512-BF16/AMX, else float32 (logged at start); or float32, bfloat16",
    )
    p.add_argument("--attention", default=d.attention)
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument("--kv-cache-gb", type=float, default=d.kv_cache_gb)
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=d.gpu_memory_utilization,
        help="GPU: share of total memory per engine instance (default 0.9 / instances)",
    )
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=d.cuda_graphs,
        help="GPU: replay decode steps as CUDA graphs (--no-cuda-graphs: eager)",
    )
    p.add_argument(
        "--prefix-caching", dest="enable_prefix_caching",
        action=argparse.BooleanOptionalAction, default=d.enable_prefix_caching,
        help="reuse the KV of prompt prefixes shared across requests (--no-prefix-caching: off)",
    )  # fmt: skip
    p.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens)
    p.add_argument("--log-verbose", type=int, default=d.log_verbose)
    p.add_argument("--max-prefill-tokens", type=int, default=d.max_prefill_tokens)
    p.add_argument("--max-decode-batch", type=int, default=d.max_decode_batch)
    p.add_argument("--stream-interval-s", type=float, default=d.stream_interval_s)
    p.add_argument(
        "--scheduler", type=json.loads, default=d.scheduler, metavar="JSON",
        help='SchedulerConfig overrides, e.g. \'{"enable_bucketing": false}\' (ablations)',
    )  # fmt: skip
    add_fault_args(p, d)


def add_fault_args(p: argparse.ArgumentParser, d: ServeConfig) -> None:
    """Limits of the public endpoints, overload and shutdown (see README: Fault tolerance)."""
    p.add_argument(
        "--max-request-bytes", type=int, default=d.max_request_bytes,
        help="HTTP request bodies above this get 413 before reaching Triton",
    )  # fmt: skip
    p.add_argument(
        "--max-queued-requests", type=int, default=d.max_queued_requests,
        help="requests waiting for prefill beyond this get 'server busy' (503); 0: from memory",
    )  # fmt: skip
    p.add_argument(
        "--max-concurrent-requests", type=int, default=d.max_concurrent_requests,
        help="inference requests in flight at the HTTP front beyond this get 'server busy' (503)"
        " at once, before reaching Triton; 0: no cap",
    )  # fmt: skip
    p.add_argument(
        "--drain-timeout-s", type=float, default=d.drain_timeout_s,
        help="on SIGTERM/SIGINT, how long in-flight requests may still finish",
    )  # fmt: skip
    p.add_argument(
        "--canary-interval-s", type=float, default=d.canary_interval_s,
        help="send a 2-token canary request through every stage this often; 0: off",
    )  # fmt: skip
    p.add_argument(
        "--canary-timeout-s", type=float, default=d.canary_timeout_s,
        help="a canary with no answer in this time (while no other request finished) fails;"
        " two failures in a row restart the server, readiness naming the cause",
    )  # fmt: skip


def fault_fields(a: argparse.Namespace) -> dict:
    return {
        "max_request_bytes": a.max_request_bytes,
        "max_queued_requests": a.max_queued_requests,
        "max_concurrent_requests": a.max_concurrent_requests,
        "drain_timeout_s": a.drain_timeout_s,
        "canary_interval_s": a.canary_interval_s,
        "canary_timeout_s": a.canary_timeout_s,
    }


def add_security_args(p: argparse.ArgumentParser) -> None:
    """Keys of the public endpoints (docs/security.md); the environment keeps them off `ps`."""
    p.add_argument(
        "--api-key", default=os.environ.get("BUCKETSERVE_API_KEY", ""),
        help="require 'Authorization: Bearer KEY' on v2 and OpenAI routes and the gRPC header"
        " 'triton-grpc-protocol-api-key: KEY' (default $BUCKETSERVE_API_KEY; health and metrics"
        " stay open)",
    )  # fmt: skip
    p.add_argument(
        "--metrics-need-api-key", action="store_true",
        help="with --api-key, the edge's /metrics needs it too (health probes never do)",
    )  # fmt: skip
    p.add_argument(
        "--admin-key", default=os.environ.get("BUCKETSERVE_ADMIN_KEY", ""),
        help="open Triton's shared-memory, repository, trace and logging APIs to requests with"
        " the header 'admin-key: KEY' (gRPC: 'triton-grpc-protocol-admin-key'); default"
        " $BUCKETSERVE_ADMIN_KEY, unset: closed (403)",
    )  # fmt: skip


def add_openai_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--openai-port", type=int, default=ServeConfig().openai_port,
        help="a second port of the HTTP edge for the OpenAI-compatible API (/v1/chat/completions"
        " ...; also served on --http-port); 0: the HTTP port only",
    )  # fmt: skip


def serve_config(a: argparse.Namespace) -> ServeConfig:
    return ServeConfig(
        model=a.model,
        policy=a.policy,
        topology=a.topology,
        chunk_tokens=a.chunk_tokens,
        prefill_devices=a.prefill_devices or ["cpu"],
        decode_devices=a.decode_devices or ["cpu"],
        host=a.host,
        http_port=a.http_port,
        grpc_port=a.grpc_port,
        metrics_port=a.metrics_port,
        run_dir=a.run_dir,
        dtype=a.dtype,
        attention=a.attention,
        block_size=a.block_size,
        kv_cache_gb=a.kv_cache_gb,
        max_model_len=a.max_model_len,
        gpu_memory_utilization=a.gpu_memory_utilization,
        cuda_graphs=a.cuda_graphs,
        enable_prefix_caching=a.enable_prefix_caching,
        default_max_tokens=a.default_max_tokens,
        log_verbose=a.log_verbose,
        max_prefill_tokens=a.max_prefill_tokens,
        max_decode_batch=a.max_decode_batch,
        stream_interval_s=a.stream_interval_s,
        scheduler=a.scheduler,
        **fault_fields(a),
        openai_port=getattr(a, "openai_port", ServeConfig().openai_port),
        admin_key=getattr(a, "admin_key", ""),
        api_key=getattr(a, "api_key", ""),
        metrics_need_api_key=getattr(a, "metrics_need_api_key", False),
    )


def cmd_serve(a: argparse.Namespace) -> int:
    from bucketserve.serving.launch.ports import PortUnavailable
    from bucketserve.serving.launch.service import serve

    try:
        return serve(serve_config(a), log=lambda line: print(line, flush=True))
    except PortUnavailable as e:  # a start that cannot listen is an error, not a traceback
        print(f"bucketserve serve: error: {e}", file=sys.stderr, flush=True)
        return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="bucketserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the Triton server")
    add_serve_args(serve)
    add_openai_args(serve)
    add_security_args(serve)
    sub.add_parser("generate", help="one request to a running server", add_help=False)
    sub.add_parser("chat", help="interactive chat with a running server", add_help=False)
    sub.add_parser(
        "simulate", help="discrete-event simulation of the scheduling policies", add_help=False
    )
    if argv and argv[0] in ("generate", "chat"):
        from bucketserve_client.cli import main as client_main

        return client_main(argv)
    if argv and argv[0] == "simulate":
        from bucketserve.sim.cli import main as sim_main

        return sim_main(argv[1:])
    a = parser.parse_args(argv)
    return cmd_serve(a)


if __name__ == "__main__":
    sys.exit(main())
