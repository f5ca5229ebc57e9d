"""Only the public API is public: what the edge serves to whom (docs/security.md).

Clients reach the entry models' inference and metadata endpoints, health, metrics and the OpenAI
routes. Internal models (prefill_N, decode_N, scheduler, preprocessing, decode_router) answer 404
as if absent: a direct call would run work outside the scheduler's admission and answer with
internal details. Triton's shared-memory (system and CUDA), model-repository, trace and logging
APIs answer 403 unless an admin key is configured and sent (header `admin-key`, Triton's own
restricted-API style): registering a shared-memory region lets a client read or write any
/dev/shm segment of the host, the KV pools included. With an API key every route but health and
metrics (those too with `metrics_need_key`) needs `Authorization: Bearer <key>` (401 otherwise).

The public gRPC port (front/grpc_edge.py) follows the same rules, method by method
(`AccessPolicy.check_rpc`), in Triton's own gRPC words.
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
GRPC_ADMIN, GRPC_API_KEY = GRPC_PREFIX + ADMIN_HEADER, GRPC_PREFIX + API_KEY_HEADER
# Triton's API groups a client must not use (names as its --*-restricted-* flags spell them)
ADMIN_GROUPS = ("shared-memory", "model-repository", "trace", "logging")
ADMIN_PREFIXES = ("/v2/systemsharedmemory", "/v2/cudasharedmemory", "/v2/repository",
                  "/v2/trace", "/v2/logging")  # fmt: skip
OPEN = frozenset({"/v2", "/v2/health/live", "/v2/health/ready", "/health", "/metrics"})
HEALTH = frozenset({"/v2/health/live", "/v2/health/ready", "/health"})  # probes: never keyed
MODEL_PATH = re.compile(r"/v2/models/(?P<model>[^/]+)(?:/versions/[^/]+)?(?P<action>/.*)?")
MODEL_ACTIONS = frozenset({None, "/ready", "/config", "/stats", "/infer", "/generate",
                           "/generate_stream"})  # fmt: skip
# Read-only views served for every model, internal ones included: perf_analyzer profiling an
# ensemble reads each step's config and every model's statistics (names, shapes, instance
# counts and counters; no pool name, key or path). Inference of an internal model stays absent.
READ_ONLY_ACTIONS = frozenset({"/config", "/stats"})
READ_ONLY_RPCS = frozenset({"ModelConfig", "ModelStatistics"})
# Triton's gRPC methods (inference.GRPCInferenceService) by the API group its
# --grpc-restricted-protocol files them under; ADMIN_GROUPS among them need the admin key
GRPC_GROUPS = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace", "LogSettings": "logging",
}  # fmt: skip
# the methods whose request names a model (field 1: `name`, or `model_name` for inference)
GRPC_MODEL_METHODS = frozenset({"ModelReady", "ModelMetadata", "ModelInfer", "ModelStreamInfer",
                                "ModelConfig", "ModelStatistics"})  # fmt: skip


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
        if path == "/v2/models/stats":  # every model's statistics (read-only)
            return None
        found = MODEL_PATH.fullmatch(path)
        if path.startswith(ADMIN_PREFIXES) or (found and (found["action"] or "").startswith("/trace")):  # fmt: skip
            why = "send the header 'admin-key: <key>'" if self.admin_key else "no --admin-key set"
            return Refusal(403, "restricted", f"{path} is an administrator API ({why})")
        if found and found["model"] in self.public_models and found["action"] in MODEL_ACTIONS:
            return None
        if found and found["action"] in READ_ONLY_ACTIONS:
            return None
        if found:  # Triton's own words for a model it does not have
            return Refusal(404, "not_found", f"Request for unknown model: '{found['model']}'"
                           " is not found")  # fmt: skip
        return Refusal(404, "not_found", f"no such endpoint: {path}")

    def check_rpc(
        self, method: str, model: str | None, metadata: Mapping[str, str]
    ) -> Refusal | None:
        """The same rules for one call on the public gRPC port: `method` of GRPC_GROUPS,
        `model` the one its request names (None: none, or not read yet: the start of a
        stream), `metadata` the call's (lower-case keys). Messages are Triton's own: a key
        missing is `UNAVAILABLE This protocol is restricted, ...` (status 401/403 here), an
        internal model is absent (404)."""
        if bool(self.admin_key) and same(metadata.get(GRPC_ADMIN, ""), self.admin_key):
            return None  # the operator's view: every method, every model
        group = GRPC_GROUPS[method]
        if self.api_key and group != "health":
            if not same(metadata.get(GRPC_API_KEY, ""), self.api_key):
                return Refusal(401, "unauthenticated", restricted(GRPC_API_KEY))
        if group in ADMIN_GROUPS:
            return Refusal(403, "restricted", restricted(GRPC_ADMIN))
        if model is None or self.public_models is None or model in self.public_models:
            return None
        if method in READ_ONLY_RPCS:
            return None
        return Refusal(404, "not_found", unknown_model(model))


def restricted(header: str) -> str:
    """Triton's answer to a call without the key its restricted protocol needs (UNAVAILABLE)."""
    return f"This protocol is restricted, expecting header '{header}'"


def unknown_model(model: str) -> str:
    """What Triton answers for a model it does not have (ModelReady answers ready=false)."""
    return f"Request for unknown model: '{model}' is not found"


def grpc_metadata(api_key: str) -> tuple[tuple[str, str], ...]:
    """What the edge sends with each gRPC call to Triton: the API key its port requires."""
    return ((GRPC_API_KEY, api_key),) if api_key else ()


def bearer(value: str) -> str:
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())
