"""Real English prompt text, cut to exact token lengths with the served model's tokenizer.

The corpus is the Python standard library's own documentation, present on every machine
with a Python install: the language-reference topics shipped in `pydoc_data.topics` and the
long docstrings of the top-level stdlib modules (files sorted, so the corpus is fixed for a
given Python build). Prompts are an instruction header plus a contiguous slice of it.
"""

from __future__ import annotations

import ast
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

MIN_DOCSTRING_CHARS = 200
DEFAULT_CORPUS_TOKENS = 400_000


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


def stdlib_documents() -> list[str]:
    """Language-reference topics, then module/class/function docstrings of the stdlib."""
    from pydoc_data.topics import topics

    docs = [topics[k] for k in sorted(topics)]
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.glob("*.py")):
        docs.extend(_docstrings(path))
    return docs


def _docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return []
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    found = (ast.get_docstring(n) for n in ast.walk(tree) if isinstance(n, kinds))
    return [d for d in found if d and len(d) >= MIN_DOCSTRING_CHARS]


def load_tokenizer(model: str = "smollm2") -> Any:
    """The served model's own tokenizer (the local checkpoint directory of `model`)."""
    from transformers import AutoTokenizer

    from bucketserve.engine.loader import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(model))


@dataclass(slots=True)
class TextSource:
    """A token-id view of the corpus; `prompt` returns real text of an exact token length."""

    tokenizer: Tokenizer
    ids: list[int]  # corpus token ids, documents separated by a blank line

    @classmethod
    def build(cls, tokenizer: Tokenizer, max_tokens: int = DEFAULT_CORPUS_TOKENS) -> TextSource:
        ids: list[int] = []
        sep = tokenizer.encode("\n\n", add_special_tokens=False)
        for doc in stdlib_documents():
            ids.extend(tokenizer.encode(doc, add_special_tokens=False))
            ids.extend(sep)
            if len(ids) >= max_tokens:
                break
        return cls(tokenizer, ids[:max_tokens])

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, header: str, num_tokens: int, offset: int) -> tuple[str, int]:
        """`header` + corpus text from `offset`, `num_tokens` long when re-tokenised (±1-2)."""
        head = self.tokenizer.encode(header, add_special_tokens=False) if header else []
        body_len = max(1, num_tokens - len(head))
        if body_len > len(self.ids):
            raise ValueError(f"prompt of {num_tokens} tokens exceeds the corpus ({len(self.ids)})")
        start = offset % max(1, len(self.ids) - body_len)
        text, actual = "", 0
        for _ in range(4):  # decode/re-encode round trips can merge or split a token
            text = self.tokenizer.decode(head + self.ids[start : start + body_len])
            actual = self.count(text)
            if actual == num_tokens or body_len <= 1:
                break
            body_len = max(1, body_len + num_tokens - actual)
        return text, actual
