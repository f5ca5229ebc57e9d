"""Structured output in the sampler: xgrammar masks on the SmolLM2 tokenizer, random logits."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from bucketserve.engine import loader
from bucketserve.engine.guided import GrammarCache, check_guide
from bucketserve.engine.sampler import Sampler, SampleRow
from bucketserve.engine.sampling_params import SamplingParams

VOCAB, EOS = 49152, 2
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "size": {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["n"],
        },  # fmt: skip
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
    },
    "required": ["ok", "color", "size", "tags"],
}


@pytest.fixture(scope="module")
def grammars():
    cache = GrammarCache(lambda: loader.resolve_model("smollm2"), VOCAB, (EOS,))
    yield cache
    cache.close()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(loader.resolve_model("smollm2"))


def guided(guide_type: str, guide: str = "", **kw) -> SamplingParams:
    return SamplingParams(guide_type=guide_type, guide=guide, max_tokens=200, **kw)


def step_logits(step: int, batch: int = 1) -> torch.Tensor:
    """Deterministic noise logits [batch, V]: the same step gives the same logits anywhere."""
    return torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(1000 + step))


def run(sampler: Sampler, params: SamplingParams, prompt: list[int], steps: int = 200,
        start: int = 0, favour: tuple[int, ...] = ()) -> list[int]:  # fmt: skip
    """Sample until EOS (included) or `steps`; `prompt` may already hold generated tokens.
    `favour`: ids given +10 (noise never closes a free-form string on its own)."""
    tokens = list(prompt)
    num_prompt = len(prompt) - start
    for step in range(start, steps):
        row = SampleRow(params, len(tokens) - num_prompt, (EOS,), tokens)
        logits = step_logits(step)
        logits[0, list(favour)] += 10.0
        tok = sampler(logits, [row]).tokens[0]
        tokens.append(tok)
        if tok == EOS:
            break
    return tokens[num_prompt:]


def text(tokenizer, tokens: list[int]) -> str:
    assert tokens[-1] == EOS, "the grammar must end with EOS within the budget"
    return tokenizer.decode(tokens[:-1])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_parses_and_validates(grammars, tokenizer, temperature):
    params = guided("json", json.dumps(SCHEMA), temperature=temperature, seed=7)
    out = text(tokenizer, run(Sampler(grammars=grammars), params, [1, 2, 3]))
    jsonschema.validate(json.loads(out), SCHEMA)


def test_json_object_regex_choice_and_grammar(grammars, tokenizer):
    sampler = Sampler(grammars=grammars)
    closing = (EOS, *tokenizer.convert_tokens_to_ids(["}", '"', ":", "1"]))
    obj = json.loads(text(tokenizer, run(sampler, guided("json_object"), [5], favour=closing)))
    assert isinstance(obj, dict)
    digits = text(tokenizer, run(sampler, guided("regex", r"[0-9]{3}-[a-c]{2}"), [5]))
    assert len(digits) == 6 and digits[3] == "-" and digits[:3].isdigit()
    choice = text(tokenizer, run(sampler, guided("choice", json.dumps(["yes", "no"])), [5]))
    assert choice in ("yes", "no")
    ebnf = 'root ::= "a" ("b" | "c")*'
    out = text(tokenizer, run(sampler, guided("grammar", ebnf), [5], favour=(EOS,)))
    assert out[0] == "a" and set(out[1:]) <= {"b", "c"}


def test_handoff_replay_continues_like_one_sampler(grammars):
    """Prefill samples token 1 in one instance, decode continues in another from the tokens:
    the same output as one sampler throughout."""
    params = guided("json", json.dumps(SCHEMA), temperature=1.0, seed=3)
    whole = run(Sampler(grammars=grammars), params, [9, 9])
    first = run(Sampler(grammars=grammars), params, [9, 9], steps=1)
    decoded = run(Sampler(grammars=grammars), params, [9, 9] + first, start=1)
    assert decoded == whole and len(whole) > 10


def test_mask_comes_before_top_k_and_penalties(grammars, tokenizer):
    """top_k=1 on masked logits keeps the best *allowed* token; the other order would leave
    no token at all."""
    params = guided("choice", json.dumps(["no"]), temperature=1.0, top_k=1,
                    repetition_penalty=1.5, seed=1)  # fmt: skip
    assert text(tokenizer, run(Sampler(grammars=grammars), params, [4])) == "no"


def test_unguided_rows_are_untouched_and_logprobs_are_the_models(grammars):
    logits = step_logits(0, batch=2)
    plain = SamplingParams(temperature=0, logprobs=0)
    rows = [SampleRow(plain, 0, (EOS,), [1]), SampleRow(guided("choice", '["zz"]', logprobs=0), 0, (EOS,), [1])]  # fmt: skip
    out = Sampler(grammars=grammars)(logits, rows)
    assert out.tokens[0] == int(logits[0].argmax())
    assert out.tokens[1] != int(logits[1].argmax())
    model_logp = torch.log_softmax(logits[1], -1)[out.tokens[1]].item()
    assert out.logprobs[1].logprob == pytest.approx(model_logp, abs=1e-5)


def test_evicted_matchers_are_replayed(grammars, tokenizer):
    """A matcher table of one entry, two interleaved rows: each row replays its tokens."""
    sampler = Sampler(grammars=grammars)
    sampler.guided.size = 1
    params = guided("json", json.dumps(SCHEMA), temperature=0)
    seqs = [[1, 5], [3, 4]]
    for step in range(200):
        live = [s for s in seqs if s[-1] != EOS]
        if not live:
            break
        rows = [SampleRow(params, len(s) - 2, (EOS,), s) for s in live]
        for s, tok in zip(live, sampler(step_logits(step, len(live)), rows).tokens, strict=True):
            s.append(tok)
    for s in seqs:
        jsonschema.validate(json.loads(text(tokenizer, s[2:])), SCHEMA)
    assert sampler.guided.num_replayed > 0


def test_grammars_cached_per_guide_lru(grammars):
    cache = GrammarCache(grammars.tokenizer_dir, VOCAB, (EOS,), size=2)
    a, b, c = (guided("regex", r) for r in ("a+", "b+", "c+"))
    assert cache.prefetch(a) is cache.prefetch(a)
    for p in (a, b, a, c, a):
        cache.get(p)
    assert cache.num_compiled == 3  # b was evicted by c, a stayed (most recently used)
    cache.get(b)
    assert cache.num_compiled == 4
    cache.close()


@pytest.mark.parametrize(
    ("guide_type", "guide", "message"),
    [
        ("json", '{"type": "foo"}', 'JSON schema is invalid: Unsupported type "foo"'),
        ("json", "{not json", "JSON schema is invalid: is not JSON"),
        ("json", "[1]", "JSON schema is invalid: must be a JSON object"),
        ("regex", "(abc", "regex is invalid: Regex parsing error"),
        ("choice", "[]", "choice list is invalid: must be a non-empty list"),
        ("grammar", "root ::= nope", "EBNF grammar is invalid: EBNF parser error"),
    ],
)
def test_invalid_guides_name_the_problem(guide_type, guide, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace("[", r"\[")):
        check_guide(SamplingParams(guide_type=guide_type, guide=guide))


def test_guide_fields_validated_without_xgrammar():
    with pytest.raises(ValueError, match="guide_type must be one of"):
        SamplingParams(guide_type="xml", guide="x")
    with pytest.raises(ValueError, match="guide must not be empty for guide_type 'regex'"):
        SamplingParams(guide_type="regex")
    with pytest.raises(ValueError, match="guide must be empty for guide_type 'json_object'"):
        SamplingParams(guide_type="json_object", guide="{}")
    with pytest.raises(ValueError, match="structured output needs a sampler"):
        Sampler()(torch.zeros(1, 8), [SampleRow(guided("regex", "a"), 0, (EOS,), [1])])


def test_matchers_of_rows_gone_quiet_are_dropped(grammars):
    """A prefill instance samples each sequence once: its matcher (and the token list it
    holds) must not stay until 1024 others push it out."""
    from bucketserve.engine.guided_mask import STALE_CALLS

    sampler = Sampler(grammars=grammars)
    params = guided("regex", "[a-z]+")
    once = [7, 8]
    sampler(step_logits(0), [SampleRow(params, 0, (EOS,), once)])
    other = [9]
    for step in range(STALE_CALLS + 2):
        out = sampler(step_logits(step), [SampleRow(params, len(other) - 1, (EOS,), other)])
        other.append(out.tokens[0])
    assert [m.token_ids for m in sampler.guided._rows.values()] == [other]
