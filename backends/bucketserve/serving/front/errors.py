"""One error mapping for the edge: what a refusal means is decided once, its body shape by route.

v2 routes answer Triton's own shape (`{"error": "..."}`), so tritonclient and curl users parse
ours the same way; OpenAI routes (`/v1/...`) answer OpenAI's (`{"error": {"message", "type",
"param", "code"}}`), so the OpenAI SDKs raise the right exception class. Busy, not ready and
went-away are 503 with `Retry-After` on both.
"""

from __future__ import annotations

import re

from starlette.responses import JSONResponse

OPENAI_PREFIX = "/v1/"
BUSY_MARK = "server busy"  # the scheduler's and the edge's words for "retry later"
# an error answer from Triton that means "retry": busy, a restarting server, a dead stub
OVERLOAD = re.compile(r"busy|retry|overload|not healthy|shutting down", re.I)
RETRY = {"Retry-After": "1"}


def is_openai(path: str) -> bool:
    return path.startswith(OPENAI_PREFIX)


def openai_body(status: int, message: str, param: str | None = None, kind: str = "") -> dict:
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def error(status: int, message: str, retry: bool = False) -> JSONResponse:
    """Triton's own error body shape (v2 routes)."""
    return JSONResponse({"error": message}, status_code=status, headers=RETRY if retry else None)


def refuse(path: str, status: int, message: str, retry: bool = False) -> JSONResponse:
    """A refusal of the edge itself (busy, not ready, not found, ...) in the route's shape."""
    if not is_openai(path):
        return error(status, message, retry)
    headers = RETRY if retry else None
    return JSONResponse(openai_body(status, message), status_code=status, headers=headers)
