"""The internal messages between the Triton models, one codec for all, sealed per run.

Every message is a dataclass; `encode` writes it as JSON, `decode` reads it back checking each
field against the dataclass's annotations (a wrong type, an unknown or malformed field is a
`MessageError` naming the field, never a crash deeper in). Whatever a model receives from
another model is sealed: an HMAC over the message and the tensors it travels with, keyed by a
secret the launcher draws for each start of `tritonserver` and hands to the stubs through the
environment (`RUN_SECRET_ENV`; never on disk, never on a command line). An internal model
unseals before doing any work, so a client that calls `prefill_<i>`, `decode_<i>`,
`decode_router` or `scheduler` directly over Triton's gRPC port is refused
(docs/security.md). Messages name no shared-memory segment: decode finds a prefill
instance's KV pool by its index (`serving/core/kv_intake.py`).

    request    preprocessing -> scheduler        `_params` (GenerateParams) + `_input_ids`
    batch      scheduler -> prefill_<i>          `sampling` (PrefillBatch) + ids, lengths
    reply      prefill_<i> -> scheduler          `result` (PrefillReply)
    hand-off   scheduler -> decode (router)      `_handoff` (Handoff: generate/stop/cancelled)
    delta      decode_<i> -> relays              `_delta` (PackedDelta)
    migration  decode_<i> -> relay -> decode_<j> a PackedDelta MIGRATED carrying a Handoff
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import types
import typing
from dataclasses import dataclass, field
from functools import cache

from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.serving.contract import GenerateParams

RUN_SECRET_ENV = "BUCKETSERVE_RUN_SECRET"
SEAL_PREFIX = b"bs1:"
MAC_CHARS = 32  # 128 bits of HMAC-SHA256, hex
REFUSED = "refused: not a message from this server"

KIND_GENERATE = "generate"  # KV is waiting in a prefill pool (or a colocated prompt): decode it
KIND_STOP = "stop"  # cancel the running request named by `target`
KIND_CANCELLED = "cancelled"  # cancelled before prefill: answer FINAL at once
KINDS = (KIND_GENERATE, KIND_STOP, KIND_CANCELLED)
# The finish reason of a decode instance's stream whose request moved to another instance
# (hybrid): its one packed response carries the sealed hand-off the relay follows. Never
# reaches a client.
MIGRATED = "migrated"
SOURCE_ROLES = ("prefill", "decode")


class MessageError(ValueError):
    """A message that does not parse as its type; the text names the field."""


class ForgedMessage(MessageError):
    """A message without this run's seal: it did not come from the server itself."""


# ---- the messages ---------------------------------------------------------------------------


@dataclass(slots=True)
class Handoff:
    """What decode needs to continue a request prefilled elsewhere: only metadata moves."""

    kind: str
    params: GenerateParams
    prompt_ids: list[int] = field(default_factory=list)
    first_token: int = -1
    # whose KV pool holds the KV: source_role + index (a prefill instance's prompt, or a hybrid
    # instance's whole sequence when its decode moves); -1: none (colocated prompt, stop)
    prefill_index: int = -1
    source_role: str = "prefill"
    decode_index: int = 0  # the decode instance the scheduler placed it on (model decode_<i>)
    handoff_id: int = -1  # slot in that prefill instance's ack table
    block_ids: list[int] = field(default_factory=list)
    target: str = ""  # request id to stop (KIND_STOP)
    sched_key: str = ""  # the scheduler's key, reported back when decode finishes
    arrival_s: float = 0.0  # wall-clock arrival at the scheduler (time.time())
    prefill_done_s: float = 0.0  # wall-clock end of prefill
    first_logprob: list | None = None  # [logprob, top ids, top logprobs] of first_token
    num_cached_tokens: int = 0  # prompt tokens the prefill instance found in its prefix cache
    ttft_slo_s: float = 0.0  # the request's SLOs as the scheduler resolved them (0: none)
    tpot_slo_s: float = 0.0
    # A decode moved between hybrid instances (source_role "decode"): what it generated so far,
    # how much of its text the source's detokenizer had released, and what its relay had not
    # yet sent (the next instance's relay sends it first).
    output_ids: list[int] = field(default_factory=list)
    text_sent: int = 0
    first_token_s: float = 0.0  # wall time its first token went out
    carry_text: str = ""
    carry_logprobs: list = field(default_factory=list)
    carry_cum_logprob: float = 0.0
    echoed: bool = False  # the prompt echo (if asked) is part of what was sent or carried
    migrations: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.source_role not in SOURCE_ROLES:
            raise ValueError(f"source_role must be one of {SOURCE_ROLES}, got {self.source_role!r}")

    @property
    def is_migration(self) -> bool:
        """A running decode moved here from another hybrid instance."""
        return self.source_role == "decode" and self.prefill_index >= 0


