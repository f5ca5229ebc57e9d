"""ServeConfig: everything the launcher renders into a run folder; one source of defaults."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bucketserve.scheduling.config import SchedulerConfig

DEVICE_RE = re.compile(r"^(cpu|cuda:\d+)$")
KNOWN_POLICIES = ("static", "fcfs", "distserve", "bucketserve", "bucketserve+", "edf")
TOPOLOGIES = ("auto", "disaggregated", "colocated", "hybrid")
# Why "auto" runs colocated (docs/scheduling.md, "Hybrid instances and the kill test" and "The
# real server: disaggregated vs colocated"): chunked colocated instances won every cell of the
# simulated SLO grid (TPOT 40-100 ms x TTFT 0.5-2x default, 3 workloads, 3 seeds; >= 1.6x the
# best DistServe split) and 1.28x on the 2-core CPU server; disaggregation only pays where the
# TPOT SLO is tighter than one fused iteration, which the default SLOs are not.
# keeps a fused iteration near 0.1 s on a CPU (measured on 2 cores: 64 tokens + 8 decodes take
# 106 ms with 2 threads, 128 take 212 ms): per intra-op thread of the instance
CHUNK_TOKENS_PER_CPU_THREAD = 32
CHUNK_TOKENS_GPU = 512  # Sarathi-Serve's usual budget on a GPU
DEFAULT_MODEL = "smollm2"
MAX_REQUEST_BYTES_LIMIT = 64 * 1024 * 1024  # the front holds one body in memory per request
SECRET_FIELDS = ("admin_key", "api_key")


@dataclass(slots=True)
class ServeConfig:
    """Settings of one server run; validated here, read by every Triton model from run_config.json."""

    model: str = DEFAULT_MODEL
    policy: str = "bucketserve"
    # disaggregated: prefill instances hand KV to decode instances; colocated: every
    # instance (one per decode device) runs fused decode + prompt-chunk iterations, no hand-off;
    # auto (resolved in __post_init__): colocated over the devices of both roles (see TOPOLOGIES)
    topology: str = "auto"
    # tokens per fused iteration (colocated): decodes + prompt chunks; 0: by device (see
    # iteration_tokens)
    chunk_tokens: int = 0
    # hybrid (colocated instances whose prompt-token budgets the scheduler's RoleController
    # sets: mixed, prefill-heavy or decode-only; decodes move through the KV hand-off;
    # scheduling/roles.py): -1 adaptive, k >= 0 a fixed layout (0: all mixed, k: k heavy)
    hybrid_layout: int = -1
    hybrid_period_s: float = 10.0  # how often the controller reads attainment and may move
    hybrid_heavy_tokens: int = 2048  # a prefill-heavy instance's prompt-token budget
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
    enable_prefix_caching: bool = True  # engine instances reuse the KV of shared prompt prefixes
    # fault tolerance and overload (serving/front, serving/launch/supervisor, scheduling/admission)
    max_request_bytes: int = 4 * 1024 * 1024  # HTTP bodies above this get 413 at the front
    max_queued_requests: int = 0  # 0: sized from memory at start (scheduling/admission.py)
    max_concurrent_requests: int = 0  # requests in flight at the front; 0: no cap
    drain_timeout_s: float = 30.0  # SIGTERM: how long in-flight requests may finish
    restart_backoff_max_s: float = 30.0  # supervisor: longest wait between restarts
    # the canary through the whole chain (serving/launch/canary.py): every interval (0: off), failed
    # when no FINAL within the timeout while no other request finished; this many in a row
    # mark the chain wedged and restart the server
    canary_interval_s: float = 5.0
    canary_timeout_s: float = 20.0
    canary_failures: int = 2
    openai_port: int = 9000  # a second port of the HTTP edge (OpenAI clients); 0: none
    # security (serving/front/allowlist.py, docs/security.md); never written to run_config.json
    admin_key: str = field(default="", repr=False)  # opens Triton's admin APIs; "": closed
    api_key: str = field(default="", repr=False)  # required on v2, OpenAI and gRPC; "": open
    metrics_need_api_key: bool = False  # the edge's /metrics behind the API key too

    def __post_init__(self) -> None:
        if self.policy not in KNOWN_POLICIES:
            raise ValueError(
                f"policy must be one of {', '.join(KNOWN_POLICIES)}; got {self.policy!r}"
            )
        if self.topology not in TOPOLOGIES:
            raise ValueError(
                f"topology must be one of {', '.join(TOPOLOGIES)}; got {self.topology!r}"
            )
        if self.topology == "auto":
            self.topology, self.decode_devices = "colocated", self.auto_devices()
        elif self.topology == "hybrid":  # resolved once: the instances take every device
            self.decode_devices, self.prefill_devices = self.auto_devices(), []
            self.check_hybrid_fields()
        if self.chunk_tokens and not 16 <= self.chunk_tokens <= 65536:
            raise ValueError(
                f"chunk_tokens must be 0 (auto) or in 16..65536, got {self.chunk_tokens}"
            )
        for name in ("prefill_devices", "decode_devices"):
            devices = getattr(self, name)
            if not devices and not (name == "prefill_devices" and self.is_hybrid):
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
        for name in SECRET_FIELDS:
            key = getattr(self, name)
            if key and (len(key) < 8 or not key.isprintable() or " " in key or "," in key):
                raise ValueError(f"{name} must be 8 or more printable characters without spaces"
                                 f" or commas (got {len(key)} characters)")  # fmt: skip
        # Unknown or invalid options fail here. The model's context length is not known yet:
        # check against the configured one, else the smallest, so no limit that depends on it
        # (e.g. max_batched_tokens >= max_model_len) rejects a value the real model accepts.
        self.scheduler_config(max_model_len=self.max_model_len or 2)

    def check_fault_fields(self) -> None:
        if not 1024 <= self.max_request_bytes <= MAX_REQUEST_BYTES_LIMIT:
            raise ValueError(
                f"max_request_bytes must be in 1024..{MAX_REQUEST_BYTES_LIMIT} (Triton's HTTP"
                f" front end crashes on bigger bodies); got {self.max_request_bytes}"
                # docs/platform-notes.md#p11-large-form-body-crash
            )
        if self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be >= 0, got {self.max_queued_requests}")
        if self.max_concurrent_requests < 0:
            raise ValueError(
                f"max_concurrent_requests must be >= 0, got {self.max_concurrent_requests}"
            )
        if self.canary_interval_s < 0 or self.canary_timeout_s <= 0 or self.canary_failures < 1:
            raise ValueError(
                "canary_interval_s must be >= 0 (0: off), canary_timeout_s > 0 and"
                f" canary_failures >= 1; got {self.canary_interval_s}, {self.canary_timeout_s}"
                f" and {self.canary_failures}"
            )
        if self.drain_timeout_s < 0 or self.restart_backoff_max_s < 1:
            raise ValueError(
                "drain_timeout_s must be >= 0 and restart_backoff_max_s >= 1; got"
                f" {self.drain_timeout_s} and {self.restart_backoff_max_s}"
            )

    def check_hybrid_fields(self) -> None:
        from bucketserve.scheduling.roles import HEAVY

        n = len(self.decode_devices)
        if n < 2:
            raise ValueError(
                f"topology hybrid needs at least 2 instances (--prefill-devices and "
                f"--decode-devices together name {n})"
            )
        if not -1 <= self.hybrid_layout < n:
            raise ValueError(f"hybrid_layout must be -1 (adaptive) or in 0..{n - 1} (the "
                             f"number of prefill-heavy instances), got {self.hybrid_layout}")  # fmt: skip
        if not HEAVY <= self.hybrid_heavy_tokens <= 65536:
            raise ValueError(
                f"hybrid_heavy_tokens must be in {HEAVY}..65536, got {self.hybrid_heavy_tokens}"
            )
        if self.iteration_tokens >= HEAVY:
            raise ValueError(f"topology hybrid: chunk_tokens (a mixed instance's budget) must "
                             f"be below {HEAVY}, got {self.iteration_tokens}")  # fmt: skip
        if not 0.5 <= self.hybrid_period_s <= 3600:
            raise ValueError(f"hybrid_period_s must be in 0.5..3600, got {self.hybrid_period_s}")

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        """The SchedulerConfig for a model context of max_model_len, with `scheduler` applied."""
        return SchedulerConfig.with_overrides(
            self.scheduler,
            max_model_len=max_model_len,
            block_size=self.block_size or 16,
            max_prefill_tokens=self.max_prefill_tokens,
            max_num_seqs=self.max_decode_batch,
        )

    def auto_devices(self) -> list[str]:
        """Colocated instances on the devices of both roles: every CPU entry is one instance
        (single-threaded instances scale better than one on more threads), a GPU one each."""
        devices = self.prefill_devices + self.decode_devices
        return [d for i, d in enumerate(devices) if d == "cpu" or d not in devices[:i]]

    @property
    def is_colocated(self) -> bool:
        """Every instance is an engine that can prefill and decode (no prefill models):
        colocated, or hybrid (whose instances change budgets and hand decodes to each other)."""
        return self.topology in ("colocated", "hybrid")

    @property
    def is_hybrid(self) -> bool:
        return self.topology == "hybrid"

    @property
    def iteration_tokens(self) -> int:
        """Colocated: the token budget of one fused iteration (chunk_tokens, or by device)."""
        if self.chunk_tokens:
            return self.chunk_tokens
        if set(self.decode_devices) != {"cpu"}:
            return CHUNK_TOKENS_GPU
        sharing = (self.engine_prefill_devices + self.decode_devices).count("cpu")
        return CHUNK_TOKENS_PER_CPU_THREAD * max(1, (os.cpu_count() or 1) // sharing)

    @property
    def engine_prefill_devices(self) -> list[str]:
        """Devices that run a prefill-only instance (none when colocated)."""
        return [] if self.is_colocated else self.prefill_devices

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir).resolve()

    def write(self, path: Path) -> None:
        """run_config.json for the models: every setting but the keys (the stubs need none)."""
        doc = {k: v for k, v in asdict(self).items() if k not in SECRET_FIELDS}
        path.write_text(json.dumps(doc, indent=2))

    @classmethod
    def read(cls, path: str | Path) -> ServeConfig:
        return cls(**json.loads(Path(path).read_text()))
