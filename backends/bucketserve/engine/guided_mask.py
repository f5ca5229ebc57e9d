"""Structured output, part 2: the token bitmask of each guided row, applied to the logits.

A row's matcher state is a function of its guide and the tokens it generated so far, and is
rebuilt from exactly those: a sequence prefilled in one instance and decoded in another (or
preempted and recomputed) carries its guide in SamplingParams and its tokens in token_ids,
and the decode side replays them into a fresh matcher. The table below only saves the replay:
it is keyed by the row's token list (the runner passes each Sequence's own list, so the key is
stable for the sequence's life; the entry holds the list, so its id is never reused while
cached) and checked against the row before use.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

import torch

from bucketserve.engine.guided import GrammarCache

MATCHER_CACHE_SIZE = 1024  # rows' matchers kept between steps (LRU); a dropped one is replayed
# A matcher unused for this many sampler calls is dropped (with the token list it holds): a
# prefill instance samples each sequence once, a decode one every step while it runs.
STALE_CALLS = 16
MATCHER_THREADS = 1  # bitmask fills: engine instances share the CPU cores

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class _RowMatcher:
    token_ids: list[int]  # the row's own list (holding it keeps id(token_ids) unique)
    guide_key: tuple[str, str]
    num_prompt: int  # where the completion starts in token_ids
    matcher: object  # xgrammar.GrammarMatcher
    num_accepted: int = 0
    is_broken: bool = False  # a generated token the grammar rejects: no longer masked
    last_call: int = 0

    def fits(self, row) -> bool:
        return (self.token_ids is row.token_ids and self.guide_key == row.params.guide_key
                and self.num_prompt == len(row.token_ids) - row.num_generated
                and self.num_accepted <= row.num_generated)  # fmt: skip


class GuidedMasks:
    """Masks each guided row's logits to the tokens its grammar allows next."""

    def __init__(self, grammars: GrammarCache, size: int = MATCHER_CACHE_SIZE) -> None:
        self.grammars, self.size = grammars, size
        self._rows: OrderedDict[int, _RowMatcher] = OrderedDict()
        self._batch = None  # xgrammar.BatchGrammarMatcher
        self._bitmask: torch.Tensor | None = None  # [B, ceil(V / 32)] int32, reused
        self.num_replayed = 0  # tokens accepted into fresh matchers (hand-offs, evictions)
        self.num_calls = 0

    def prefetch(self, params) -> None:
        """Start compiling a guide before the forward pass whose logits it will mask."""
        if params.is_guided:
            self.grammars.prefetch(params)

    def apply(self, logits: torch.Tensor, rows) -> torch.Tensor:
        """logits: [B, V] -> a masked copy when some row is guided (else `logits` itself)."""
        import xgrammar as xgr

        self.num_calls += 1
        self._drop_stale()
        idx, matchers = [], []
        for i, row in enumerate(rows):
            if row.params.is_guided:
                m = self._sync(row)
                if not m.is_broken and not m.matcher.is_terminated():
                    idx.append(i)
                    matchers.append(m.matcher)
        if not idx:
            return logits
        bitmask = self._bitmask_for(len(rows))
        if self._batch is None:
            self._batch = xgr.BatchGrammarMatcher(MATCHER_THREADS)
        self._batch.batch_fill_next_token_bitmask(matchers, bitmask, idx)
        logits = logits.clone()  # the caller keeps the model's logits for log-probs
        mask = (
            bitmask if logits.device.type == "cpu" else bitmask.to(logits.device, non_blocking=True)
        )
        xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=logits.shape[1], indices=idx)
        return logits

    def _drop_stale(self) -> None:
        while self._rows:
            m = next(iter(self._rows.values()))  # least recently used first
            if m.last_call >= self.num_calls - STALE_CALLS:
                return
            self._rows.popitem(last=False)

    def _bitmask_for(self, batch: int) -> torch.Tensor:
        import xgrammar as xgr

        if self._bitmask is None or self._bitmask.shape[0] < batch:
            self._bitmask = xgr.allocate_token_bitmask(max(batch, 16), self.grammars.vocab_size)
        return self._bitmask[:batch]

    def _sync(self, row) -> _RowMatcher:
        """This row's matcher, advanced over the tokens generated since the last step."""
        if row.num_generated > len(row.token_ids):
            raise ValueError(
                f"a guided row needs its token_ids (prompt + {row.num_generated} generated), "
                f"got {len(row.token_ids)} tokens"
            )
        key = id(row.token_ids)
        m = self._rows.get(key)
        if m is None or not m.fits(row):
            m = self._fresh(row)
            self._rows[key] = m
            while len(self._rows) > self.size:
                self._rows.popitem(last=False)
        self._rows.move_to_end(key)
        m.last_call = self.num_calls
        new = row.token_ids[m.num_prompt + m.num_accepted :]
        if m.num_accepted == 0:
            self.num_replayed += len(new)
        for token in new:
            if m.is_broken or not m.matcher.accept_token(token):
                self._break(m, row, token)
                break
            m.num_accepted += 1
        return m

    def _fresh(self, row) -> _RowMatcher:
        import xgrammar as xgr

        p = row.params
        stops = list(p.stop_token_ids) + ([] if p.ignore_eos else list(row.eos_token_ids))
        matcher = xgr.GrammarMatcher(self.grammars.get(p), override_stop_tokens=stops or None)
        num_prompt = len(row.token_ids) - row.num_generated
        return _RowMatcher(row.token_ids, p.guide_key, num_prompt, matcher)

    def _break(self, m: _RowMatcher, row, token: int) -> None:
        if not m.is_broken:  # an invariant broke (a token sampled without this mask): say so once
            log.warning("guided row: token %d after %d accepted is outside its grammar; the "
                        "row is no longer masked", token, m.num_accepted)  # fmt: skip
        m.is_broken = True
