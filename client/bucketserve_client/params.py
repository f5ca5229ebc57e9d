"""GenerationParams: sampling and SLO settings of one request, validated before they are sent."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np
from tritonclient.grpc import InferInput

MODELS = ("bucketserve", "bucketserve_bls")
SLO_CLASSES = ("online", "offline")
INT32_MAX = 2**31 - 1
SEED_LIMIT = 2**63  # the server keeps seeds in a signed 64-bit integer
INPUT_DATATYPES = {  # the server's tensor contract: name -> Triton datatype, all shaped [1]
    "text_input": "BYTES",
    "stream": "BOOL",
    "max_tokens": "INT32",
    "temperature": "FP32",
    "top_p": "FP32",
    "top_k": "INT32",
    "seed": "UINT64",
    "min_tokens": "INT32",
    "exclude_input_in_output": "BOOL",
    "return_num_input_tokens": "BOOL",
    "return_num_output_tokens": "BOOL",
    "apply_chat_template": "BOOL",
    "slo_class": "BYTES",
    "ttft_slo_ms": "FP32",
    "tpot_slo_ms": "FP32",
    "stop": "BOOL",
}
NUMPY_DTYPES = {
    "BYTES": np.object_,
    "BOOL": np.bool_,
    "INT32": np.int32,
    "FP32": np.float32,
    "UINT64": np.uint64,
}


@dataclass(slots=True, frozen=True)
class GenerationParams:
    """Per-request settings; None leaves the server's default in force (the input is not sent)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    min_tokens: int | None = None
    stop_words: tuple[str, ...] = ()
    apply_chat_template: bool = False
    exclude_input_in_output: bool | None = None
    slo_class: str | None = None
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_words", tuple(self.stop_words))
        check_int("max_tokens", self.max_tokens, 1, INT32_MAX)
        check_float("temperature", self.temperature, 0.0, math.inf)
        check_float("top_p", self.top_p, 0.0, 1.0)
        if self.top_p is not None and self.top_p <= 0.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        check_int("top_k", self.top_k, 0, INT32_MAX)
        check_int("seed", self.seed, 0, SEED_LIMIT - 1)
        upper = self.max_tokens if self.max_tokens is not None else INT32_MAX
        check_int("min_tokens", self.min_tokens, 0, upper)
        check_flag("apply_chat_template", self.apply_chat_template)
        check_flag("exclude_input_in_output", self.exclude_input_in_output)
        check_stop_words(self.stop_words)
        if self.slo_class is not None and self.slo_class not in SLO_CLASSES:
            raise ValueError(f"slo_class must be one of {SLO_CLASSES}, got {self.slo_class!r}")
        for name in ("ttft_slo_ms", "tpot_slo_ms"):
            check_float(name, getattr(self, name), 0.0, math.inf)
            if getattr(self, name) == 0.0:
                raise ValueError(f"{name} must be > 0, got 0")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The parameter names, in declaration order."""
        return tuple(f.name for f in fields(cls))


def check_int(name: str, value, low: int, high: int) -> None:
    """ValueError naming the field unless value is None or an int in [low, high]."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


def check_float(name: str, value, low: float, high: float) -> None:
    """ValueError naming the field unless value is None or a finite number in [low, high]."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{name} must be a finite number in [{low}, {high}], got {value}")


def check_flag(name: str, value) -> None:
    """ValueError naming the field unless value is None or a bool."""
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def check_stop_words(words: tuple) -> None:
    """ValueError unless every stop word is a non-empty string."""
    for word in words:
        if not isinstance(word, str) or not word:
            raise ValueError(f"stop_words must be non-empty strings, got {word!r}")


def check_prompt(prompt) -> None:
    """ValueError unless the prompt is a non-empty string."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt (text_input) must be a non-empty string")


def check_model(model: str) -> None:
    """ValueError unless model is one of the two entry points."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")


def scalar_input(name: str, value) -> InferInput:
    """A [1]-shaped input tensor with the datatype the contract gives `name`."""
    datatype = INPUT_DATATYPES[name]
    if datatype == "BYTES":
        value = value.encode("utf-8")
    tensor = InferInput(name, [1], datatype)
    tensor.set_data_from_numpy(np.array([value], dtype=NUMPY_DTYPES[datatype]))
    return tensor


def bytes_list_input(name: str, words: tuple[str, ...]) -> InferInput:
    """A [len(words)]-shaped BYTES input (stop_words)."""
    tensor = InferInput(name, [len(words)], "BYTES")
    tensor.set_data_from_numpy(np.array([w.encode("utf-8") for w in words], dtype=np.object_))
    return tensor


def build_inputs(prompt: str, params: GenerationParams, stream: bool) -> list[InferInput]:
    """The request's input tensors, named and typed as the server's tensor contract says."""
    check_prompt(prompt)
    values = {
        "text_input": prompt,
        "stream": stream,
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
    }
    for name in GenerationParams.field_names():
        value = getattr(params, name)
        if name != "stop_words" and value is not None:
            values[name] = value
    inputs = [scalar_input(name, value) for name, value in values.items()]
    if params.stop_words:
        inputs.append(bytes_list_input("stop_words", params.stop_words))
    return inputs


def stop_inputs() -> list[InferInput]:
    """The ensemble's cancel request (TensorRT-LLM convention): `stop: true`, same request_id."""
    return [scalar_input("text_input", ""), scalar_input("stop", True)]
