"""Checks a request must pass before it reaches Triton 2.51's HTTP front end (which can crash).

Each rule here answers a crash or hang found by trying it against a bare tritonserver
(docs/platform-notes.md#p11-large-form-body-crash, #p20-deeply-nested-json-crash);
tests/server/test_faults.py keeps every one of them honest against the real server, and
tests/unit/serving/test_front_guard.py checks each rule.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

# Triton reads every inference body as JSON; only its form-body parsing crashes
# (docs/platform-notes.md#p11-large-form-body-crash)
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
# Triton's JSON parser recurses per level and crashes (SIGSEGV) on a ~400 KB body of nested
# brackets (docs/platform-notes.md#p20-deeply-nested-json-crash); a real request nests ~6
# levels (inputs -> tensor -> data rows of a shaped tensor).
MAX_JSON_DEPTH = 32
DROP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te"}


class BodyTooLarge(ValueError):
    """A body over the configured limit (413)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"request body is larger than max_request_bytes={limit} (got at least {size} bytes);"
            " send a shorter prompt, or start the server with a larger --max-request-bytes"
        )


@dataclass(slots=True, frozen=True)
class Problem:
    """Why the front refuses a request: HTTP status, a metric label, a message for the client."""

    status: int
    reason: str
    message: str


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Request headers for Triton: no hop-by-hop ones, and a form content type sent as JSON."""
    out = {k: v for k, v in headers.items() if k.lower() not in DROP_HEADERS}
    for key in [k for k in out if k.lower() == "content-type"]:
        if out[key].split(";")[0].strip().lower() in FORM_TYPES:
            out[key] = "application/json"
    return out


def check_request(
    method: str, path: str, headers: Mapping[str, str], body: bytes
) -> Problem | None:
    """None if the request may go on to Triton, else the Problem to answer with."""
    if method != "POST" or not body:
        return None
    head, problem = json_part(headers, body)
    if problem is not None:
        return problem
    try:
        doc = json.loads(head)
    except RecursionError:
        return bad("malformed", f"request JSON is nested deeper than {MAX_JSON_DEPTH} levels")
    except (UnicodeDecodeError, ValueError) as e:
        return bad("malformed", f"request body is not valid UTF-8 JSON: {e}")
    if depth(doc) > MAX_JSON_DEPTH:
        return bad("malformed", f"request JSON is nested deeper than {MAX_JSON_DEPTH} levels")
    return None


def json_part(headers: Mapping[str, str], body: bytes) -> tuple[bytes, Problem | None]:
    """The JSON header of a body: all of it, or the first N bytes of a binary-tensor request."""
    declared = headers.get("inference-header-content-length")
    if declared is None:
        return body, None
    if not declared.isdigit() or int(declared) > len(body):
        return b"", bad(
            "malformed",
            f"Inference-Header-Content-Length must be 0..{len(body)} (the body size);"
            f" got {declared!r}",
        )
    return body[: int(declared)], None


def depth(doc) -> int:
    """Nesting depth of parsed JSON, iteratively (the point is to survive deep input)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            deepest = max(deepest, level)
            if level <= MAX_JSON_DEPTH:
                stack.extend((child, level + 1) for child in node if isinstance(child, dict | list))
    return deepest


def bad(reason: str, message: str) -> Problem:
    return Problem(400, reason, message)
