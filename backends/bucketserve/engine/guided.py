"""Structured output, part 1: a guide (SamplingParams.guide_type / guide) as an xgrammar
grammar, checked without a tokenizer, and compiled once per guide for one tokenizer.

xgrammar is imported on first use: servers that never see a guided request never pay for it.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from bucketserve.engine.sampling_params import SamplingParams

GRAMMAR_CACHE_SIZE = 64  # compiled grammars kept per engine instance (LRU)
# How each guide type is named to users (errors name the field they sent).
GUIDE_FIELDS = {
    "json": "JSON schema",
    "json_object": "JSON object grammar",
    "regex": "regex",
    "choice": "choice list",
    "grammar": "EBNF grammar",
}


def check_guide(params: SamplingParams) -> None:
    """ValueError naming the problem when the request's guide does not make a grammar (the
    boundary calls this so a bad schema is a 400 before any generation)."""
    if params.is_guided:
        build_grammar(params.guide_type, params.guide)


def build_grammar(guide_type: str, guide: str):
    """The tokenizer-free xgrammar.Grammar of one guide."""
    import xgrammar as xgr

    try:
        if guide_type == "json":
            # Compact separators: a small model offered free whitespace may emit it forever.
            return xgr.Grammar.from_json_schema(_schema(guide), any_whitespace=False)
        if guide_type == "json_object":
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False,
                                                strict_mode=False)  # fmt: skip
        if guide_type == "regex":
            return xgr.Grammar.from_regex(guide)
        if guide_type == "choice":
            return xgr.Grammar.from_ebnf(choice_ebnf(guide))
        if guide_type == "grammar":
            return xgr.Grammar.from_ebnf(guide)
    except (RuntimeError, ValueError, TypeError) as e:  # xgrammar raises all three
        raise ValueError(f"{GUIDE_FIELDS[guide_type]} is invalid: {_first_line(e)}") from None
    raise ValueError(f"guide_type must be one of {tuple(GUIDE_FIELDS)}, got {guide_type!r}")


def _schema(guide: str) -> str:
    try:
        schema = json.loads(guide)
    except json.JSONDecodeError as e:
        raise ValueError(f"is not JSON: {e}") from None
    if not isinstance(schema, dict | bool):
        raise ValueError(f"must be a JSON object, got {type(schema).__name__}")
    return guide


def choice_ebnf(guide: str) -> str:
    """`root ::= "a" | "b"` for a JSON list of strings (JSON escapes are EBNF escapes)."""
    try:
        choices = json.loads(guide)
    except json.JSONDecodeError as e:
        raise ValueError(f"is not a JSON list: {e}") from None
    if (
        not isinstance(choices, list)
        or not choices
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise ValueError(f"must be a non-empty list of non-empty strings, got {guide!r}")
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _first_line(e: Exception) -> str:
    """xgrammar's message without its `[hh:mm:ss] /project/cpp/file.cc:123: ` prefix."""
    text = (str(e).strip() or type(e).__name__).splitlines()[0]
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", text)[:300]


class GrammarCache:
    """Compiled grammars of one tokenizer: an LRU keyed by guide. Compilation runs on one
    background thread, so a request's grammar compiles while its prompt runs through the model
    (`prefetch` at arrival, `get` at its first sample)."""

    def __init__(self, tokenizer_dir: Callable[[], str], vocab_size: int,
                 stop_token_ids: tuple[int, ...], size: int = GRAMMAR_CACHE_SIZE) -> None:  # fmt: skip
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.tokenizer_dir, self.vocab_size = tokenizer_dir, vocab_size
        self.stop_token_ids, self.size = tuple(stop_token_ids), size
        self._futures: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._compiler = None  # xgrammar.GrammarCompiler, built on the pool's thread
        self.num_compiled = 0

    def prefetch(self, params: SamplingParams) -> Future:
        """Start compiling `params`' guide unless it is cached or under way."""
        key = params.guide_key
        with self._lock:
            future = self._futures.get(key)
            if future is not None and not (future.done() and future.exception()):
                self._futures.move_to_end(key)
                return future
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
            future = self._pool.submit(self._compile, key)
            self._futures[key] = future
            while len(self._futures) > self.size:
                self._futures.popitem(last=False)
            return future

    def get(self, params: SamplingParams):
        """The compiled grammar (xgrammar.CompiledGrammar), waiting for its compilation."""
        return self.prefetch(params).result()

    def _compile(self, key: tuple[str, str]):
        if self._compiler is None:
            self._compiler = self._build_compiler()
        grammar = build_grammar(*key)
        compiled = self._compiler.compile_grammar(grammar)
        self.num_compiled += 1
        return compiled

    def _build_compiler(self):
        import xgrammar as xgr
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir())
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=list(self.stop_token_ids)
        )
        # Two threads at most: engine instances share the CPU (one per core is the rule).
        return xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    def close(self) -> None:
        """Stop the compile thread (waits for a compilation under way)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
