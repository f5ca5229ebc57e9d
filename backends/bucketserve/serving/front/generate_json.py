"""Triton's generate JSON <-> its inference tensors, as Triton 2.51's HTTP front end maps them.

The mapping is Triton's (server/src/http_server.cc, ConvertGenerateRequest / FinalizeResponse):
every key of the request object, and of its optional `parameters` object, that names a model
input becomes that input (dtype from the model metadata, shape from its dims: fixed dims take
their size, the innermost variable one takes the rest); any other key becomes a request
parameter (string, number or bool). A response becomes `model_name`, `model_version`, its
parameters, and one key per output tensor: the single value when it holds one element, else
the flat list. Errors name the field and what it must be (Triton's own say less).

The front maps it itself, since Triton's HTTP generate_stream cuts streams under load
(docs/platform-notes.md#p21-http-generate-stream-cut-under-load).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

NESTED = "parameters"  # the one nested object of the schema
FINAL_FLAG = "triton_final_response"  # added by Triton's gRPC stream, not by the model
INT_RANGES = {
    t: (int(np.iinfo(t.lower()).min), int(np.iinfo(t.lower()).max))
    for t in ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
}
FLOATS = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}


@dataclass(frozen=True, slots=True)
class Tensor:
    """One input tensor of a request, ready to serialize."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    array: np.ndarray

    def raw(self) -> bytes:
        if self.datatype == "BYTES":  # a 0-d object array holding the serialized bytes
            return serialize_byte_tensor(self.array).item()
        return self.array.tobytes()


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One model input as the model metadata declares it."""

    name: str
    datatype: str
    shape: tuple[int, ...]  # -1 for a variable dim (the batch dim included, if any)


def to_request(doc, specs: dict[str, InputSpec]) -> tuple[list[Tensor], dict]:
    """(input tensors, request parameters) for one generate request; ValueError names the field."""
    if not isinstance(doc, dict):
        raise ValueError("the generate request must be a JSON object")
    inputs, params = [], {}
    for key, value in doc.items():
        if key == NESTED and key not in specs:
            if not isinstance(value, dict):
                raise ValueError(f"'{NESTED}' must be a JSON object of name: value pairs")
            for name, inner in value.items():
                map_key(name, inner, specs, inputs, params)
        else:
            map_key(key, value, specs, inputs, params)
    return inputs, params


def map_key(key: str, value, specs: dict[str, InputSpec], inputs: list, params: dict) -> None:
    if key in params or any(t.name == key for t in inputs):
        raise ValueError(f"'{key}' is given twice (at the top level and in '{NESTED}')")
    if key in specs:
        inputs.append(tensor(specs[key], value))
    elif isinstance(value, str | bool | int | float):
        params[key] = value
    else:
        raise ValueError(
            f"'{key}' is not an input of this model, so it is a request parameter, and a "
            f"parameter must be a string, a number or a bool (got {type(value).__name__})"
        )


def tensor(spec: InputSpec, value) -> Tensor:
    """One input tensor from a JSON value or a flat list of values."""
    values = value if isinstance(value, list) else [value]
    if any(isinstance(v, list | dict) for v in values):
        raise ValueError(f"'{spec.name}' must be a value or a flat list of values")
    shape = fit_shape(spec, len(values))
    return Tensor(spec.name, spec.datatype, shape, as_array(spec, values).reshape(shape))


def to_proto(
    model: str, version: str, request_id: str, inputs: list[Tensor], params: dict
) -> service_pb2.ModelInferRequest:
    """The gRPC request: raw tensor contents, parameters typed as Triton reads them."""
    req = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for t in inputs:
        req.inputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
        req.raw_input_contents.append(t.raw())
    for key, value in params.items():
        p = req.parameters[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            p.int64_param = value
        elif isinstance(value, float):
            p.double_param = value
        else:
            p.string_param = value
    return req


def fit_shape(spec: InputSpec, count: int) -> tuple[int, ...]:
    """Triton's two passes: fixed dims divide the count, the innermost variable dim takes it."""
    left = count
    for d in reversed(spec.shape):
        if d != -1:
            if d == 0 or left % d:
                raise ValueError(
                    f"'{spec.name}': {count} value(s) do not fit its shape {spec.shape}"
                )
            left //= d
    shape = []
    for d in reversed(spec.shape):
        shape.append(d if d != -1 else left)
        left = left if d != -1 else 1
    if left != 1:
        raise ValueError(f"'{spec.name}': {count} value(s) do not fit its shape {spec.shape}")
    return tuple(reversed(shape))


def as_array(spec: InputSpec, values: list) -> np.ndarray:
    dt, name = spec.datatype, spec.name
    if dt == "BYTES":
        if not all(isinstance(v, str) for v in values):
            raise ValueError(f"'{name}' must be a string (a BYTES input)")
        return np.array([v.encode("utf-8") for v in values], dtype=np.object_)
    if dt == "BOOL":
        if not all(isinstance(v, bool) for v in values):
            raise ValueError(f"'{name}' must be true or false (a BOOL input)")
        return np.array(values, dtype=np.bool_)
    if dt in INT_RANGES:
        lo, hi = INT_RANGES[dt]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise ValueError(f"'{name}' must be an integer (an {dt} input)")
        if any(not lo <= v <= hi for v in values):
            raise ValueError(f"'{name}' must be in [{lo}, {hi}] (an {dt} input)")
        return np.array(values, dtype=dt.lower())
    if dt in FLOATS:
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            raise ValueError(f"'{name}' must be a number (an {dt} input)")
        return np.array(values, dtype=FLOATS[dt])
    raise ValueError(f"'{name}' is a {dt} input, which the generate endpoint cannot fill")


def to_response(result, model: str, version: str) -> dict:
    """One generate response object from one gRPC InferResult with outputs. No "id": Triton's
    generate cannot set one (the front's own request ids are its business)."""
    response = result.get_response()
    doc: dict = {"model_name": model, "model_version": response.model_version or version}
    for name, p in response.parameters.items():
        if name != FINAL_FLAG:
            doc[name] = getattr(p, p.WhichOneof("parameter_choice"))
    for out in response.outputs:
        values = [plain(v) for v in result.as_numpy(out.name).reshape(-1)]
        doc[out.name] = values[0] if len(values) == 1 else values
    return doc


def plain(v):
    """A numpy element as the JSON value Triton writes (BYTES as text)."""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v.item() if isinstance(v, np.generic) else v


def input_specs(metadata) -> dict[str, InputSpec]:
    """{name: InputSpec} from a gRPC ModelMetadataResponse."""
    return {
        i.name: InputSpec(i.name, i.datatype, tuple(int(d) for d in i.shape))
        for i in metadata.inputs
    }
