"""`bucketserve chat`: an interactive REPL, multi-turn when a local tokenizer is at hand.

The server wraps text_input in a single-turn chat template. With a local tokenizer (the default
model's, cached by `bucketserve serve`, or --tokenizer DIR) the whole conversation is rendered
here with that tokenizer's chat template and sent with apply_chat_template=false. Without one,
each message is sent on its own with apply_chat_template=true (single-turn, no memory).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TextIO

from bucketserve_client.client import Client
from bucketserve_client.params import GenerationParams
from bucketserve_client.response import Collector, Completion, GenerationError

DEFAULT_MODEL_DIR = "SmolLM2-135M-Instruct"  # where `bucketserve serve` caches its default model
BANNER = "/reset clears the conversation, /exit or Ctrl-D leaves, Ctrl-C cancels an answer."


def default_tokenizer_dir() -> str | None:
    """The default model's directory in $BUCKETSERVE_CACHE (~/.cache/bucketserve), if present."""
    root = os.environ.get(
        "BUCKETSERVE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "bucketserve")
    )
    path = os.path.join(root, "models", DEFAULT_MODEL_DIR)
    return path if os.path.isfile(os.path.join(path, "tokenizer_config.json")) else None


def load_tokenizer(spec: str):
    """A tokenizer with a chat template for 'auto' or a directory; None for 'none' or no luck."""
    path = None if spec == "none" else default_tokenizer_dir() if spec == "auto" else spec
    if path is None:
        return None
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as e:
        if spec == "auto":
            return None
        raise ValueError(f"tokenizer: cannot load {spec!r}: {e}") from None
    return tokenizer if getattr(tokenizer, "chat_template", None) else None


@dataclass(slots=True)
class Conversation:
    """The turns so far, and how the next message becomes one text_input."""

    tokenizer: object | None = None
    messages: list[dict[str, str]] = field(default_factory=list)

    @property
    def is_multi_turn(self) -> bool:
        """True when a tokenizer renders the whole conversation here."""
        return self.tokenizer is not None

    def prompt(self, text: str) -> str:
        """The text_input for the next message: the templated conversation, or the message."""
        if self.tokenizer is None:
            return text
        messages = [*self.messages, {"role": "user", "content": text}]
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def commit(self, text: str, answer: str) -> None:
        """Keep a finished turn (multi-turn mode only)."""
        if self.is_multi_turn:
            self.messages += [
                {"role": "user", "content": text},
                {"role": "assistant", "content": answer},
            ]

    def reset(self) -> None:
        """Forget the conversation."""
        self.messages.clear()


def stream_answer(client, prompt: str, params: GenerationParams, out: TextIO) -> Completion:
    """Print the deltas as they arrive; return the Completion they make up."""
    start = time.monotonic()
    collector = Collector("")
    chunks = client.stream(prompt, params)
    try:
        for chunk in chunks:
            out.write(chunk.text)
            out.flush()
            collector.add(chunk)
    finally:
        chunks.close()  # on Ctrl-C or an error: cancels the generation on the server
        out.write("\n")
        out.flush()
    return collector.completion(time.monotonic() - start)


def ask(client, params: GenerationParams, conv: Conversation, text: str, out: TextIO) -> None:
    """One turn: stream the answer, keep it in the conversation unless it failed."""
    if conv.is_multi_turn:
        params = replace(params, apply_chat_template=False)  # the prompt is already templated
    out.write("bot> ")
    try:
        completion = stream_answer(client, conv.prompt(text), params, out)
    except KeyboardInterrupt:
        out.write("[cancelled]\n")
        return
    except GenerationError as e:
        hint = " (/reset starts a shorter conversation)" if conv.messages else ""
        out.write(f"error: {e}{hint}\n")
        return
    conv.commit(text, completion.text)


def chat_loop(
    client,
    params: GenerationParams,
    conv: Conversation,
    read: Callable[[str], str] = input,
    out: TextIO = sys.stdout,
) -> int:
    """Read messages until /exit or end of input; returns the exit code."""
    while True:
        try:
            text = read("you> ").strip()
        except EOFError:
            out.write("\n")
            return 0
        except KeyboardInterrupt:  # at the prompt: a fresh line, as in a shell
            out.write("\n")
            continue
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            conv.reset()
            out.write("(conversation cleared)\n")
        elif text:
            ask(client, params, conv, text, out)


def cmd_chat(a: argparse.Namespace, params: GenerationParams) -> int:
    """`bucketserve chat`: pick the multi-turn or single-turn mode, say which, run the REPL."""
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    tokenizer = None if a.no_chat_template else load_tokenizer(a.tokenizer)
    mode = (
        f"multi-turn, chat template of {tokenizer.name_or_path}"
        if tokenizer is not None
        else "single-turn: each message is answered on its own"
    )
    print(f"BucketServe chat: {a.model} at {a.url} ({mode}).\n{BANNER}", flush=True)
    return chat_loop(Client(a.url, a.model, timeout_s=a.timeout), params, Conversation(tokenizer))
