"""ResponseRelay: the decode side's request table, Triton-free (send functions injected).

It maps the decode worker's text deltas back to each request's response sender: streaming
requests get one response per delta batch, the others one response at the end; the prompt is
echoed when asked; every request ends with exactly one FINAL (text, or error with busy flag).
Stops are keyed by the user's request id; a stop that overtakes its request (still in
prefill) is remembered for EARLY_STOP_TTL_S and applied when the request arrives.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from bucketserve.serving.core.decode_stream import Delta
from bucketserve.serving.core.messages import MIGRATED, Handoff

EARLY_STOP_TTL_S = 60.0

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Client:
    """The Triton side of one request: where its responses go and what it asked for."""

    sender: object
    handoff: Handoff
    buffer: str = ""
    first_token_s: float = 0.0
    echoed: bool = False
    logprobs: list[dict] = field(default_factory=list)  # buffered with `buffer`
    cum_logprob: float = 0.0

    def take_logprobs(self) -> tuple[list[dict], float]:
        out, self.logprobs = self.logprobs, []
        return out, self.cum_logprob


class ResponseRelay:
    """`send(sender, text, reason, n_in, n_out, final, logprobs, num_cached)`,
    `send_error(sender, message, busy)`,
    `on_final(delta, client)` (finish notice, metrics) are injected; hybrid instances also
    `send_moved(sender, handoff)` (the FINAL of this instance's stream, which the caller's
    relay follows to the next instance) and `on_moved(delta, client)`."""

    def __init__(self, worker, send: Callable, send_error: Callable, on_final: Callable,
                 send_moved: Callable | None = None, on_moved: Callable | None = None) -> None:  # fmt: skip
        self.worker, self.send, self.send_error, self.on_final = worker, send, send_error, on_final
        self.send_moved, self.on_moved = send_moved, on_moved
        self.clients: dict[int, Client] = {}
        self.by_request_id: dict[str, int] = {}
        self.early_stops: dict[str, float] = {}  # request id -> when its stop arrived
        self.lock = threading.Lock()
        self.keys = itertools.count()

    def start(self, sender, handoff: Handoff) -> None:
        key = next(self.keys)
        rid = handoff.params.request_id
        client = Client(sender, handoff)
        if handoff.is_migration:  # what the previous instance's relay had not sent yet
            client.buffer, client.first_token_s = handoff.carry_text, handoff.first_token_s
            client.echoed, client.logprobs = handoff.echoed, list(handoff.carry_logprobs)
            client.cum_logprob = handoff.carry_cum_logprob
        with self.lock:
            self.clients[key] = client
            if rid:
                self.by_request_id[rid] = key
            stopped_early = self.early_stops.pop(rid, None) is not None if rid else False
        self.worker.submit(key, handoff)
        if stopped_early:
            self.worker.cancel(key)

    def stop(self, request_id: str) -> None:
        """Cancel a running request; a stop that overtakes its request (still in prefill) waits."""
        with self.lock:
            key = self.by_request_id.get(request_id)
            if key is None and request_id:
                now = time.monotonic()
                self.early_stops = {
                    r: t for r, t in self.early_stops.items() if now - t < EARLY_STOP_TTL_S
                }
                self.early_stops[request_id] = now
        if key is not None:
            self.worker.cancel(key)

    def cancel_gone(self) -> None:
        """Cancel requests whose client went away (non-streaming ones too)."""
        with self.lock:
            clients = list(self.clients.items())
        for key, client in clients:
            if client.sender.is_cancelled():
                self.worker.cancel(key)

    def deliver(self, deltas: list[Delta]) -> bool:
        """Send what each request produced; True when some request finished. A send that fails
        ends that request (an error FINAL if one can still go out) and no other."""
        finished = False
        for d in deltas:
            with self.lock:
                client = self.clients.get(d.key)
            if client is None:
                continue
            try:
                finished |= self.deliver_one(d, client)
            except Exception as e:
                finished |= self.send_failed(d, client, e)
        return finished

    def deliver_one(self, d: Delta, client: Client) -> bool:
        if d.first_token_s:
            client.first_token_s = d.first_token_s
        p = client.handoff.params
        text = d.text
        if not client.echoed and p.prompt_text:
            text, client.echoed = p.prompt_text + text, True
        client.logprobs += d.logprobs
        client.cum_logprob += sum(next(iter(e.values()))["logprob"] for e in d.logprobs)
        if not d.finish_reason and not p.stream:
            client.buffer += text
            return False
        text, client.buffer = client.buffer + text, ""
        if d.finish_reason == MIGRATED:
            self.hand_on(d, client, text)
            return True
        if d.finish_reason:
            self.complete(d, client, text)
            return True
        self.send(client.sender, text, "", p.num_input_tokens, d.num_output_tokens, False,
                  client.take_logprobs())  # fmt: skip
        if client.sender.is_cancelled():
            self.worker.cancel(d.key)
        return False

    def send_failed(self, d: Delta, client: Client, e: Exception) -> bool:
        """A streamed delta could not be sent: the request ends here (and stops decoding)."""
        with self.lock:
            gone = self.clients.pop(d.key, None) is not None
            if self.by_request_id.get(client.handoff.params.request_id) == d.key:
                del self.by_request_id[client.handoff.params.request_id]
        if not gone:  # complete() had it already
            return False
        self.worker.cancel(d.key)  # its cancelled delta finds no client: nothing more is sent
        self.last_resort(client, e)
        d.error = d.error or f"send failed: {e}"  # not counted as a finished generation
        self.on_final(d, client)
        return True

    def complete(self, d: Delta, client: Client, text: str) -> None:
        p = client.handoff.params
        self.forget(d.key, client)
        try:
            if d.error:
                self.send_error(client.sender, d.error, d.busy)
            else:
                self.send(client.sender, text, d.finish_reason, p.num_input_tokens,
                          d.num_output_tokens, True, client.take_logprobs(),
                          d.num_cached_tokens)  # fmt: skip
        except Exception as e:
            self.last_resort(client, e)
        self.on_final(d, client)  # the scheduler's account is freed whatever the client got

    def hand_on(self, d: Delta, client: Client, text: str) -> None:
        """The request moved to another instance: this stream ends with the hand-off, which
        carries everything not yet sent (text, log-probs) for the next instance's relay."""
        self.forget(d.key, client)
        h = replace(d.handoff, carry_text=text, carry_logprobs=client.logprobs,
                    carry_cum_logprob=client.cum_logprob, echoed=client.echoed,
                    first_token_s=client.first_token_s or d.handoff.first_token_s)  # fmt: skip
        try:
            self.send_moved(client.sender, h)
        except Exception as e:  # the request ends here; its blocks expire in our ack table
            self.last_resort(client, e)
            d.error = f"could not hand the request on: {e}"
            self.on_final(d, client)
            return
        self.on_moved(d, client)

    def forget(self, key: int, client: Client) -> None:
        rid = client.handoff.params.request_id
        with self.lock:
            self.clients.pop(key, None)
            if self.by_request_id.get(rid) == key:
                del self.by_request_id[rid]

    def last_resort(self, client: Client, e: Exception) -> None:
        """A response could not be sent: log it, and try an error FINAL instead."""
        rid = client.handoff.params.request_id or "?"
        log.warning("decode: request %s: send failed: %s: %s", rid, type(e).__name__, e)
        try:
            self.send_error(client.sender, f"decode: could not send a response: {e}", False)
        except Exception as e2:
            log.warning("decode: request %s: no FINAL sent: %s", rid, e2)


def merge(items: list[Delta]) -> list[Delta]:
    """One delta per request: texts concatenated, the latest counts and finish reason kept.

    docs/platform-notes.md#p10-one-sending-stub-caps-tokens-per-second
    """
    merged: dict[int, Delta] = {}
    for d in items:
        prev = merged.get(d.key)
        if prev is None:
            merged[d.key] = d
            continue
        prev.text += d.text
        prev.num_output_tokens = d.num_output_tokens
        prev.finish_reason, prev.error, prev.busy = d.finish_reason, d.error, d.busy
        prev.first_token_s = prev.first_token_s or d.first_token_s
        prev.logprobs += d.logprobs
        prev.num_cached_tokens = d.num_cached_tokens
        prev.handoff = d.handoff
    return list(merged.values())