@dataclass(slots=True)
class PrefillBatch:
    """What a packed prefill batch needs besides its token ids: one entry per sequence."""

    sampling: list[SamplingParams]
    cache_salts: list[str | None]  # None: no salt

    def __post_init__(self) -> None:
        if len(self.sampling) != len(self.cache_salts):
            raise ValueError(
                f"sampling has {len(self.sampling)} rows, cache_salts {len(self.cache_salts)}"
            )

    @classmethod
    def of(cls, params: list[GenerateParams]) -> PrefillBatch:
        return cls([p.sampling for p in params], [p.cache_salt for p in params])


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
    results: list[PrefillResult]
    duration_s: float
    error: str = ""


@dataclass(slots=True, frozen=True)
class PackedDelta:
    """What one decode response says: the user outputs before they become tensors."""

    text: str
    finish_reason: str
    num_input_tokens: int
    num_output_tokens: int
    logprobs: list = field(default_factory=list)  # vLLM-style entries, one per token
    cum_logprob: float = 0.0
    num_cached_tokens: int = 0
    handoff: str = ""  # finish_reason MIGRATED: the sealed hand-off to the next instance


# ---- the codec ------------------------------------------------------------------------------


def encode(msg) -> bytes:
    """A message as compact JSON."""
    return json.dumps(dataclasses.asdict(msg), separators=(",", ":")).encode()


def decode(cls: type, raw: bytes | str):
    """The message of type `cls` in `raw`; MessageError naming the field if it is not one."""
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, TypeError) as e:
        raise MessageError(f"{cls.__name__}: not JSON ({e})") from None
    return _build(cls, obj, cls.__name__)


@cache
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


def _short(value) -> str:
    return repr(value)[:60]


def _build(tp, value, path: str):
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise MessageError(f"{path}: expected an object, got {_short(value)}")
        hints = _hints(tp)
        unknown = sorted(set(value) - set(hints))
        if unknown:
            raise MessageError(f"{path}: unknown field {unknown[0]!r}")
        args = {k: _build(hints[k], v, f"{path}.{k}") for k, v in value.items()}
        try:
            return tp(**args)
        except (TypeError, ValueError) as e:  # a missing field, a value its type refuses
            raise MessageError(f"{path}: {e}") from None
    origin, params = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in params:
            return None
        (inner,) = [p for p in params if p is not type(None)]
        return _build(inner, value, path)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise MessageError(f"{path}: expected a list, got {_short(value)}")
        inner = params[0] if params else None
        items = value if inner is None else [
            _build(inner, v, f"{path}[{i}]") for i, v in enumerate(value)
        ]  # fmt: skip
        return tuple(items) if origin is tuple else items
    if tp in (list, tuple):  # untyped: plain JSON content (logprob entries)
        if not isinstance(value, list):
            raise MessageError(f"{path}: expected a list, got {_short(value)}")
        return value
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif tp is str:
        ok = isinstance(value, str)
    else:
        raise MessageError(f"{path}: no codec for {tp!r}")
    if not ok:
        raise MessageError(f"{path}: expected {tp.__name__}, got {_short(value)}")
    return value


# ---- the seal -------------------------------------------------------------------------------


def new_run_secret() -> str:
    """A fresh secret for one start of tritonserver (the launcher's)."""
    return secrets.token_hex(32)


def _key() -> bytes:
    key = os.environ.get(RUN_SECRET_ENV, "")
    if len(key) < 32:
        raise RuntimeError(
            f"{RUN_SECRET_ENV} is not set: the internal models run only under `bucketserve serve`"
        )
    return key.encode()


def _mac(payload: bytes, bound: tuple[bytes, ...]) -> bytes:
    h = hmac.new(_key(), digestmod=hashlib.sha256)
    for part in (payload, *bound):  # length-prefixed: no two splits give the same input
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()[:MAC_CHARS].encode()


def seal(payload: bytes, *bound: bytes) -> bytes:
    """`payload` with this run's MAC over it and the `bound` bytes (the tensors it travels
    with: a message cannot be moved onto other token ids)."""
    return SEAL_PREFIX + _mac(payload, bound) + b":" + payload


def unseal(sealed: bytes | str, *bound: bytes) -> bytes:
    """The payload of a sealed message; ForgedMessage unless this run sealed it with `bound`."""
    if isinstance(sealed, str):
        sealed = sealed.encode("utf-8", "surrogateescape")
    head = len(SEAL_PREFIX) + MAC_CHARS
    if not isinstance(sealed, bytes) or not sealed.startswith(SEAL_PREFIX) or sealed[head:head + 1] != b":":  # fmt: skip
        raise ForgedMessage(REFUSED)
    payload = sealed[head + 1 :]
    if not hmac.compare_digest(sealed[len(SEAL_PREFIX) : head], _mac(payload, bound)):
        raise ForgedMessage(REFUSED)
    return payload


def seal_message(msg, *bound: bytes) -> bytes:
    return seal(encode(msg), *bound)


def open_message(cls: type, sealed: bytes | str, *bound: bytes):
    """Unseal, then decode: a forged message is refused before it is even parsed."""
    return decode(cls, unseal(sealed, *bound))
