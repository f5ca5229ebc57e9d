"""Packed prefill through torch SDPA as a few 4-D calls: sequences of similar length are
right-padded into one [b, H, S, D] batch per group (no Python loop over sequences).

Why 4-D: SDPA's fused kernels (flash, mem-efficient, cuDNN) refuse 3-D input and fall back to
the math kernel, which materialises the [H, n, n] scores (8.6 GB per layer for an 8k prompt on
Llama-3-8B; docs/platform-notes.md#p14-sdpa-fused-kernels-need-4-d-input). Why right padding is
exact: with is_causal=True query i sees keys 0..i, which are all real tokens for every real
query row; the padded rows compute garbage that is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

PAD_GROWTH = 1.5  # a new group starts where a prompt is > 1.5x the group's shortest
CPU_QUERY_CHUNK = 128  # CPU: query rows per SDPA call on long prompts


@dataclass(slots=True)
class PrefillGroup:
    """Sequences padded together into one [b, S, ...] batch."""

    num_seqs: int
    max_len: int
    # [n_tokens] int64 packed-token rows of this group, and where each lands in the flattened
    # padded [b * S] batch; None: the group is the whole batch with equal lengths (a view).
    token_rows: torch.Tensor | None
    padded_rows: torch.Tensor | None


def plan_prefill_groups(seq_lens: list[int], to_tensor) -> list[PrefillGroup]:
    """Group sequences by length (bounded padding); index tensors built once per step."""
    if len(set(seq_lens)) == 1:
        return [PrefillGroup(len(seq_lens), seq_lens[0], None, None)]
    starts = [0]
    for n in seq_lens[:-1]:
        starts.append(starts[-1] + n)
    order = sorted(range(len(seq_lens)), key=seq_lens.__getitem__)
    groups, first = [], 0
    for j in range(1, len(order) + 1):
        if j == len(order) or seq_lens[order[j]] > PAD_GROWTH * seq_lens[order[first]]:
            groups.append(_group([order[i] for i in range(first, j)], seq_lens, starts, to_tensor))
            first = j
    return groups


def _group(rows: list[int], seq_lens: list[int], starts: list[int], to_tensor) -> PrefillGroup:
    max_len = max(seq_lens[r] for r in rows)
    token_rows, padded_rows = [], []
    for slot, r in enumerate(rows):
        token_rows.extend(range(starts[r], starts[r] + seq_lens[r]))
        padded_rows.extend(range(slot * max_len, slot * max_len + seq_lens[r]))
    return PrefillGroup(
        len(rows), max_len, to_tensor(token_rows, torch.int64), to_tensor(padded_rows, torch.int64)
    )


def padded_prefill(q, k, v, groups: list[PrefillGroup], scale: float, causal_mask) -> torch.Tensor:
    """q: [T, H, D]; k, v: [T, KVH, D] packed -> [T, H, D], one 4-D SDPA per group."""
    (first, *rest) = groups
    if not rest and first.token_rows is None:
        return _attend(q, k, v, first, scale, causal_mask)
    out = torch.empty_like(q)
    for group in groups:
        part = _attend(q, k, v, group, scale, causal_mask)  # [n_tokens, H, D]
        out.index_copy_(0, group.token_rows, part)
    return out


def _attend(q, k, v, group: PrefillGroup, scale: float, causal_mask) -> torch.Tensor:
    b, s = group.num_seqs, group.max_len
    q4, k4, v4 = (_to_padded(x, group).view(b, s, x.shape[1], x.shape[2]).transpose(1, 2)
                  for x in (q, k, v))  # fmt: skip  # [b, heads, S, D]
    out = _sdpa_causal(q4, k4, v4, scale, causal_mask)  # [b, H, S, D]
    out = out.transpose(1, 2).reshape(b * s, q.shape[1], q.shape[2])
    return out if group.padded_rows is None else out.index_select(0, group.padded_rows)


def _to_padded(x: torch.Tensor, group: PrefillGroup) -> torch.Tensor:
    """x: [T, heads, D] -> [b * S, heads, D] (zeros in the padding)."""
    if group.token_rows is None:
        return x
    padded = x.new_zeros(group.num_seqs * group.max_len, x.shape[1], x.shape[2])
    return padded.index_copy_(0, group.padded_rows, x.index_select(0, group.token_rows))


def _sdpa_causal(q, k, v, scale: float, causal_mask) -> torch.Tensor:
    """q: [b, H, S, D]; k, v: [b, KVH, S, D] -> [b, H, S, D]."""
    if q.device.type == "cuda":
        if k.shape[1] != q.shape[1]:  # mem-efficient/cuDNN take no enable_gqa: expand instead
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    n = q.shape[2]
    if n <= CPU_QUERY_CHUNK:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    # Measured on CPU: is_causal=True over long prompts is ~3x slower than query chunks with
    # explicit masks, which also skip the keys after each chunk.
    mask = causal_mask(n)
    outs = []
    for s in range(0, n, CPU_QUERY_CHUNK):
        e = min(n, s + CPU_QUERY_CHUNK)
        outs.append(F.scaled_dot_product_attention(
            q[:, :, s:e], k[:, :, :e], v[:, :, :e], attn_mask=mask[s:e, :e], scale=scale,
            enable_gqa=True,
        ))  # fmt: skip
    return torch.cat(outs, dim=2)
