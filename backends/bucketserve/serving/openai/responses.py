"""OpenAI response objects from Triton chunks: completions, chat, stream chunks, usage, logprobs."""

from __future__ import annotations

import time
import uuid

FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(n_in: int, n_out: int, num_cached: int = 0) -> dict:
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out,
            "prompt_tokens_details": {"cached_tokens": num_cached}}  # fmt: skip


def finish(reason: str) -> str | None:
    return FINISH.get(reason, reason) if reason else None


def _entries(entry: dict, k: int) -> tuple[dict, list[dict]]:
    """(sampled token's record, the k best alternatives by rank) of one vLLM-style entry."""
    items = list(entry.values())
    ranked = sorted((v for v in items if v["rank"] is not None), key=lambda v: v["rank"])
    return items[0], ranked[:k]


def chat_logprobs(entries: list[dict], k: int) -> dict:
    """OpenAI chat `logprobs`: {content: [{token, logprob, bytes, top_logprobs}]}."""
    content = []
    for entry in entries:
        tok, top = _entries(entry, k)
        content.append({**_token(tok), "top_logprobs": [_token(t) for t in top]})
    return {"content": content}


def _token(v: dict) -> dict:
    text = v["decoded_token"]
    return {"token": text, "logprob": v["logprob"], "bytes": list(text.encode("utf-8"))}


def completion_logprobs(entries: list[dict], k: int, offset: int) -> dict:
    """Legacy completions `logprobs`: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, values, tops, offsets = [], [], [], []
    for entry in entries:
        tok, top = _entries(entry, k)
        tokens.append(tok["decoded_token"])
        values.append(tok["logprob"])
        tops.append({t["decoded_token"]: t["logprob"] for t in top})
        offsets.append(offset)
        offset += len(tok["decoded_token"])
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def chat_response(rid: str, model: str, text: str, reason: str, lp, u: dict) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": text},
              "logprobs": lp, "finish_reason": finish(reason)}  # fmt: skip
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": u}  # fmt: skip


def chat_chunk(rid: str, model: str, delta: dict, reason: str = "", lp=None, u=None, **kw) -> dict:
    choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish(reason)}
    out = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
           "model": model, "choices": [choice]}  # fmt: skip
    if kw.get("with_usage"):
        out["usage"] = u
    return out


def completion_response(rid: str, model: str, text: str, reason: str, lp, u: dict) -> dict:
    choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish(reason)}
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": u}  # fmt: skip


def completion_chunk(rid: str, model: str, text: str, reason: str = "", lp=None, u=None, **kw) -> dict:  # fmt: skip
    choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish(reason)}
    out = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
           "choices": [choice]}  # fmt: skip
    if kw.get("with_usage"):
        out["usage"] = u
    return out


def usage_chunk(rid: str, model: str, obj: str, u: dict) -> dict:
    """The last chunk when stream_options.include_usage: no choices, the usage."""
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model,
            "choices": [], "usage": u}  # fmt: skip
