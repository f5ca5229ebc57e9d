"""Per-row logits processing before sampling: stop-token masks, bad words, penalties, top-k/top-p.

Every function takes logits [N, V] and the N rows' SampleRows and returns new logits; index
lists are built in Python and moved with one pinned, non-blocking copy each.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def to_device(data: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One host list -> device tensor: pinned and non-blocking on CUDA."""
    if device.type != "cuda":
        return torch.tensor(data, dtype=dtype)
    return torch.tensor(data, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def mask_banned(logits: torch.Tensor, rows) -> torch.Tensor:
    """-inf on EOS/stop ids before min_tokens, and on the token that would complete a bad word."""
    row_idx, col_idx = [], []
    vocab = logits.shape[1]
    for i, row in enumerate(rows):
        ids = banned_ids(row)
        ids = [t for t in ids if t < vocab]
        row_idx.extend([i] * len(ids))
        col_idx.extend(ids)
    if not row_idx:
        return logits
    dev = logits.device
    logits = logits.clone()
    logits[to_device(row_idx, torch.int64, dev), to_device(col_idx, torch.int64, dev)] = NEG_INF
    return logits


def banned_ids(row) -> set[int]:
    """Token ids this row must not sample now."""
    p, out = row.params, set()
    if row.num_generated < p.min_tokens:
        out.update(p.stop_token_ids)
        if not p.ignore_eos:
            out.update(row.eos_token_ids)
    for word in p.bad_words_ids:
        prefix = word[:-1]
        if not prefix or tuple(row.token_ids[-len(prefix) :]) == prefix:
            out.add(word[-1])  # the next token would complete the bad word
    return out


def apply_penalties(logits: torch.Tensor, rows) -> torch.Tensor:
    """Repetition (HF: prompt + output), presence and frequency (OpenAI: output) penalties."""
    idx = [i for i, r in enumerate(rows) if r.params.uses_penalties]
    if not idx:
        return logits
    dev = logits.device
    seen_r, seen_c, out_r, out_c = [], [], [], []
    for n, i in enumerate(idx):
        row = rows[i]
        seen = set(row.token_ids)
        seen_r.extend([n] * len(seen))
        seen_c.extend(seen)
        generated = row.token_ids[len(row.token_ids) - row.num_generated :]
        out_r.extend([n] * len(generated))
        out_c.extend(generated)
    sub = logits[idx]  # [M, V] copy
    counts = torch.zeros_like(sub)
    if out_r:
        where = (to_device(out_r, torch.int64, dev), to_device(out_c, torch.int64, dev))
        ones = torch.ones(len(out_r), dtype=sub.dtype, device=dev)
        counts.index_put_(where, ones, accumulate=True)
    seen_mask = torch.zeros(sub.shape, dtype=torch.bool, device=dev)
    seen_mask[to_device(seen_r, torch.int64, dev), to_device(seen_c, torch.int64, dev)] = True
    params = [rows[i].params for i in idx]
    rep = to_device([p.repetition_penalty for p in params], sub.dtype, dev).unsqueeze(1)
    pres = to_device([p.presence_penalty for p in params], sub.dtype, dev).unsqueeze(1)
    freq = to_device([p.frequency_penalty for p in params], sub.dtype, dev).unsqueeze(1)
    penalised = torch.where(sub > 0, sub / rep, sub * rep)
    sub = torch.where(seen_mask, penalised, sub)
    sub = sub - freq * counts - pres * (counts > 0).to(sub.dtype)
    logits = logits.clone()
    logits[idx] = sub
    return logits


def apply_top_k_top_p(logits: torch.Tensor, rows) -> torch.Tensor:
    """Mask logits [N, V] outside each row's top-k and top-p nucleus with -inf.

    Works on the K best logits only (K = the largest top-k in the batch); a full-vocabulary
    sort happens only when some row asks for top-p without a top-k bound."""
    vocab, dev = logits.shape[1], logits.device
    bounded = all(r.params.uses_top_k or not r.params.uses_top_p for r in rows)
    k_max = max((r.params.top_k for r in rows if r.params.uses_top_k), default=vocab)
    k_max = min(k_max, vocab) if bounded else vocab
    top_k = [min(r.params.top_k, vocab) if r.params.uses_top_k else k_max for r in rows]
    top_k_t = to_device(top_k, torch.int64, dev).unsqueeze(1)  # [N, 1]
    top_p_t = to_device([r.params.top_p for r in rows], logits.dtype, dev).unsqueeze(1)
    values, order = logits.topk(k_max, dim=-1)  # [N, K], sorted descending
    ranks = torch.arange(k_max, device=dev).unsqueeze(0)  # [1, K]
    drop = ranks >= top_k_t
    values = values.masked_fill(drop, NEG_INF)
    probs = torch.softmax(values, dim=-1)
    # Drop a token when the tokens ranked above it already hold top_p of the mass.
    drop |= (probs.cumsum(dim=-1) - probs) > top_p_t
    kept = values.masked_fill(drop, NEG_INF)
    return torch.full_like(logits, NEG_INF).scatter_(1, order, kept)
