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
VLLM_UNSUPPORTED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
                    "structured_outputs", "logit_bias", "prompt_logprobs")  # fmt: skip


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
    out: dict = {}
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
