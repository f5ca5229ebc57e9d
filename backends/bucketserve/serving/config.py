"""ServeConfig: everything the launcher renders into a run folder; one source of defaults."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bucketserve.scheduling.config import SchedulerConfig

DEVICE_RE = re.compile(r"^(cpu|cuda:\d+)$")
KNOWN_POLICIES = ("static", "fcfs", "distserve", "bucketserve", "bucketserve+")
DEFAULT_MODEL = "smollm2"
MAX_REQUEST_BYTES_LIMIT = 64 * 1024 * 1024  # the front holds one body in memory per request


@dataclass(slots=True)
class ServeConfig:
    """Settings of one server run; validated here, read by every Triton model from run_config.json."""

    model: str = DEFAULT_MODEL
    policy: str = "bucketserve"
    prefill_devices: list[str] = field(default_factory=lambda: ["cpu"])
    decode_devices: list[str] = field(default_factory=lambda: ["cpu"])
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    run_dir: str = ".run/serve"
    run_id: str = ""  # "": a fresh random id per launch (names the shared-memory segments)
    dtype: str = "auto"  # engine.config.auto_dtype: bf16 on GPUs and bf16-capable CPUs
    attention: str = "auto"
    block_size: int | None = None  # None: 16, or 256 with flash_attn
    kv_cache_gb: float | None = None  # None: 1 GiB per CPU pool, 0.9 x free memory on GPU
    max_model_len: int | None = None  # None: the model's own context length
    default_max_tokens: int = 64
    handoff_timeout_s: float = 30.0
    preprocessing_instances: int = 2
    max_prefill_tokens: int = 4096  # prompt tokens per prefill batch (a longer prompt runs alone)
    max_decode_batch: int = 256  # sequences in one decode instance's running batch
    stream_interval_s: float = (
        0.0  # decode sender: min seconds between sends (0: coalesce when behind)
    )
    log_verbose: int = 0
    scheduler: dict = field(default_factory=dict)  # SchedulerConfig overrides, e.g. ablations
    model_dir: str = ""  # filled by the launcher: the resolved local checkpoint directory
    # GPU: share of total memory one engine instance may use; None: 0.9 split evenly among the
    # instances on that GPU (deterministic, whatever order they load in)
    gpu_memory_utilization: float | None = None
    cuda_graphs: bool = True  # GPU decode steps replayed as CUDA graphs; False: eager
    # fault tolerance and overload (serving/front, serving/supervisor, scheduling/admission)
    max_request_bytes: int = 4 * 1024 * 1024  # HTTP bodies above this get 413 at the front
    max_queued_requests: int = 0  # 0: sized from memory at start (scheduling/admission.py)
    max_concurrent_requests: int = 0  # requests in flight at the front; 0: no cap
    drain_timeout_s: float = 30.0  # SIGTERM: how long in-flight requests may finish
    restart_backoff_max_s: float = 30.0  # supervisor: longest wait between restarts
    openai_port: int = 9000  # the OpenAI-compatible front end's port; 0: do not start it

    def __post_init__(self) -> None:
        if self.policy not in KNOWN_POLICIES:
            raise ValueError(
                f"policy must be one of {', '.join(KNOWN_POLICIES)}; got {self.policy!r}"
            )
        for name in ("prefill_devices", "decode_devices"):
            devices = getattr(self, name)
            if not devices:
                raise ValueError(f"{name} must name at least one device (cpu or cuda:N)")
            for dev in devices:
                if not DEVICE_RE.match(dev):
                    raise ValueError(f"{name}: device must be 'cpu' or 'cuda:N', got {dev!r}")
        for name in ("http_port", "grpc_port", "metrics_port"):
            port = getattr(self, name)
            if not 0 < port < 65536:
                raise ValueError(f"{name} must be in 1..65535, got {port}")
        if not 0 <= self.openai_port < 65536:
            raise ValueError(
                f"openai_port must be in 0..65535 (0 disables), got {self.openai_port}"
            )
        if self.block_size is not None and not 1 <= self.block_size <= 1024:
            raise ValueError(f"block_size must be in 1..1024, got {self.block_size}")
        if self.kv_cache_gb is not None and self.kv_cache_gb <= 0:
            raise ValueError(f"kv_cache_gb must be > 0, got {self.kv_cache_gb}")
        for name in ("max_prefill_tokens", "max_decode_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.stream_interval_s <= 1.0:
            raise ValueError(f"stream_interval_s must be in [0, 1], got {self.stream_interval_s}")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be >= 1, got {self.default_max_tokens}")
        if self.run_id and not re.match(r"^[A-Za-z0-9]{1,12}$", self.run_id):
            raise ValueError(f"run_id must be 1-12 letters or digits, got {self.run_id!r}")
        self.check_fault_fields()
        # Unknown or invalid options fail here. The model's context length is not known yet:
        # check against the configured one, else the smallest, so no limit that depends on it
        # (e.g. max_batched_tokens >= max_model_len) rejects a value the real model accepts.
        self.scheduler_config(max_model_len=self.max_model_len or 2)

    def check_fault_fields(self) -> None:
        if not 1024 <= self.max_request_bytes <= MAX_REQUEST_BYTES_LIMIT:
            raise ValueError(
                f"max_request_bytes must be in 1024..{MAX_REQUEST_BYTES_LIMIT} (Triton's HTTP"
                f" front end crashes on bigger bodies, fact 11); got {self.max_request_bytes}"
            )
        if self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be >= 0, got {self.max_queued_requests}")
        if self.max_concurrent_requests < 0:
            raise ValueError(
                f"max_concurrent_requests must be >= 0, got {self.max_concurrent_requests}"
            )
        if self.drain_timeout_s < 0 or self.restart_backoff_max_s < 1:
            raise ValueError(
                "drain_timeout_s must be >= 0 and restart_backoff_max_s >= 1; got"
                f" {self.drain_timeout_s} and {self.restart_backoff_max_s}"
            )

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        """The SchedulerConfig for a model context of max_model_len, with `scheduler` applied."""
        return SchedulerConfig.with_overrides(
            self.scheduler,
            max_model_len=max_model_len,
            block_size=self.block_size or 16,
            max_prefill_tokens=self.max_prefill_tokens,
            max_num_seqs=self.max_decode_batch,
        )

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir).resolve()

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, path: str | Path) -> ServeConfig:
        return cls(**json.loads(Path(path).read_text()))
