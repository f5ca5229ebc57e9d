"""Structured output as a user meets it: N JSON-schema replies per interface on a real
`bucketserve serve` (default SmolLM2 on CPU), each parsed and validated with `jsonschema`.

Interfaces: OpenAI `response_format` json_schema (strict) greedy and at temperature 1, vLLM
`sampling_parameters.guided_json` on `bucketserve`, TensorRT-LLM's guide inputs on `ensemble`,
and `json_object`. Prompts differ per request (a different person each), so greedy replies are
not one reply repeated. Prints one line per interface and a JSON summary.

    .venv/bin/python perf/tools/structured_check.py               # starts its own server
    .venv/bin/python perf/tools/structured_check.py --url 127.0.0.1:8000 -n 20
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import tempfile
import time
from pathlib import Path

import jsonschema
import openai
import requests
from bucketserve.bench.schemas import PERSON as SCHEMA

CITIES = ["Paris", "Madrid", "Rome", "Lyon", "Seville", "Milan", "Nice", "Valencia", "Turin",
          "Lille", "Bilbao", "Naples", "Bordeaux", "Granada", "Florence", "Toulouse", "Malaga",
          "Venice", "Nantes", "Cadiz"]  # fmt: skip


def ask(i: int) -> str:
    return f"Describe a person who lives in {CITIES[i % len(CITIES)]}, as JSON."


def validate(text: str, schema: dict | None) -> str:
    """'' if `text` parses (and validates against `schema`), else why not."""
    try:
        doc = json.loads(text)
        if schema is None:
            return "" if isinstance(doc, dict) else f"not an object: {text[:80]}"
        jsonschema.validate(doc, schema)
        return ""
    except (json.JSONDecodeError, jsonschema.ValidationError) as e:
        return f"{type(e).__name__}: {str(e)[:120]}"


def openai_reply(client, i: int, temperature: float, fmt: dict) -> tuple[str, str]:
    r = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": ask(i)}], max_tokens=300,
        temperature=temperature, seed=i, response_format=fmt,
    )  # fmt: skip
    return r.choices[0].message.content, r.choices[0].finish_reason


def v2_reply(url: str, i: int, model: str) -> tuple[str, str]:
    body = {"text_input": ask(i), "max_tokens": 300, "temperature": 0.0,
            "apply_chat_template": True}  # fmt: skip
    if model == "bucketserve":
        body["sampling_parameters"] = json.dumps({"guided_json": SCHEMA})
    else:
        body |= {"guided_decoding_guide_type": "json_schema",
                 "guided_decoding_guide": json.dumps(SCHEMA)}  # fmt: skip
    r = requests.post(f"http://{url}/v2/models/{model}/generate", json=body, timeout=600)
    r.raise_for_status()
    doc = r.json()
    return doc["text_output"], str(doc.get("finish_reason", ""))


def run(url: str, n: int, concurrency: int) -> dict:
    client = openai.OpenAI(base_url=f"http://{url}/v1", api_key="unused", timeout=600)
    strict = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA,
                                                     "strict": True}}  # fmt: skip
    cases = {
        "openai json_schema, greedy": (lambda i: openai_reply(client, i, 0.0, strict), SCHEMA),
        "openai json_schema, temperature 1": (lambda i: openai_reply(client, i, 1.0, strict), SCHEMA),
        "v2 guided_json on bucketserve": (lambda i: v2_reply(url, i, "bucketserve"), SCHEMA),
        "v2 TensorRT-LLM guide on ensemble": (lambda i: v2_reply(url, i, "ensemble"), SCHEMA),
        "openai json_object, greedy": (lambda i: openai_reply(client, i, 0.0, {"type": "json_object"}), None),
    }  # fmt: skip
    summary = {}
    for label, (call, schema) in cases.items():
        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(concurrency) as pool:
            replies = list(pool.map(call, range(n)))
        texts = [t for t, _ in replies]
        # a reply cut at max_tokens cannot be whole JSON, guided or not: counted apart
        cut = sum(1 for _, reason in replies if reason == "length")
        failures = [why for why in (validate(t, schema) for t in texts) if why]
        distinct = len(set(texts))
        summary[label] = {"valid": n - len(failures), "of": n, "cut_at_max_tokens": cut,
                          "distinct": distinct, "seconds": round(time.monotonic() - t0, 1),
                          "failures": failures[:3]}  # fmt: skip
        print(f"{label}: {n - len(failures)} of {n} valid, {cut} cut at max_tokens"
              f" ({distinct} distinct replies, {time.monotonic() - t0:.0f} s)"
              f"{'; ' + failures[0] if failures else ''}", flush=True)  # fmt: skip
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="HTTP host:port of a running server")
    p.add_argument("-n", type=int, default=20, help="replies per interface")
    p.add_argument("--concurrency", type=int, default=8)
    a = p.parse_args(argv)
    if a.url:
        summary = run(a.url, a.n, a.concurrency)
    else:
        from bucketserve.serving.launch.serve_process import ServeProcess

        sp = ServeProcess(Path(tempfile.mkdtemp(prefix="structured-")) / "run")
        sp.start()
        try:
            sp.wait_ready()
            summary = run(sp.http_url, a.n, a.concurrency)
        finally:
            sp.stop()
    print(json.dumps(summary))
    # every reply that ended on its own (not at max_tokens) must be valid
    return 0 if all(s["valid"] + s["cut_at_max_tokens"] >= s["of"] for s in summary.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
