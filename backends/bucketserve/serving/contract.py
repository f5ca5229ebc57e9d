"""The user-facing tensor contract: parse inputs into GenerateParams with boundary validation."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

SLO_CLASSES = ("online", "offline")
SCALAR_INPUTS = {  # name -> python type of its scalar value
    "max_tokens": int,
    "stream": bool,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "seed": int,
    "min_tokens": int,
    "min_length": int,
    "exclude_input_in_output": bool,
    "return_num_input_tokens": bool,
    "return_num_output_tokens": bool,
    "apply_chat_template": bool,
    "slo_class": str,
    "priority": int,
    "ttft_slo_ms": float,
    "tpot_slo_ms": float,
    "sampling_parameters": str,
    "stop": bool,
}
VLLM_SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "min_tokens")


@dataclass(slots=True)
class GenerateParams:
    """One generation request after validation; travels as JSON between the Triton models."""

    request_id: str = ""
    max_tokens: int = 64
    stream: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    min_tokens: int = 0
    stop_words: list[str] = field(default_factory=list)
    exclude_input_in_output: bool = True
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    apply_chat_template: bool = False
    slo_class: str = "online"
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    stop: bool = False
    prompt_text: str = ""  # kept only when the prompt is echoed (exclude_input_in_output=false)
    num_input_tokens: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> GenerateParams:
        return cls(**json.loads(text))


def scalar(arr: np.ndarray | None, name: str, kind: type) -> Any:
    """The single value of a [1] tensor; ValueError naming the field for any other shape."""
    if arr is None:
        return None
    if arr.size != 1:
        raise ValueError(f"{name} must hold exactly one value, got shape {list(arr.shape)}")
    value = arr.reshape(-1)[0]
    if kind is str:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)
    if kind is bool:
        return bool(value)
    return kind(value.item() if hasattr(value, "item") else value)


def text_input(arr: np.ndarray | None) -> str:
    if arr is None:
        raise ValueError("text_input is required (BYTES [1])")
    text = scalar(arr, "text_input", str)
    if not text.strip():
        raise ValueError("text_input must not be empty")
    return text


def stop_words(arr: np.ndarray | None) -> list[str]:
    if arr is None:
        return []
    words = [w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in arr.reshape(-1)]
    return [w for w in words if w]


def parse_params(inputs: dict[str, np.ndarray], default_max_tokens: int) -> GenerateParams:
    """Build GenerateParams from the request's tensors; every error names the field and limit."""
    values = {name: scalar(inputs.get(name), name, kind) for name, kind in SCALAR_INPUTS.items()}
    values.update(vllm_sampling(values.pop("sampling_parameters")))
    p = GenerateParams(
        max_tokens=default_max_tokens, stop_words=stop_words(inputs.get("stop_words"))
    )
    for name in (
        "max_tokens",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "min_tokens",
        "exclude_input_in_output",
        "return_num_input_tokens",
        "return_num_output_tokens",
        "apply_chat_template",
        "stop",
    ):
        if values.get(name) is not None:
            setattr(p, name, values[name])
    if values.get("min_length") is not None and values.get("min_tokens") is None:
        p.min_tokens = values["min_length"]  # genai-perf sends min_length
    apply_slo(p, values)
    validate(p)
    return p


def vllm_sampling(text: str | None) -> dict[str, Any]:
    """Accept vLLM-backend style `sampling_parameters` JSON for the common keys (values may be
    strings, as genai-perf sends them)."""
    if not text:
        return {}
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"sampling_parameters must be a JSON object: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError("sampling_parameters must be a JSON object")
    out = {}
    for key in VLLM_SAMPLING_KEYS:
        if obj.get(key) is None:
            continue
        kind = float if key in ("temperature", "top_p") else int
        try:
            out[key] = kind(obj[key])
        except (TypeError, ValueError):
            raise ValueError(
                f"sampling_parameters.{key} must be a number, got {obj[key]!r}"
            ) from None
    return out


def apply_slo(p: GenerateParams, values: dict[str, Any]) -> None:
    if values.get("slo_class") is not None:
        p.slo_class = values["slo_class"]
    elif values.get("priority") is not None:
        p.slo_class = "offline" if values["priority"] > 0 else "online"
    for name, attr in (("ttft_slo_ms", "ttft_slo_s"), ("tpot_slo_ms", "tpot_slo_s")):
        if values.get(name) is not None:
            if values[name] <= 0:
                raise ValueError(f"{name} must be > 0, got {values[name]}")
            setattr(p, attr, values[name] / 1000.0)


def validate(p: GenerateParams) -> None:
    """Sampling fields are checked by the engine's own SamplingParams (one set of limits)."""
    from bucketserve.engine.sampling_params import SamplingParams  # torch-free

    SamplingParams(
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        seed=p.seed,
        min_tokens=p.min_tokens,
        max_tokens=p.max_tokens,
    )
    if p.slo_class not in SLO_CLASSES:
        raise ValueError(f"slo_class must be one of {SLO_CLASSES}, got {p.slo_class!r}")


def check_context(p: GenerateParams, num_prompt_tokens: int, max_model_len: int) -> None:
    """Prompt and prompt + max_tokens must fit the model's context."""
    if num_prompt_tokens >= max_model_len:
        raise ValueError(
            f"text_input is {num_prompt_tokens} tokens; the context is {max_model_len} tokens "
            f"(prompt must be shorter to leave room for max_tokens)"
        )
    room = max_model_len - num_prompt_tokens
    if p.max_tokens > room:
        raise ValueError(
            f"max_tokens={p.max_tokens} exceeds the context: {num_prompt_tokens} prompt tokens + "
            f"max_tokens must be <= {max_model_len} (at most {room} here)"
        )
