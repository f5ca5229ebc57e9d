"""Parity prompts: chat-templated and raw, 1 to ~1,500 tokens, long ones from stdlib sources."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

CHAT_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain recursion in one sentence.",
    "List three primary colors.",
    "What is 17 times 23?",
    "Translate 'good morning' into Spanish and German.",
    "Who wrote Hamlet, and when?",
    "Give me a Python function that reverses a string.",
]
RAW_TEXTS = [
    "The",
    "Once upon a time",
    "def fibonacci(n):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "1, 2, 3, 4, 5,",
    "In 1969, the first humans",
    "import numpy as np\nimport torch\n\n",
    "Q: What is the boiling point of water?\nA:",
]
# (stdlib module, number of tokens to keep)
SOURCE_PROMPTS = [("textwrap", 120), ("json.decoder", 350), ("string", 600), ("shlex", 900),
                  ("heapq", 1200), ("argparse", 1500)]  # fmt: skip


@dataclass(frozen=True)
class Prompt:
    """One parity prompt; chat prompts stop at EOS, raw ones always run MAX_NEW_TOKENS (conftest)."""

    name: str
    token_ids: tuple[int, ...]
    stops_at_eos: bool


def build_prompts(tokenizer) -> list[Prompt]:
    """About two dozen prompts of 1 to ~1,500 tokens."""
    import importlib

    prompts = []
    for i, question in enumerate(CHAT_QUESTIONS):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                            add_generation_prompt=True, return_dict=False)  # fmt: skip
        prompts.append(Prompt(f"chat{i}", tuple(ids), True))
    convo = [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "Name a planet with rings."}]  # fmt: skip
    prompts.append(Prompt("chat-multi", tuple(tokenizer.apply_chat_template(
        convo, add_generation_prompt=True, return_dict=False)), True))  # fmt: skip
    for i, text in enumerate(RAW_TEXTS):
        prompts.append(Prompt(f"raw{i}", tuple(tokenizer(text).input_ids), False))
    for module, length in SOURCE_PROMPTS:
        source = inspect.getsource(importlib.import_module(module))
        ids = tokenizer(source).input_ids[:length]
        prompts.append(Prompt(f"src-{module}", tuple(ids), False))
    return prompts
