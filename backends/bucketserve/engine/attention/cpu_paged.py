"""CPU attention: SDPA prefill, and a C++ paged decode kernel that reads the KV pool through
the block tables (no gather copy, no padding mask). float32 or bfloat16."""

from __future__ import annotations

import torch

from bucketserve.engine.attention.base import AttentionMetadata, fill_block_tables
from bucketserve.engine.attention.sdpa import SdpaBackend


class CpuPagedBackend(SdpaBackend):
    """SdpaBackend with decode replaced by torch.ops.bucketserve.paged_attention_decode."""

    name = "cpu_paged"

    def prepare_decode(self, meta, tables, context_lens, block_size, to_tensor) -> None:
        """Fill meta with the padded block table and context lengths."""
        fill_block_tables(meta, tables, context_lens, block_size, to_tensor)

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [B, H, D]; caches [num_blocks, block_size, KVH, D] -> [B, H, D]."""
        return torch.ops.bucketserve.paged_attention_decode(
            q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale
        )
