"""`bucketserve` command line: serve, generate, chat, simulate."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from bucketserve.serving.config import KNOWN_POLICIES, TOPOLOGIES, ServeConfig

DEVICES_HELP = "cpu or cuda:N (repeatable; default cpu)"

# The options of `serve`: (flag, add_argument keywords). The default, unless given, is
# ServeConfig's value of the option's dest; serve_config reads every dest back.
# fmt: off
SERVE_OPTIONS: tuple[tuple[str, dict], ...] = (
    ("--model", dict(help="HF checkpoint dir, .gguf file, 'smollm2' or dummy:<shape>")),
    ("--policy", dict(choices=KNOWN_POLICIES)),
    ("--topology", dict(
        choices=TOPOLOGIES,
        help="auto (default): colocated over the --prefill-devices and --decode-devices (one "
        "instance per CPU entry, one per GPU), which won every simulated SLO cell; "
        "disaggregated: prefill instances hand KV to decode instances; colocated: each "
        "--decode-devices instance runs fused decode + prompt-chunk iterations (no hand-off); "
        "hybrid: colocated instances over the devices of both roles whose budgets a "
        "controller sets (mixed, prefill-heavy, decode-only), decodes moving through the "
        "KV hand-off")),
    ("--hybrid-layout", dict(
        type=int,
        help="hybrid: -1 (default) adaptive; k >= 0 fixed: 0 every instance mixed, k the "
        "first k prefill-heavy and the rest decode-only")),
    ("--hybrid-period-s", dict(
        type=float, help="hybrid: seconds between the role controller's looks at attainment")),
    ("--hybrid-heavy-tokens", dict(
        type=int, help="hybrid: a prefill-heavy instance's prompt tokens per iteration")),
    ("--chunk-tokens", dict(
        type=int,
        help="colocated: tokens per iteration (every running decode's token, then prompt "
        "chunks); 0 (default): 32 per thread of a CPU instance, 512 on GPU")),
    ("--prefill-devices", dict(action="append", default=None, help=DEVICES_HELP)),
    ("--decode-devices", dict(action="append", default=None, help=DEVICES_HELP)),
    ("--host", {}),
    ("--http-port", dict(type=int)),
    ("--grpc-port", dict(
        type=int,
        help="the gRPC edge: Triton's gRPC protocol for the entry models (tritonserver's own"
        " gRPC listens on an internal loopback port; docs/security.md)")),
    ("--metrics-port", dict(type=int)),
    ("--run-dir", {}),
    ("--dtype", dict(
        help="auto: bfloat16 on GPUs and on CPUs with "
        "AVX512-BF16/AMX, else float32 (logged at start); or float32, bfloat16 (on AVX2-only "
        "CPUs bfloat16 decodes faster too: docs/measurements.md)")),
    ("--attention", {}),
    ("--block-size", dict(type=int)),
    ("--kv-cache-gb", dict(type=float)),
    ("--max-model-len", dict(type=int)),
    ("--gpu-memory-utilization", dict(
        type=float,
        help="GPU: share of total memory per engine instance (default 0.9 / instances)")),
    ("--cuda-graphs", dict(
        action=argparse.BooleanOptionalAction,
        help="GPU: replay decode steps as CUDA graphs (--no-cuda-graphs: eager)")),
    ("--prefix-caching", dict(
        dest="enable_prefix_caching", action=argparse.BooleanOptionalAction,
        help="reuse the KV of prompt prefixes shared across requests (--no-prefix-caching: off)")),
    ("--default-max-tokens", dict(type=int)),
    ("--log-verbose", dict(type=int)),
    ("--max-prefill-tokens", dict(type=int)),
    ("--max-decode-batch", dict(type=int)),
    ("--stream-interval-s", dict(type=float)),
    ("--scheduler", dict(
        type=json.loads, metavar="JSON",
        help='SchedulerConfig overrides, e.g. \'{"enable_bucketing": false}\' (ablations)')),
)

# Limits of the public endpoints, overload and shutdown (see README: Fault tolerance).
FAULT_OPTIONS: tuple[tuple[str, dict], ...] = (
    ("--max-request-bytes", dict(
        type=int, help="HTTP request bodies above this get 413 before reaching Triton")),
    ("--max-queued-requests", dict(
        type=int,
        help="requests waiting for prefill beyond this get 'server busy' (503); 0: from memory")),
    ("--max-concurrent-requests", dict(
        type=int,
        help="inference requests in flight at the HTTP front beyond this get 'server busy' (503)"
        " at once, before reaching Triton; 0: no cap")),
    ("--drain-timeout-s", dict(
        type=float, help="on SIGTERM/SIGINT, how long in-flight requests may still finish")),
    ("--canary-interval-s", dict(
        type=float, help="send a 2-token canary request through every stage this often; 0: off")),
    ("--canary-timeout-s", dict(
        type=float,
        help="a canary with no answer in this time (while no other request finished) fails;"
        " two failures in a row restart the server, readiness naming the cause")),
)
# fmt: on


def dest(flag: str, kw: dict) -> str:
    """The Namespace attribute (and ServeConfig field) an option fills."""
    return kw.get("dest", flag.removeprefix("--").replace("-", "_"))


def add_options(p: argparse.ArgumentParser, options, d: argparse.Namespace) -> None:
    """Declare `options`, each defaulting to its ServeConfig field unless it names a default."""
    for flag, kw in options:
        p.add_argument(flag, **{"default": getattr(d, dest(flag, kw)), **kw})


def declared_defaults() -> argparse.Namespace:
    """ServeConfig's field defaults as declared, before __post_init__ resolves any (an
    instance's `topology` is already resolved from "auto", with its devices: defaults taken
    from one would make every `bucketserve serve` pass the resolved pair back, minus devices)."""
    return argparse.Namespace(**{
        f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
        for f in dataclasses.fields(ServeConfig)
    })  # fmt: skip


def add_serve_args(p: argparse.ArgumentParser) -> None:
    d = declared_defaults()
    add_options(p, SERVE_OPTIONS, d)
    add_fault_args(p, d)


def add_fault_args(p: argparse.ArgumentParser, d: argparse.Namespace) -> None:
    """Limits of the public endpoints, overload and shutdown (see README: Fault tolerance)."""
    add_options(p, FAULT_OPTIONS, d)


def fault_fields(a: argparse.Namespace) -> dict:
    return {dest(flag, kw): getattr(a, dest(flag, kw)) for flag, kw in FAULT_OPTIONS}


def add_security_args(p: argparse.ArgumentParser) -> None:
    """Keys of the public endpoints (docs/security.md); the environment keeps them off `ps`."""
    env = os.environ.get
    add_options(p, (
        ("--api-key", dict(
            default=env("BUCKETSERVE_API_KEY", ""),
            help="require 'Authorization: Bearer KEY' on v2 and OpenAI routes and the gRPC header"
            " 'triton-grpc-protocol-api-key: KEY' (default $BUCKETSERVE_API_KEY; health and metrics"
            " stay open)")),
        ("--metrics-need-api-key", dict(
            action="store_true",
            help="with --api-key, the edge's /metrics needs it too (health probes never do)")),
        ("--admin-key", dict(
            default=env("BUCKETSERVE_ADMIN_KEY", ""),
            help="open Triton's shared-memory, repository, trace and logging APIs to requests with"
            " the header 'admin-key: KEY' (gRPC: 'triton-grpc-protocol-admin-key'); default"
            " $BUCKETSERVE_ADMIN_KEY, unset: closed (403)")),
    ), declared_defaults())  # fmt: skip


def add_openai_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--openai-port", type=int, default=declared_defaults().openai_port,
        help="a second port of the HTTP edge for the OpenAI-compatible API (/v1/chat/completions"
        " ...; also served on --http-port); 0: the HTTP port only",
    )  # fmt: skip


# Fields whose options only `serve` declares: a Namespace without them gets ServeConfig's value.
OPTIONAL_FIELDS = ("openai_port", "admin_key", "api_key", "metrics_need_api_key")


def serve_config(a: argparse.Namespace) -> ServeConfig:
    d = declared_defaults()
    fields = {dest(flag, kw): getattr(a, dest(flag, kw)) for flag, kw in SERVE_OPTIONS}
    fields.update(fault_fields(a), prefill_devices=a.prefill_devices or ["cpu"],
                  decode_devices=a.decode_devices or ["cpu"])  # fmt: skip
    fields.update({name: getattr(a, name, getattr(d, name)) for name in OPTIONAL_FIELDS})
    return ServeConfig(**fields)


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
