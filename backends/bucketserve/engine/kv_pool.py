"""Sizing and allocating the paged KV pool through the kv transport (so peers can open it)."""

from __future__ import annotations

import logging

import torch

from bucketserve.engine.shapes import DTYPE_BYTES, ModelConfig

log = logging.getLogger(__name__)

SHM_HEADROOM = 0.9  # leave /dev/shm room for the Python backend's own tensors
CPU_DEFAULT_KV_GB = 1.0  # CPU pool when kv_cache_gb is not given
# cuBLAS workspaces, CUDA-graph memory pools, allocator fragmentation: not derivable from shapes.
FIXED_GPU_RESERVE = 1 << 30


def pool_shape(mc: ModelConfig, num_blocks: int, block_size: int) -> tuple[int, ...]:
    """[layers, 2, num_blocks, block_size, kv_heads, head_dim]."""
    return (mc.num_layers, 2, num_blocks, block_size, mc.num_kv_heads, mc.head_dim)


def block_bytes(mc: ModelConfig, block_size: int) -> int:
    """Bytes one KV block occupies across all layers (K and V)."""
    return mc.kv_bytes_per_token * block_size


def activation_bytes(mc: ModelConfig, config, attention: str) -> int:
    """Peak activation memory of one step, from the shapes: the largest prefill batch
    (max_num_batched_tokens, or one max_model_len prompt) through one layer, the decode logits, the SDPA gather workspace."""
    nbytes = DTYPE_BYTES[mc.dtype]
    q, kv = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
    # residual + normed input + attention out + MLP out; qkv and its padded SDPA copy;
    # gate_up, the activation and its input to down_proj
    per_token = 4 * mc.hidden_size + 2 * (q + 2 * kv) + 3 * mc.intermediate_size
    # a prompt longer than the batch budget runs alone, so the peak is the larger of the two
    prefill = max(config.max_num_batched_tokens, mc.max_model_len) * per_token * nbytes
    logits = 2 * max(config.max_num_seqs, 1) * mc.vocab_size * 4  # float32 logits + softmax
    gather = 0
    if attention == "sdpa":  # decode gathers every sequence's padded K and V (engine/sdpa_*)
        gather = 2 * config.max_num_seqs * mc.max_model_len * kv * nbytes
    return prefill + logits + gather


def auto_num_blocks(config, device: torch.device, block_size: int, mc: ModelConfig,
                    attention: str = "sdpa") -> int:  # fmt: skip
    """Pool size: kv_cache_gb when given (CPU: capped by free /dev/shm); on GPU otherwise
    gpu_memory_utilization x total memory, less this process's weights and activations."""
    per_block = block_bytes(mc, block_size)
    if device.type == "cuda":
        budget, where = gpu_pool_budget(config, device, mc, attention)
    else:
        budget, where = _cpu_pool_budget(config)
    num_blocks = max(0, budget) // per_block
    needed = -(-mc.max_model_len // block_size)
    if num_blocks < needed:
        raise ValueError(
            f"KV pool too small: {where} holds {num_blocks} blocks of {block_size} tokens, "
            f"one max_model_len={mc.max_model_len} sequence needs {needed}. Enlarge /dev/shm "
            f"(docker --shm-size / compose shm_size), raise kv_cache_gb or "
            f"gpu_memory_utilization, or lower max_model_len."
        )
    return num_blocks


def _cpu_pool_budget(config) -> tuple[int, str]:
    from bucketserve.kv.shm import shm_free_bytes

    want_gb = config.kv_cache_gb if config.kv_cache_gb is not None else CPU_DEFAULT_KV_GB
    shm_free = shm_free_bytes()
    budget = min(int(want_gb * 2**30), int(shm_free * SHM_HEADROOM))
    if budget < want_gb * 2**30:
        log.warning("KV pool capped at %.2f GiB by free /dev/shm", budget / 2**30)
    return budget, f"kv_cache_gb={want_gb} capped by /dev/shm ({shm_free / 2**30:.2f} GiB free)"


def gpu_pool_budget(config, device, mc: ModelConfig, attention: str) -> tuple[int, str]:
    """Bytes for the pool on a GPU. Sized from *total* memory and this process's own allocations
    (not from free memory), so two instances sharing a GPU get the same split whatever order
    they load in; an explicit kv_cache_gb is taken as is."""
    torch.cuda.empty_cache()  # weights fused away at load still sit in the allocator's cache
    free, total = torch.cuda.mem_get_info(device)
    if config.kv_cache_gb is not None:
        budget, where = int(config.kv_cache_gb * 2**30), f"kv_cache_gb={config.kv_cache_gb}"
    else:
        own = torch.cuda.memory_allocated(device)  # weights (and rope tables) of this instance
        act = activation_bytes(mc, config, attention) + FIXED_GPU_RESERVE
        budget = int(total * config.gpu_memory_utilization) - own - act
        where = (f"gpu_memory_utilization={config.gpu_memory_utilization} of "
                 f"{total / 2**30:.1f} GiB less {own / 2**30:.1f} GiB weights and "
                 f"{act / 2**30:.1f} GiB activations")  # fmt: skip
    if budget > free:
        raise ValueError(
            f"KV pool of {budget / 2**30:.1f} GiB ({where}) exceeds the {free / 2**30:.1f} GiB "
            f"free on {device}: lower gpu_memory_utilization or kv_cache_gb (instances sharing "
            f"a GPU must together stay under 1.0)"
        )
    return budget, where


def allocate_kv_pool(
    mc: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device, name: str
) -> tuple[torch.Tensor, object]:
    """Allocate the exportable pool tensor and its PoolHandle."""
    from bucketserve.kv.transport import allocate_pool

    shape = pool_shape(mc, num_blocks, block_size)
    return allocate_pool(shape, dtype, device, name)
