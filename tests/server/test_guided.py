"""Structured output on the real server (SmolLM2, CPU), in both topologies: OpenAI
response_format, vLLM `guided_json` on `bucketserve`, TensorRT-LLM's guide inputs on
`ensemble`; every reply parses and validates; a bad schema is a 400 naming it."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from bucketserve.bench.schemas import PERSON as SCHEMA

from .helpers import generate, openai_client, wait_all_blocks_free

pytestmark = pytest.mark.server

MODEL = "smollm2"
ASK = "Describe a person who lives in Paris, as JSON."


@pytest.fixture(scope="module", params=["server", "colocated"])
def front(request, server, colocated):
    """The shared server of each topology (disaggregated, colocated); yields (server, openai
    client). Both are arguments, not `request.getfixturevalue`: tests/server/conftest.py orders
    the modules by the shared servers their tests name."""
    server = {"server": server, "colocated": colocated}[request.param]
    return server, openai_client(server)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_openai_json_schema_validates(front, temperature):
    _, client = front
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}  # fmt: skip
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ASK}], max_tokens=200,
        temperature=temperature, seed=5, response_format=fmt,
    )  # fmt: skip
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_openai_json_object_and_bad_schema(front):
    _, client = front
    short = 'Answer with a JSON object like {"capital": "..."}: what is the capital of France?'
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": short}], max_tokens=300,
        temperature=0, response_format={"type": "json_object"},
    )  # fmt: skip
    content = r.choices[0].message.content  # free-form strings: only `stop` promises a whole one
    assert r.choices[0].finish_reason == "stop", content
    assert isinstance(json.loads(content), dict)
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    with pytest.raises(openai.BadRequestError, match='JSON schema is invalid: Unsupported type "nope"'):  # fmt: skip
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}],
                                       response_format=bad)  # fmt: skip


def test_v2_vllm_and_trtllm_guides_validate(front):
    server, _ = front
    body = {"text_input": ASK, "max_tokens": 200, "temperature": 0.0, "apply_chat_template": True}
    vllm = {**body, "sampling_parameters": json.dumps({"guided_json": SCHEMA})}
    trt = {**body, "guided_decoding_guide_type": "json_schema",
           "guided_decoding_guide": json.dumps(SCHEMA)}  # fmt: skip
    for payload, model in ((vllm, "bucketserve"), (trt, "ensemble")):
        r = generate(server, payload, model=model)
        assert r.status_code == 200, r.text
        jsonschema.validate(json.loads(r.json()["text_output"]), SCHEMA)
    bad = generate(server, {**body, "guided_decoding_guide_type": "regex",
                            "guided_decoding_guide": "(open"}, model="ensemble")  # fmt: skip
    assert bad.status_code >= 400 and "regex is invalid" in bad.json()["error"], bad.text
    waited, blocks = wait_all_blocks_free(server, timeout_s=10)
    assert all(free == total for free, total in blocks.values()), (waited, blocks)
