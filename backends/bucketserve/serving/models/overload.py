"""The scheduler's admission gate on Triton: busy errors with code UNAVAILABLE, and their metrics."""

from __future__ import annotations

import psutil
import triton_python_backend_utils as pb_utils

from bucketserve.scheduling.admission import AdmissionGate, default_queue_limit, max_prompt_bytes
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.models.metrics import counter, gauge

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def queue_limit(cfg: ServeConfig, max_model_len: int) -> int:
    """--max-queued-requests, or (0) what fits in a share of the memory available now."""
    if cfg.max_queued_requests:
        return cfg.max_queued_requests
    return default_queue_limit(psutil.virtual_memory().available, max_model_len)


class Admission:
    """Admit, or answer at once with a FINAL "server busy" error (HTTP 503 / gRPC UNAVAILABLE)."""

    def __init__(self, cfg: ServeConfig, max_model_len: int) -> None:
        self.gate = AdmissionGate(queue_limit(cfg, max_model_len))
        self.rejected = counter(
            "requests_rejected_total", "Requests answered 'server busy'", {"reason": "queue_full"}
        )
        gauge("queue_limit", "Most requests that may wait for prefill", {}).set(self.gate.limit)

    def admit(self, sender, queued: int) -> bool:
        if self.gate.admit(queued):
            return True
        self.rejected.increment(1)
        busy = pb_utils.TritonError(self.gate.busy_message(), pb_utils.TritonError.UNAVAILABLE)
        sender.send(pb_utils.InferenceResponse(error=busy), flags=FINAL)
        return False


def prompt_byte_limit(tokenizer, max_model_len: int) -> int:
    """max_prompt_bytes for this tokenizer: its longest token, in UTF-8 bytes, bounds the ratio."""
    longest = max(len(t.encode("utf-8", "surrogatepass")) for t in tokenizer.get_vocab())
    return max_prompt_bytes(max(longest, 1), max_model_len)
