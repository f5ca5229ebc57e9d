"""`bucketserve` command line: serve, generate, chat, simulate."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from bucketserve.serving.config import KNOWN_POLICIES, ServeConfig


def add_serve_args(p: argparse.ArgumentParser) -> None:
    d = ServeConfig()
    p.add_argument(
        "--model", default=d.model, help="HF checkpoint dir, .gguf file, 'smollm2' or dummy:<shape>"
    )
    p.add_argument("--policy", default=d.policy, choices=KNOWN_POLICIES)
    p.add_argument(
        "--prefill-devices", action="append", help="cpu or cuda:N (repeatable; default cpu)"
    )
    p.add_argument(
        "--decode-devices", action="append", help="cpu or cuda:N (repeatable; default cpu)"
    )
    p.add_argument("--host", default=d.host)
    p.add_argument("--http-port", type=int, default=d.http_port)
    p.add_argument("--grpc-port", type=int, default=d.grpc_port)
    p.add_argument("--metrics-port", type=int, default=d.metrics_port)
    p.add_argument("--run-dir", default=d.run_dir)
    p.add_argument("--dtype", default=d.dtype)
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
    p.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens)
    p.add_argument("--log-verbose", type=int, default=d.log_verbose)
    p.add_argument("--max-prefill-tokens", type=int, default=d.max_prefill_tokens)
    p.add_argument("--max-decode-batch", type=int, default=d.max_decode_batch)
    p.add_argument("--stream-interval-s", type=float, default=d.stream_interval_s)
    p.add_argument(
        "--scheduler", type=json.loads, default=d.scheduler, metavar="JSON",
        help='SchedulerConfig overrides, e.g. \'{"enable_bucketing": false}\' (ablations)',
    )  # fmt: skip


def add_openai_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--openai-port", type=int, default=ServeConfig().openai_port,
        help="OpenAI-compatible API port (/v1/chat/completions ...); 0 disables it",
    )  # fmt: skip


def serve_config(a: argparse.Namespace) -> ServeConfig:
    return ServeConfig(
        model=a.model,
        policy=a.policy,
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
        default_max_tokens=a.default_max_tokens,
        log_verbose=a.log_verbose,
        max_prefill_tokens=a.max_prefill_tokens,
        max_decode_batch=a.max_decode_batch,
        stream_interval_s=a.stream_interval_s,
        scheduler=a.scheduler,
        openai_port=getattr(a, "openai_port", ServeConfig().openai_port),
    )


def openai_url(cfg: ServeConfig) -> str:
    return f"http://{cfg.host}:{cfg.openai_port}/v1" if cfg.openai_port else "off (--openai-port 0)"


def interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def cmd_serve(a: argparse.Namespace) -> int:
    from bucketserve.serving.launcher import TritonServer

    server = TritonServer(serve_config(a))
    # SIGTERM (docker stop, kill, a supervisor) shuts down as cleanly as Ctrl-C
    signal.signal(signal.SIGTERM, interrupt)
    print(f"starting tritonserver (log: {server.log_path}) ...", flush=True)
    with server:
        print(
            f"BucketServe ready: model={a.model} policy={a.policy}\n"
            f"  HTTP     http://{server.http_url}/v2/models/bucketserve/generate_stream\n"
            f"  gRPC     {server.grpc_url}  (models: bucketserve, bucketserve_bls)\n"
            f"  metrics  {server.metrics_url}\n"
            f"  OpenAI   {openai_url(server.cfg)}\n"
            f"Ctrl-C to stop.",
            flush=True,
        )
        try:
            server.proc.wait()
        except KeyboardInterrupt:
            print("\nstopping ...", flush=True)
    return 0 if server.proc.returncode in (0, -2, None) else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="bucketserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the Triton server")
    add_serve_args(serve)
    add_openai_args(serve)
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
