"""Only the public API is public: what the edge serves to whom (docs/security.md).

Clients reach the entry models' inference and metadata endpoints, health, metrics and the OpenAI
routes. Internal models (prefill_N, decode_N, scheduler, preprocessing, decode_router) answer 404
as if absent: a direct call would run work outside the scheduler's admission and answer with
internal details. Triton's shared-memory (system and CUDA), model-repository, trace and logging
APIs answer 403 unless an admin key is configured and sent (header `admin-key`, Triton's own
restricted-API style): registering a shared-memory region lets a client read or write any
/dev/shm segment of the host, the KV pools included. With an API key every route but health and
metrics (those too with `metrics_need_key`) needs `Authorization: Bearer <key>` (401 otherwise).
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass

ENTRY_MODELS = frozenset({"bucketserve", "bucketserve_bls", "ensemble", "tensorrt_llm_bls"})
ADMIN_HEADER = "admin-key"
API_KEY_HEADER = "api-key"  # on Triton's gRPC port: metadata 'triton-grpc-protocol-api-key'
GRPC_PREFIX = "triton-grpc-protocol-"  # Triton's prefix for restricted-protocol metadata
# Triton's API groups a client must not use (names as its --*-restricted-* flags spell them)
ADMIN_GROUPS = ("shared-memory", "model-repository", "trace", "logging")
ADMIN_PREFIXES = ("/v2/systemsharedmemory", "/v2/cudasharedmemory", "/v2/repository",
                  "/v2/trace", "/v2/logging", "/v2/models/stats")  # fmt: skip
OPEN = frozenset({"/v2", "/v2/health/live", "/v2/health/ready", "/health", "/metrics"})
HEALTH = frozenset({"/v2/health/live", "/v2/health/ready", "/health"})  # probes: never keyed
MODEL_PATH = re.compile(r"/v2/models/(?P<model>[^/]+)(?:/versions/[^/]+)?(?P<action>/.*)?")
MODEL_ACTIONS = frozenset({None, "/ready", "/config", "/stats", "/infer", "/generate",
                           "/generate_stream"})  # fmt: skip


@dataclass(slots=True, frozen=True)
class Refusal:
    """Why the edge will not serve a path: HTTP status, a metric label, a message."""

    status: int
    reason: str
    message: str


@dataclass(slots=True, frozen=True)
class AccessPolicy:
    """Who may use which path. `public_models` None: no allow-list (a test stand-in for Triton,
    whose model names are not ours); empty keys: that check is off."""

    public_models: frozenset[str] | None = ENTRY_MODELS
    admin_key: str = ""
    api_key: str = ""
    metrics_need_key: bool = False  # /metrics behind the API key too (health never is)

    def check(self, path: str, headers: Mapping[str, str]) -> Refusal | None:
        """None if the request may go on, else the Refusal to answer with."""
        is_admin = bool(self.admin_key) and same(headers.get(ADMIN_HEADER, ""), self.admin_key)
        keyless = path in HEALTH or (path == "/metrics" and not self.metrics_need_key)
        if self.api_key and not is_admin and not keyless:
            if not same(bearer(headers.get("authorization", "")), self.api_key):
                return Refusal(401, "unauthenticated", "missing or wrong API key: send the"
                               " header 'Authorization: Bearer <key>' (--api-key)")  # fmt: skip
        if is_admin or self.public_models is None or path in OPEN or path.startswith("/v1/"):
            return None
        found = MODEL_PATH.fullmatch(path)
        if path.startswith(ADMIN_PREFIXES) or (found and (found["action"] or "").startswith("/trace")):  # fmt: skip
            why = "send the header 'admin-key: <key>'" if self.admin_key else "no --admin-key set"
            return Refusal(403, "restricted", f"{path} is an administrator API ({why})")
        if found and found["model"] in self.public_models and found["action"] in MODEL_ACTIONS:
            return None
        if found:  # Triton's own words for a model it does not have
            return Refusal(404, "not_found", f"Request for unknown model: '{found['model']}'"
                           " is not found")  # fmt: skip
        return Refusal(404, "not_found", f"no such endpoint: {path}")


def grpc_metadata(api_key: str) -> tuple[tuple[str, str], ...]:
    """What the edge sends with each gRPC call to Triton: the API key its port requires."""
    return ((GRPC_PREFIX + API_KEY_HEADER, api_key),) if api_key else ()


def bearer(value: str) -> str:
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())
