"""The front's request checks: each answers a crash found against a real Triton 2.51."""

from __future__ import annotations

import json

from bucketserve.serving.front.guard import (
    MAX_JSON_DEPTH,
    check_request,
    depth,
    forward_headers,
)


def nested(levels: int) -> bytes:
    return b'{"text_input": ' + b"[" * levels + b"]" * levels + b"}"


def test_deep_nesting_is_refused_before_triton():
    # 200k levels: the ~400 KB body that made tritonserver SIGSEGV
    for body in (nested(200_000), nested(MAX_JSON_DEPTH + 1)):
        problem = check_request("POST", "/v2/models/bucketserve/generate", {}, body)
        assert problem.status == 400 and f"{MAX_JSON_DEPTH} levels" in problem.message


def test_real_requests_pass():
    infer = {
        "inputs": [
            {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": [["hi"]]},
            {"name": "max_tokens", "datatype": "INT32", "shape": [1], "data": [8]},
        ],
        "parameters": {"priority": 1},
    }
    body = json.dumps(infer).encode()
    assert check_request("POST", "/v2/models/bucketserve/infer", {}, body) is None
    assert check_request("POST", "/v2/models/x/generate", {}, nested(MAX_JSON_DEPTH - 1)) is None
    assert check_request("GET", "/v2/models/bucketserve", {}, b"") is None


def test_not_json_or_not_utf8_names_the_problem():
    bad = check_request("POST", "/v2/models/m/generate", {}, b'{"text_input": "\xff"}')
    assert bad.status == 400 and "UTF-8" in bad.message
    bad = check_request("POST", "/v2/models/m/generate", {}, b'{"text_input": ')
    assert bad.status == 400 and "not valid" in bad.message


def test_binary_tensor_header_length_is_checked():
    body = b'{"inputs": []}' + b"\x00" * 8
    ok = {"inference-header-content-length": "14"}
    assert check_request("POST", "/v2/models/m/infer", ok, body) is None
    for declared in ("9999", "-5", "x"):
        h = {"inference-header-content-length": declared}
        problem = check_request("POST", "/v2/models/m/infer", h, body)
        assert problem.status == 400 and "Inference-Header-Content-Length" in problem.message


def test_form_content_type_is_forwarded_as_json():
    out = forward_headers(
        {"Content-Type": "application/x-www-form-urlencoded", "Host": "x", "Accept": "*/*"}
    )
    assert out == {"Content-Type": "application/json", "Accept": "*/*"}
    multipart = forward_headers({"content-type": "multipart/form-data; boundary=z"})
    assert multipart == {"content-type": "application/json"}
    assert forward_headers({"content-type": "application/octet-stream"}) == {
        "content-type": "application/octet-stream"
    }


def test_depth_counts_containers():
    assert depth({"a": 1}) == 1
    assert depth({"a": [[1]]}) == 3
    assert depth([]) == 1
