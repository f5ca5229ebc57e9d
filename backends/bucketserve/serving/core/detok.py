"""Incremental detokenization with stop strings: emit only text that is final."""

from __future__ import annotations

from tokenizers.decoders import DecodeStream


def held_suffix(text: str, stop_words: list[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of some stop word."""
    best = 0
    for word in stop_words:
        for k in range(min(len(word) - 1, len(text)), best, -1):
            if word.startswith(text[-k:]):
                best = k
                break
    return best


class TextStream:
    """Turns one request's token ids into text deltas (spaces and multi-byte characters intact)."""

    def __init__(self, tokenizer, stop_words: list[str]) -> None:
        self.tokenizer = tokenizer  # a `tokenizers.Tokenizer` (fast backend)
        self.decoder = DecodeStream(skip_special_tokens=True)
        self.stop_words = stop_words
        self.text = ""
        self.sent = 0

    def resume(self, token_ids: list[int], sent: int) -> None:
        """Continue a stream another instance started (a moved decode): decode the tokens it
        generated, of which the first `sent` characters were released there."""
        for t in token_ids:
            self.text += self.decoder.step(self.tokenizer, t) or ""
        self.sent = min(sent, len(self.text))

    def push(self, token_id: int) -> tuple[str, bool]:
        """Feed one token; returns (text now safe to send, whether a stop word ended the text)."""
        piece = self.decoder.step(self.tokenizer, token_id)
        if piece:
            self.text += piece
        if self.stop_words:
            cut = self.stop_at()
            if cut is not None:
                self.text = self.text[:cut]
                return self.flush(), True
            safe = len(self.text) - held_suffix(self.text, self.stop_words)
        else:
            safe = len(self.text)
        delta = self.text[self.sent : safe]
        self.sent = max(self.sent, safe)
        return delta, False

    def stop_at(self) -> int | None:
        start = max(0, self.sent - max(len(w) for w in self.stop_words))
        hits = [i for i in (self.text.find(w, start) for w in self.stop_words) if i >= 0]
        return min(hits) if hits else None

    def flush(self) -> str:
        """Everything not yet sent (at the end of the request)."""
        delta = self.text[self.sent :]
        self.sent = len(self.text)
        return delta


def logprob_entry(tokenizer, token_id: int, logprob: list) -> dict:
    """One token's log-probs in the vLLM backend's `logprobs` JSON shape: {token id: {logprob,
    rank, decoded_token}}, the sampled token first, then the top alternatives by rank.
    `logprob` is [logprob of token_id, top ids, top logprobs] as the sampler returns it."""
    value, top_ids, top_lps = logprob
    rank = top_ids.index(token_id) + 1 if token_id in top_ids else None
    entry = {str(token_id): _lp(tokenizer, token_id, value, rank)}
    for r, (tid, lp) in enumerate(zip(top_ids, top_lps, strict=True), start=1):
        entry.setdefault(str(tid), _lp(tokenizer, tid, lp, r))
    return entry


def _lp(tokenizer, token_id: int, logprob: float, rank: int | None) -> dict:
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    return {"logprob": logprob, "rank": rank, "decoded_token": text}
