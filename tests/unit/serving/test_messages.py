"""The internal messages: one codec that names the bad field, a seal a client cannot forge."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.serving.contract import GenerateParams
from bucketserve.serving.core import messages
from bucketserve.serving.core.messages import (
    RUN_SECRET_ENV,
    ForgedMessage,
    Handoff,
    MessageError,
    PackedDelta,
    PrefillBatch,
    PrefillReply,
    PrefillResult,
    decode,
    encode,
    open_message,
    seal,
    seal_message,
    unseal,
)
from hypothesis import given, settings
from hypothesis import strategies as st

MESSAGES = (GenerateParams, Handoff, PrefillBatch, PrefillReply, PackedDelta)


@pytest.fixture(autouse=True)
def run_secret(monkeypatch):
    monkeypatch.setenv(RUN_SECRET_ENV, "a" * 64)


def handoff() -> Handoff:
    params = GenerateParams(request_id="r1", sampling=SamplingParams(max_tokens=4, seed=3,
                            stop_token_ids=(7,), bad_words_ids=((1, 2),)), ttft_slo_s=0.5)  # fmt: skip
    return Handoff("generate", params, prompt_ids=[1, 2, 3], first_token=9, prefill_index=0,
                   handoff_id=4, block_ids=[5, 6], first_logprob=[-0.1, [9], [-0.1]])  # fmt: skip


def test_every_message_round_trips():
    reply = PrefillReply(1, [PrefillResult(9, [0, 1], 3, None, 16)], 0.25)
    for msg in (handoff(), handoff().params, PrefillBatch.of([handoff().params]), reply,
                PackedDelta("hé\u2028", "stop", 3, 1, [{"9": {"logprob": -0.1}}], -0.1, 16)):  # fmt: skip
        assert decode(type(msg), encode(msg)) == msg
        assert open_message(type(msg), seal_message(msg)) == msg


def test_messages_name_no_shared_memory_segment():
    assert "pool" not in json.loads(encode(handoff()))
    assert {"pool", "handoff_table"}.isdisjoint(json.loads(encode(PrefillReply(0, [], 0.0))))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{", "Handoff: not JSON"),
        (b"[]", "Handoff: expected an object"),
        (b'{"kind": "generate"}', "Handoff: .*missing 1 required positional argument: 'params'"),
        (b'{"kind": "steal", "params": {}}', "Handoff: kind must be one of"),
        (b'{"kind": "generate", "params": {}, "pool": "/bs_x"}', "Handoff: unknown field 'pool'"),
        (
            b'{"kind": "generate", "params": {}, "block_ids": [1, "2"]}',
            r"Handoff.block_ids\[1\]: expected int, got '2'",
        ),  # fmt: skip
        (
            b'{"kind": "generate", "params": {}, "block_ids": [true]}',
            r"Handoff.block_ids\[0\]: expected int, got True",
        ),  # fmt: skip
        (
            b'{"kind": "generate", "params": {"sampling": {"top_p": 7}}}',
            r"Handoff.params.sampling: top_p must be in \(0, 1\]",
        ),  # fmt: skip
        (
            b'{"kind": "generate", "params": {"sampling": []}}',
            "Handoff.params.sampling: expected an object",
        ),  # fmt: skip
    ],
)
def test_a_malformed_message_names_the_field(raw, message):
    with pytest.raises(MessageError, match=message):
        decode(Handoff, raw)


def test_the_seal_binds_the_message_and_its_tensors(monkeypatch):
    ids = np.asarray([1, 2, 3], dtype=np.int32)
    sealed = seal_message(handoff().params, ids.tobytes())
    assert open_message(GenerateParams, sealed, ids.tobytes()) == handoff().params
    cases = [
        encode(handoff().params),  # well-formed, built with our classes, not sealed
        sealed.replace(b'"r1"', b'"r2"'),  # payload changed
        sealed[:10] + (b"0" if sealed[10:11] != b"0" else b"1") + sealed[11:],  # MAC changed
    ]
    for raw in cases:
        with pytest.raises(ForgedMessage, match="^refused: not a message from this server$"):
            open_message(GenerateParams, raw, ids.tobytes())
    with pytest.raises(ForgedMessage):  # moved onto other token ids
        open_message(GenerateParams, sealed, np.asarray([1, 2, 4], np.int32).tobytes())
    with pytest.raises(ForgedMessage):  # the bound parts cannot be re-split either
        unseal(seal(b"ab", b"c"), b"", b"c")
    monkeypatch.setenv(RUN_SECRET_ENV, "b" * 64)  # another run (or a guess) of the secret
    with pytest.raises(ForgedMessage):
        open_message(GenerateParams, sealed, ids.tobytes())


def test_no_secret_no_messages(monkeypatch):
    monkeypatch.delenv(RUN_SECRET_ENV)
    with pytest.raises(RuntimeError, match=f"{RUN_SECRET_ENV} is not set"):
        seal(b"x")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(MESSAGES))
def test_random_bytes_are_refused_cleanly(raw, cls):
    with pytest.raises(MessageError):
        open_message(cls, raw)
    try:  # unsealed decoding: a clean MessageError or a message, never another exception
        decode(cls, raw)
    except MessageError:
        pass


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


def field_mutations():
    """A valid hand-off with one field (at some depth) replaced by arbitrary JSON."""
    base = json.loads(encode(handoff()))
    keys = [("", k) for k in base] + [("params", k) for k in base["params"]]
    keys += [("sampling", k) for k in base["params"]["sampling"]]
    return st.tuples(st.sampled_from(keys), JSON).map(lambda kv: mutate(base, *kv))


def mutate(base: dict, where: tuple[str, str], value) -> bytes:
    obj = json.loads(json.dumps(base))
    target = {"": obj, "params": obj["params"], "sampling": obj["params"]["sampling"]}[where[0]]
    target[where[1]] = value
    return json.dumps(obj).encode()


@settings(max_examples=400, deadline=None)
@given(field_mutations())
def test_mutated_fields_parse_or_are_named(raw):
    try:
        msg = decode(Handoff, raw)
    except MessageError as e:
        assert str(e).startswith("Handoff")
    else:  # what parses is a well-typed message
        assert isinstance(msg.params.sampling, SamplingParams)
        assert all(type(b) is int for b in msg.block_ids + msg.prompt_ids)
        assert decode(Handoff, encode(msg)) == msg


def test_mac_is_checked_before_parsing(monkeypatch):
    """A forged message is never parsed: the refusal comes before any JSON is read."""
    calls = []
    monkeypatch.setattr(messages, "decode", lambda *a: calls.append(a))
    with pytest.raises(ForgedMessage):
        open_message(Handoff, b'{"kind": "generate", "params": {}}')
    assert calls == []
