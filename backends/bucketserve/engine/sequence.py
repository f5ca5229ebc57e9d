"""A request's token sequence and its KV block table (pure Python, no torch)."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from bucketserve.engine.sampling_params import SamplingParams

_seq_ids = itertools.count()


class SequenceStatus(enum.Enum):
    """Lifecycle of a sequence inside one engine instance."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


@dataclass(slots=True, eq=False)
class Sequence:
    """Prompt plus generated tokens. Only the BlockManager writes `block_table`."""

    token_ids: list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    seq_id: int | str = field(default_factory=lambda: next(_seq_ids))  # e.g. a request id
    num_prompt_tokens: int = -1
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV is in the pool (the scheduler advances it)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    cache_salt: str | None = None  # prefix caching: only sequences with equal salts share KV
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    block_hashes: list[int] = field(default_factory=list)  # of full blocks (the BlockManager's)

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("token_ids must hold at least 1 token, got 0")
        self.token_ids = list(self.token_ids)
        if self.num_prompt_tokens < 0:
            self.num_prompt_tokens = len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        """The prompt part of token_ids."""
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def completion_token_ids(self) -> list[int]:
        """The generated part of token_ids."""
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def last_token_id(self) -> int:
        """The newest token (the decode input)."""
        return self.token_ids[-1]

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens whose KV a forward pass still has to compute (1 for a decoding sequence)."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        """Status is FINISHED."""
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        """Add a generated token."""
        self.token_ids.append(int(token_id))


def check_stop(seq: Sequence, eos_token_ids, max_model_len: int) -> str | None:
    """The one stop rule: finish reason after the newest token ("stop" / "length"), or None.

    EOS (unless ignored) and stop ids end a request once min_tokens are out (the sampler masks
    them before that); max_tokens and the context length end it with "length". Stop *strings*
    are text, matched by the serving layer's detokenizer on top of this rule."""
    params, tokens = seq.sampling_params, seq.token_ids  # (once per token: no properties)
    done = len(tokens) - seq.num_prompt_tokens
    if done >= params.min_tokens and params.is_stop_token(tokens[-1], eos_token_ids):
        return "stop"
    if done >= params.max_tokens or len(tokens) >= max_model_len:
        return "length"
    return None


@dataclass(slots=True, frozen=True)
class Chunk:
    """Tokens [start, start + num_tokens) of `seq` to run through one forward pass."""

    seq: Sequence
    start: int
    num_tokens: int

    @property
    def is_last(self) -> bool:
        """This chunk reaches the sequence's newest token, so a token is sampled after it."""
        return self.start + self.num_tokens == self.seq.num_tokens


def finish(seq: Sequence, reason: str) -> None:
    """Mark `seq` finished with `reason`."""
    seq.status = SequenceStatus.FINISHED
    seq.finish_reason = reason
