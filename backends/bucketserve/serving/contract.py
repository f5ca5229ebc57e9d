"""The user-facing tensor contract: one table declares every input (it renders the Triton
configs) and drives the parser into one request record, GenerateParams.

Both stock conventions are accepted: TensorRT-LLM's (`[1, 1]` tensors, `end_id`, `beam_width`,
`return_log_probs`, ...) and the vLLM backend's (`[1]` tensors, `sampling_parameters` JSON,
`return_logprobs`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bucketserve.engine.sampling_params import SamplingParams  # torch-free
from bucketserve.serving.contract_rules import reject_unsupported, trtllm_guide, vllm_sampling

SLO_CLASSES = ("online", "offline")
_KINDS = {"STRING": str, "BOOL": bool, "FP32": float, "INT32": int, "UINT64": int}


@dataclass(frozen=True, slots=True)
class Input:
    """One optional user input: Triton type, and what it sets ("sampling.x", "x" or "")."""

    name: str
    dtype: str
    target: str = ""  # "" means handled by name in parse_params / contract_rules
    is_list: bool = False  # dims [-1] (a list of strings) instead of one value


INPUTS = (
    Input("text_input", "STRING"),
    Input("max_tokens", "INT32", "sampling.max_tokens"),
    Input("stream", "BOOL", "stream"),
    Input("temperature", "FP32", "sampling.temperature"),
    Input("top_p", "FP32", "sampling.top_p"),
    Input("top_k", "INT32", "sampling.top_k"),
    Input("seed", "UINT64", "sampling.seed"),
    Input("random_seed", "UINT64", "sampling.seed"),  # TensorRT-LLM's older name
    Input("min_tokens", "INT32", "sampling.min_tokens"),
    Input("min_length", "INT32"),  # TensorRT-LLM / genai-perf name of min_tokens
    Input("repetition_penalty", "FP32", "sampling.repetition_penalty"),
    Input("presence_penalty", "FP32", "sampling.presence_penalty"),
    Input("frequency_penalty", "FP32", "sampling.frequency_penalty"),
    Input("stop_words", "STRING", "stop_words", is_list=True),
    Input("bad_words", "STRING", "bad_words", is_list=True),
    Input("end_id", "INT32"),
    Input("pad_id", "INT32"),
    Input("beam_width", "INT32"),
    Input("num_return_sequences", "INT32"),
    Input("length_penalty", "FP32"),  # beam search only: no effect at beam_width 1
    Input("return_log_probs", "BOOL"),
    Input("return_logprobs", "BOOL"),
    Input("return_cumulative_logprob", "BOOL"),
    Input("return_finish_reason", "BOOL"),  # finish_reason is always returned
    Input("return_context_logits", "BOOL"),
    Input("return_generation_logits", "BOOL"),
    Input("exclude_input_in_output", "BOOL", "exclude_input_in_output"),
    Input("return_num_input_tokens", "BOOL", "return_num_input_tokens"),
    Input("return_num_output_tokens", "BOOL", "return_num_output_tokens"),
    Input("apply_chat_template", "BOOL", "apply_chat_template"),
    Input("slo_class", "STRING"),
    Input("priority", "INT32"),
    Input("ttft_slo_ms", "FP32"),
    Input("tpot_slo_ms", "FP32"),
    Input("sampling_parameters", "STRING"),
    Input("guided_decoding_guide_type", "STRING"),  # TensorRT-LLM's structured output inputs
    Input("guided_decoding_guide", "STRING"),
    Input("stop", "BOOL", "stop"),
    Input("cache_salt", "STRING", "cache_salt"),  # vLLM's name: only equal salts share KV
)
INPUT_NAMES = tuple(i.name for i in INPUTS)
OUTPUTS = (
    ("text_output", "STRING"),
    ("finish_reason", "STRING"),
    ("num_input_tokens", "INT32"),
    ("num_output_tokens", "INT32"),
    ("output_log_probs", "FP32"),  # TensorRT-LLM: log-prob of each token in this response
    ("cum_log_probs", "FP32"),  # TensorRT-LLM: their running sum
    ("logprobs", "STRING"),  # vLLM backend: JSON, one {token_id: {logprob, rank, ...}} per token
    ("num_cached_tokens", "INT32"),  # prompt tokens served from the prefix cache
)
OUTPUT_NAMES = tuple(name for name, _ in OUTPUTS)

# The decode -> relay hop (`bucketserve_bls`, `decode_router`) carries one JSON tensor per
# response instead of the seven outputs above
# (docs/platform-notes.md#p26-bls-responses-kept-until-the-stream-ends): Triton 2.51's stub keeps
# every response of a decoupled BLS stream until the stream ends (`ResponseIterator::responses_`,
# python_backend src/pb_response_iterator.cc), so a relay held seven tensors per streamed token of
# every request in flight (`perf/reliability/stream_memory.py`, 32 streams of 128 tokens:
# `bucketserve_bls` +42 MB, +7.5 MB packed). A relay asks decode for this output only
# (serving/core/messages.py: PackedDelta) and sends the user outputs.
PACKED_OUTPUT = "_delta"


def input_declarations() -> str:
    """The `input [...]` body every entry model and `preprocessing` declare."""
    lines = [
        f'  {{ name: "{i.name}" data_type: TYPE_{i.dtype} dims: [ {-1 if i.is_list else 1} ] '
        f"optional: true }}"
        for i in INPUTS
    ]
    return ",\n".join(lines)


def output_declarations() -> str:
    """The `output [...]` body of the entry models and `decode`."""
    return ",\n".join(f'  {{ name: "{n}" data_type: TYPE_{t} dims: [ -1 ] }}' for n, t in OUTPUTS)


@dataclass(slots=True)
class GenerateParams:
    """One generation request after validation (travels between the models: serving/core/messages.py)."""

    request_id: str = ""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = False
    stop_words: list[str] = field(default_factory=list)
    bad_words: list[str] = field(default_factory=list)  # preprocess tokenizes them into sampling
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
    cache_salt: str | None = None  # prefix caching: requests share KV only with equal salts

    @property
    def max_tokens(self) -> int:
        """The generation budget (lives in the sampling record)."""
        return self.sampling.max_tokens


def scalar(arr: np.ndarray | None, name: str, kind: type):
    """The single value of a [1] or [1, 1] tensor; ValueError naming the field otherwise."""
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


def strings(arr: np.ndarray | None) -> list[str]:
    """A BYTES list ([-1] or [1, -1]) as non-empty strings."""
    if arr is None:
        return []
    words = [w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in arr.reshape(-1)]
    return [w for w in words if w]


def read_values(inputs: dict[str, np.ndarray]) -> dict:
    """{name: python value} for the inputs present."""
    return {
        i.name: strings(inputs[i.name])
        if i.is_list
        else scalar(inputs[i.name], i.name, _KINDS[i.dtype])
        for i in INPUTS
        if inputs.get(i.name) is not None and i.name != "text_input"
    }


def text_input(arr: np.ndarray | None) -> str:
    if arr is None:
        raise ValueError("text_input is required (BYTES [1], or [1, 1] with a batch dimension)")
    text = scalar(arr, "text_input", str)
    if not text.strip():
        raise ValueError("text_input must not be empty")
    return text


def parse_params(inputs: dict[str, np.ndarray], default_max_tokens: int) -> GenerateParams:
    """Build GenerateParams from the request's tensors; every error names the field and limit."""
    values = read_values(inputs)
    reject_unsupported(values)
    sampling: dict = {"max_tokens": default_max_tokens}
    record: dict = {}
    json_values = vllm_sampling(values.get("sampling_parameters"))
    record["stop_words"] = json_values.pop("stop_words", [])
    if "cache_salt" in json_values:
        record["cache_salt"] = json_values.pop("cache_salt")
    sampling.update(json_values)  # explicit tensors below win over the JSON
    for i in INPUTS:
        if i.target and values.get(i.name) is not None:
            if i.target.startswith("sampling."):
                sampling[i.target.removeprefix("sampling.")] = values[i.name]
            elif i.target == "stop_words":
                record["stop_words"] = record["stop_words"] + values[i.name]
            else:
                record[i.target] = values[i.name]
    apply_special(values, sampling)
    check_cache_salt(record.get("cache_salt"))
    p = GenerateParams(sampling=SamplingParams(**sampling), **record)
    apply_slo(p, values)
    return p


