"""What the two stock conventions may ask for that we do not do, and the vLLM JSON parser."""

from __future__ import annotations

import json

# TensorRT-LLM inputs accepted only at the value that means "off".
ONLY_VALUE = {
    "beam_width": (1, "1 (no beam search)"),
    "num_return_sequences": (1, "1 (one sequence per request)"),
    "return_context_logits": (False, "false (logits are not returned)"),
    "return_generation_logits": (False, "false (logits are not returned)"),
}
# vLLM `sampling_parameters` keys -> python type; other keys are ignored, as the vLLM backend
# and Triton's OpenAI front end send the whole OpenAI request minus a few fields.
VLLM_KEYS = {
    "max_tokens": int,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "seed": int,
    "min_tokens": int,
    "repetition_penalty": float,
    "presence_penalty": float,
    "frequency_penalty": float,
    "logprobs": int,
    "ignore_eos": bool,
}
VLLM_ONLY_VALUE = {"n": 1, "best_of": 1, "use_beam_search": False}
VLLM_UNSUPPORTED = ("logit_bias", "prompt_logprobs")
# Structured output: vLLM's older flat keys, and the objects newer vLLM sends
# (`structured_outputs`; `guided_decoding` in between) -> SamplingParams.guide_type.
VLLM_GUIDE_KEYS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                   "guided_grammar": "grammar"}  # fmt: skip
VLLM_GUIDE_OBJECTS = ("structured_outputs", "guided_decoding")
VLLM_OBJECT_KEYS = {"json": "json", "regex": "regex", "choice": "choice", "grammar": "grammar",
                    "json_object": "json_object"}  # fmt: skip
# TensorRT-LLM's `guided_decoding_guide_type` values -> guide_type ("json" is any JSON).
TRTLLM_GUIDE_TYPES = {"json": "json_object", "json_schema": "json", "regex": "regex",
                      "ebnf_grammar": "grammar"}  # fmt: skip


def reject_unsupported(values: dict) -> None:
    """ValueError naming the input and what is supported, for values we cannot honour."""
    for name, (ok, supported) in ONLY_VALUE.items():
        if values.get(name) is not None and values[name] != ok:
            raise ValueError(f"{name}={values[name]} is not supported; supported: {supported}")


def vllm_sampling(text: str | None) -> dict:
    """The vLLM backend's `sampling_parameters` JSON as SamplingParams fields (+ `stop_words`).
    Numbers may arrive as strings (genai-perf sends them so)."""
    if not text:
        return {}
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"sampling_parameters must be a JSON object: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError("sampling_parameters must be a JSON object")
    _reject_vllm(obj)
    out: dict = vllm_guide(obj)
    for key, kind in VLLM_KEYS.items():
        if obj.get(key) is not None:
            out[key] = _convert(obj[key], key, kind)
    if obj.get("stop") is not None:
        out["stop_words"] = _stop_list(obj["stop"])
    if obj.get("cache_salt") is not None:  # a request field, not sampling: parse_params takes it
        out["cache_salt"] = obj["cache_salt"]
    if obj.get("stop_token_ids") is not None:
        out["stop_token_ids"] = tuple(
            _convert(t, "stop_token_ids", int) for t in obj["stop_token_ids"]
        )
    return out


def _reject_vllm(obj: dict) -> None:
    for key, ok in VLLM_ONLY_VALUE.items():
        if obj.get(key) is not None and obj[key] != ok and str(obj[key]) != str(ok):
            raise ValueError(
                f"sampling_parameters.{key}={obj[key]!r} is not supported; supported: {ok!r}"
            )
    for key in VLLM_UNSUPPORTED:
        if obj.get(key) is not None:
            raise ValueError(f"sampling_parameters.{key} is not supported")


def _convert(value, key: str, kind: type):
    if kind is bool:
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes")
        return bool(value)
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"sampling_parameters.{key} must be a number, got {value!r}") from None


def _stop_list(value) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [v for v in value if v]
    raise ValueError(
        f"sampling_parameters.stop must be a string or a list of strings, got {value!r}"
    )


def vllm_guide(obj: dict) -> dict:
    """guide_type / guide from the vLLM keys (at most one guide per request)."""
    found = [(f"sampling_parameters.{k}", t, obj[k]) for k, t in VLLM_GUIDE_KEYS.items()
             if obj.get(k) is not None]  # fmt: skip
    for name in VLLM_GUIDE_OBJECTS:
        sub = obj.get(name)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            raise ValueError(f"sampling_parameters.{name} must be an object, got {sub!r}")
        found += [(f"sampling_parameters.{name}.{k}", t, sub[k])
                  for k, t in VLLM_OBJECT_KEYS.items() if sub.get(k) not in (None, False)]  # fmt: skip
    if len(found) > 1:
        raise ValueError(f"only one guide per request, got {', '.join(f[0] for f in found)}")
    if not found:
        return {}
    name, guide_type, value = found[0]
    return {"guide_type": guide_type, "guide": _guide_text(name, guide_type, value)}


def _guide_text(name: str, guide_type: str, value) -> str:
    if guide_type == "json_object":
        return ""
    if guide_type == "json" and isinstance(value, dict | bool):
        return json.dumps(value)
    if guide_type == "choice" and isinstance(value, list):
        return json.dumps(value)
    if isinstance(value, str) and value:
        return value
    raise ValueError(f"{name} must be a non-empty string{_shape_hint(guide_type)}, got {value!r}")


def _shape_hint(guide_type: str) -> str:
    return {"json": " or a JSON schema object", "choice": " or a list of strings"}.get(
        guide_type, ""
    )


def trtllm_guide(values: dict) -> dict:
    """guide_type / guide from TensorRT-LLM's `guided_decoding_guide_type` / `_guide` inputs."""
    kind, guide = values.get("guided_decoding_guide_type"), values.get("guided_decoding_guide")
    if kind is None:
        if guide is not None:
            raise ValueError("guided_decoding_guide needs guided_decoding_guide_type")
        return {}
    if kind not in TRTLLM_GUIDE_TYPES:
        raise ValueError(
            f"guided_decoding_guide_type={kind!r} is not supported; supported: "
            f"{', '.join(TRTLLM_GUIDE_TYPES)}"
        )
    guide_type = TRTLLM_GUIDE_TYPES[kind]
    if guide_type == "json_object":
        return {"guide_type": guide_type, "guide": ""}
    if not guide:
        raise ValueError(f"guided_decoding_guide must not be empty for guide type {kind!r}")
    return {"guide_type": guide_type, "guide": guide}
