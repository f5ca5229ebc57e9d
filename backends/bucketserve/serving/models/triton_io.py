"""Small helpers over triton_python_backend_utils shared by the serving models."""

from __future__ import annotations

import json
import logging

import numpy as np
import triton_python_backend_utils as pb_utils

from bucketserve.serving.contract import PACKED_OUTPUT
from bucketserve.serving.core.messages import MessageError, PackedDelta, decode


def model_parameter(args: dict, key: str) -> str:
    """A string parameter of this model's config.pbtxt."""
    params = json.loads(args["model_config"]).get("parameters", {})
    if key not in params:
        raise RuntimeError(f"config.pbtxt of {args['model_name']} lacks parameter {key!r}")
    return params[key]["string_value"]


def instance_index(args: dict) -> int:
    """Device index g from the instance name <model>_<g>_<i> (one instance group per device)."""
    return int(args["model_instance_name"].rsplit("_", 2)[-2])


def read_inputs(request, names) -> dict[str, np.ndarray]:
    """The request's tensors as numpy arrays; absent optional inputs are left out."""
    out = {}
    for name in names:
        t = pb_utils.get_input_tensor_by_name(request, name)
        if t is not None:
            out[name] = t.as_numpy()
    return out


def bytes_tensor(name: str, data: str | bytes) -> pb_utils.Tensor:
    """A BYTES [1] tensor holding `data` (text as UTF-8)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return pb_utils.Tensor(name, np.array([raw], dtype=np.object_))


def user_tensors(d: PackedDelta) -> list:
    """The user outputs of one response; the log-prob ones are empty unless the request asked
    (TensorRT-LLM's output_log_probs / cum_log_probs, the vLLM backend's logprobs JSON)."""
    values = [next(iter(e.values()))["logprob"] for e in d.logprobs]
    cum = [d.cum_logprob] if d.logprobs else []
    return [
        bytes_tensor("text_output", d.text),
        bytes_tensor("finish_reason", d.finish_reason),
        pb_utils.Tensor("num_input_tokens", np.array([d.num_input_tokens], dtype=np.int32)),
        pb_utils.Tensor("num_output_tokens", np.array([d.num_output_tokens], dtype=np.int32)),
        pb_utils.Tensor("output_log_probs", np.asarray(values, dtype=np.float32)),
        pb_utils.Tensor("cum_log_probs", np.asarray(cum, dtype=np.float32)),
        bytes_tensor("logprobs", json.dumps(d.logprobs) if d.logprobs else ""),
        pb_utils.Tensor("num_cached_tokens", np.array([d.num_cached_tokens], dtype=np.int32)),
    ]


def packed_delta(response) -> PackedDelta:
    """The PACKED_OUTPUT of a decode response (contract.py: why the relay hop is packed)."""
    t = pb_utils.get_output_tensor_by_name(response, PACKED_OUTPUT)
    return decode(PackedDelta, t.as_numpy().reshape(-1)[0])


def bytes_input(request, name: str) -> bytes:
    """The one value of a BYTES input; MessageError naming it when absent or not one value."""
    t = pb_utils.get_input_tensor_by_name(request, name)
    arr = t.as_numpy() if t is not None else None
    if arr is None or arr.size != 1 or not isinstance(arr.reshape(-1)[0], bytes):
        raise MessageError(f"{name}: expected one BYTES value")
    return arr.reshape(-1)[0]


def array_input(request, name: str, dtype) -> np.ndarray:
    """A numeric input as a flat contiguous array of `dtype` (the bytes a seal is bound to)."""
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None:
        raise MessageError(f"{name}: missing")
    return np.ascontiguousarray(t.as_numpy().reshape(-1), dtype=dtype)


class TritonLogHandler(logging.Handler):
    """Warnings and errors of the Triton-free modules, into the server log at their level."""

    def emit(self, record: logging.LogRecord) -> None:
        log = (
            pb_utils.Logger.log_error
            if record.levelno >= logging.ERROR
            else pb_utils.Logger.log_warn
        )
        log(self.format(record))


def route_logging(*names: str) -> None:
    """Send these loggers' warnings and errors to the server log (once per logger)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(h, TritonLogHandler) for h in logger.handlers):
            logger.addHandler(TritonLogHandler())
        logger.setLevel(logging.WARNING)