MAX_CACHE_SALT_CHARS = 256


def check_cache_salt(salt) -> None:
    """cache_salt is absent, or a non-empty string of at most MAX_CACHE_SALT_CHARS."""
    if salt is not None and not (isinstance(salt, str) and 0 < len(salt) <= MAX_CACHE_SALT_CHARS):
        raise ValueError(
            f"cache_salt must be a non-empty string of at most {MAX_CACHE_SALT_CHARS} characters,"
            f" got {salt!r:.80}"
        )


def apply_special(values: dict, sampling: dict) -> None:
    """Aliases and TensorRT-LLM inputs that map onto sampling fields indirectly."""
    if values.get("min_length") is not None and values.get("min_tokens") is None:
        sampling["min_tokens"] = values["min_length"]
    if values.get("end_id") is not None:  # TensorRT-LLM: end_id replaces the model's EOS
        sampling["stop_token_ids"] = (*sampling.get("stop_token_ids", ()), values["end_id"])
        sampling["ignore_eos"] = True
    wants = ("return_log_probs", "return_logprobs", "return_cumulative_logprob")
    if any(values.get(n) for n in wants) and sampling.get("logprobs") is None:
        sampling["logprobs"] = 0
    guide = trtllm_guide(values)
    if guide and sampling.get("guide_type"):
        raise ValueError("only one guide per request: guided_decoding_guide_type and a guide in "
                         "sampling_parameters")  # fmt: skip
    sampling.update(guide)


def apply_slo(p: GenerateParams, values: dict) -> None:
    if values.get("slo_class") is not None:
        p.slo_class = values["slo_class"]
    elif values.get("priority") is not None:
        p.slo_class = "offline" if values["priority"] > 0 else "online"
    if p.slo_class not in SLO_CLASSES:
        raise ValueError(f"slo_class must be one of {SLO_CLASSES}, got {p.slo_class!r}")
    for name, attr in (("ttft_slo_ms", "ttft_slo_s"), ("tpot_slo_ms", "tpot_slo_s")):
        if values.get(name) is not None:
            if values[name] <= 0:
                raise ValueError(f"{name} must be > 0, got {values[name]}")
            setattr(p, attr, values[name] / 1000.0)


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
