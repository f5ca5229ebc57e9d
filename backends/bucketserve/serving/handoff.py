"""The internal messages between scheduler, prefill and decode (JSON in BYTES tensors)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.serving.contract import GenerateParams

KIND_GENERATE = "generate"  # KV is waiting in a prefill pool: pull it and decode
KIND_STOP = "stop"  # cancel the running request named by `target`
KIND_CANCELLED = "cancelled"  # cancelled before prefill: answer FINAL at once


@dataclass(slots=True)
class Handoff:
    """What decode needs to continue a request prefilled elsewhere: only metadata moves."""

    kind: str
    params: GenerateParams
    prompt_ids: list[int] = field(default_factory=list)
    first_token: int = -1
    prefill_index: int = -1
    decode_index: int = 0  # the decode instance the scheduler placed it on (model decode_<i>)
    pool: str = ""  # PoolHandle JSON of the prefill instance's KV pool
    handoff_table: str = ""  # shared-memory name of that instance's ack table
    handoff_id: int = -1
    block_ids: list[int] = field(default_factory=list)
    target: str = ""  # request id to stop (KIND_STOP)
    sched_key: str = ""  # the scheduler's key, reported back when decode finishes
    arrival_s: float = 0.0  # wall-clock arrival at the scheduler (time.time())
    prefill_done_s: float = 0.0  # wall-clock end of prefill
    first_logprob: list | None = None  # [logprob, top ids, top logprobs] of first_token
    num_cached_tokens: int = 0  # prompt tokens the prefill instance found in its prefix cache

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Handoff:
        obj = json.loads(text)
        obj["params"] = GenerateParams.from_dict(obj["params"])
        return cls(**obj)


def sampling_rows_json(params: list[GenerateParams]) -> str:
    """The sampling records of a packed prefill batch, as they are (one per sequence)."""
    return json.dumps([asdict(p.sampling) for p in params])


def sampling_rows(text: str | bytes) -> list[SamplingParams]:
    return [SamplingParams(**row) for row in json.loads(text)]


def cache_salts_json(params: list[GenerateParams]) -> str:
    """The cache salts of a packed prefill batch (None: no salt), one per sequence."""
    return json.dumps([p.cache_salt for p in params])


@dataclass(slots=True)
class PrefillResult:
    """Per-sequence outcome of a prefill batch."""

    first_token: int
    block_ids: list[int]
    handoff_id: int
    logprob: list | None = None  # [logprob, top ids, top logprobs] when the request asked
    num_cached_tokens: int = 0  # prompt tokens found in the prefill instance's prefix cache


@dataclass(slots=True)
class PrefillReply:
    """The `prefill` model's answer to one packed batch."""

    index: int
    pool: str
    handoff_table: str
    results: list[PrefillResult]
    duration_s: float
    error: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> PrefillReply:
        obj = json.loads(text)
        obj["results"] = [PrefillResult(**r) for r in obj["results"]]
        return cls(**obj)
