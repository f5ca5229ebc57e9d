"""`bucketserve generate` and `bucketserve chat`: the command-line client of a running server."""

from __future__ import annotations

import argparse
import sys

from bucketserve_client.chat import cmd_chat, stream_answer
from bucketserve_client.client import Client
from bucketserve_client.params import MODELS, SLO_CLASSES, GenerationParams
from bucketserve_client.response import Completion, GenerationError

DEFAULT_URL = "127.0.0.1:8001"
# GenerationParams fields that take their flag's value as is
FLAG_FIELDS = ("max_tokens", "min_tokens", "temperature", "top_p", "top_k", "seed", "slo_class")


def add_request_args(p: argparse.ArgumentParser) -> None:
    """Connection and sampling options; unset ones leave the server's defaults in force."""
    p.add_argument("--url", default=DEFAULT_URL, help="gRPC address of the server (host:port)")
    p.add_argument(
        "--model",
        default=MODELS[0],
        choices=MODELS,
        help="the ensemble, or the BLS model (forwards cancellation into decoding)",
    )
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--min-tokens", type=int)
    p.add_argument("--temperature", type=float, help="0 is greedy")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--stop",
        nargs="+",
        action="extend",
        default=[],
        metavar="WORD",
        help="stop words (end the answer before any of them)",
    )
    p.add_argument("--slo-class", choices=SLO_CLASSES)
    p.add_argument(
        "--no-chat-template",
        action="store_true",
        help="send the text as is instead of wrapping it in the model's chat template",
    )
    p.add_argument("--timeout", type=float, help="seconds before the request is abandoned")
    p.add_argument("--stats", action="store_true", help="print token counts and timings to stderr")


def build_parser() -> argparse.ArgumentParser:
    """The parser of both subcommands (one source of CLI defaults: the server's)."""
    parser = argparse.ArgumentParser(prog="bucketserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="send one prompt, print the answer")
    gen.add_argument("prompt")
    gen.add_argument("--stream", action="store_true", help="print the answer as it is generated")
    add_request_args(gen)
    chat = sub.add_parser("chat", help="interactive chat (/exit to leave, Ctrl-C cancels)")
    chat.add_argument(
        "--tokenizer",
        default="auto",
        help="local tokenizer dir for multi-turn prompts; 'auto' looks for the "
        "default model's; 'none' sends each message on its own",
    )
    add_request_args(chat)
    return parser


def params_from_args(a: argparse.Namespace) -> GenerationParams:
    """GenerationParams from the parsed flags; the chat template is on unless --no-chat-template."""
    return GenerationParams(
        **{name: getattr(a, name) for name in FLAG_FIELDS},
        stop_words=tuple(a.stop),
        apply_chat_template=not a.no_chat_template,
    )


def print_stats(c: Completion) -> None:
    """Token counts and timings of a completion, on stderr."""
    print(
        f"[{c.finish_reason or 'no finish_reason'}: {c.num_input_tokens} prompt tokens, "
        f"{c.num_output_tokens} output tokens, ttft {c.ttft_s:.3f}s, "
        f"total {c.latency_s:.3f}s]",
        file=sys.stderr,
    )


def cmd_generate(a: argparse.Namespace) -> int:
    """`bucketserve generate`: one prompt, the answer on stdout (streamed with --stream)."""
    client = Client(a.url, a.model, timeout_s=a.timeout)
    params = params_from_args(a)
    if not a.stream:
        completion = client.generate(a.prompt, params)
        print(completion.text, flush=True)
    else:
        completion = stream_answer(client, a.prompt, params, sys.stdout)
    if a.stats:
        print_stats(completion)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; argv[0] is the subcommand ('generate' or 'chat'). Returns the exit code."""
    try:
        a = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # --help or a usage error, already printed by argparse
        return e.code if isinstance(e.code, int) else 2
    try:
        if a.command == "generate":
            return cmd_generate(a)
        return cmd_chat(a, params_from_args(a))
    except (GenerationError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\n[cancelled]", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
