"""The decode engine loop: pull KV from prefill pools, continuous batching, text deltas out."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from bucketserve.kv.handoff import HandoffTable
from bucketserve.kv.transport import PoolHandle, copy_blocks, open_pool
from bucketserve.serving.detok import TextStream, logprob_entry
from bucketserve.serving.engine_glue import logprob_list, new_sequence, publish_stats
from bucketserve.serving.handoff import Handoff

IDLE_WAIT_S = 0.01

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Delta:
    """Text produced for one request since the last delta; `finish_reason` set on the last."""

    key: int
    text: str
    num_output_tokens: int
    finish_reason: str = ""
    error: str = ""
    first_token_s: float = 0.0  # wall time of the first token (set on the first delta)
    admitted_s: float = 0.0  # wall time the KV was pulled
    logprobs: list[dict] = field(default_factory=list)  # per token, when the request asked


@dataclass(slots=True)
class Stream:
    """Decode-side state of one request."""

    key: int
    handoff: Handoff
    seq: object = None
    text: TextStream | None = None
    num_output: int = 0
    queued_s: float = field(default_factory=time.monotonic)
    logprobs: list[dict] = field(default_factory=list)  # not yet sent

    def take_logprobs(self) -> list[dict]:
        out, self.logprobs = self.logprobs, []
        return out


class DecodeWorker:
    """Owns the decode runner and its blocks; `submit`/`cancel` are the only entry points."""

    def __init__(
        self, runner, blocks, tokenizer, stats, outbox: queue.Queue, timeout_s: float
    ) -> None:
        self.runner, self.blocks, self.stats, self.outbox = runner, blocks, stats, outbox
        self.tokenizer = tokenizer
        self.eos = set(runner.model_config.eos_token_ids)
        self.timeout_s = timeout_s
        self.inbox: queue.Queue = queue.Queue()
        self.cancelled: set[int] = set()
        self.cancel_lock = threading.Lock()
        self.waiting: deque[Stream] = deque()
        self.running: list[Stream] = []
        self.pools: dict[str, object] = {}
        self.tables: dict[str, HandoffTable] = {}
        self.stopping = False

    def submit(self, key: int, handoff: Handoff) -> None:
        self.inbox.put(Stream(key, handoff))

    def cancel(self, key: int) -> None:
        with self.cancel_lock:
            self.cancelled.add(key)
        self.inbox.put(None)  # wake the loop

    def shutdown(self) -> None:
        self.stopping = True
        self.inbox.put(None)

    def loop(self) -> None:
        while not self.stopping:
            try:
                self.iterate()
            except Exception as e:  # a bug outside step/pull: fail what is in flight, go on
                log.exception("decode loop")
                for s in list(self.waiting) + self.running:
                    self.finish(s, "error", error=f"decode engine error: {_describe(e)}")
                self.waiting.clear()
        for s in list(self.waiting) + self.running:
            self.finish(s, "cancelled", error="server shutting down")

    def iterate(self) -> None:
        """One round: take new requests and cancellations, admit, one decode step, stats."""
        self.drain_inbox(block=not self.running and not self.waiting)
        self.apply_cancellations()
        self.admit()
        if self.running:
            self.step()
        self.publish()

    def drain_inbox(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=IDLE_WAIT_S) if block else self.inbox.get_nowait()
            while True:
                if item is not None:
                    self.waiting.append(item)
                item = self.inbox.get_nowait()
        except queue.Empty:
            pass

    def apply_cancellations(self) -> None:
        with self.cancel_lock:
            if not self.cancelled:
                return
            keys, self.cancelled = self.cancelled, set()
        for s in [s for s in self.waiting if s.key in keys]:
            self.waiting.remove(s)
            self.ack(s.handoff)  # the prefill blocks go back without being copied
            self.finish(s, "cancelled")
        for s in [s for s in self.running if s.key in keys]:
            self.running.remove(s)
            self.finish(s, "cancelled")

    def admit(self) -> None:
        """Move waiting requests in FIFO order into the running batch while their blocks fit."""
        while self.waiting:
            s = self.waiting[0]
            p = s.handoff.params
            need = self.blocks.blocks_needed(p.num_input_tokens + p.max_tokens)
            if not self.blocks.can_allocate(need):
                if time.monotonic() - s.queued_s > self.timeout_s / 2:
                    self.waiting.popleft()
                    self.ack(s.handoff)
                    self.finish(
                        s,
                        "error",
                        error="decode KV cache exhausted: request waited too long for blocks",
                    )
                    continue
                return
            self.waiting.popleft()
            try:
                self.pull(s)
            except Exception as e:  # this request fails; the instance keeps serving the others
                # Its prefill blocks stay un-acked: the prefill instance reclaims them on timeout.
                self.finish(s, "error", error=f"decode could not pull the KV: {_describe(e)}")

    def pull(self, s: Stream) -> None:
        h = s.handoff
        s.seq = new_sequence(h.prompt_ids, h.params.sampling)
        self.blocks.allocate_for(s.seq, h.params.num_input_tokens + h.params.max_tokens)
        src = self.pool(h.pool)
        n_src = len(h.block_ids)
        copy_blocks(src, h.block_ids, self.runner.pool, s.seq.block_table[:n_src])
        if not self.ack(h):
            self.finish(
                s, "error", error="KV hand-off expired before decode pulled it; retry the request"
            )
            return
        s.text = TextStream(self.tokenizer, h.params.stop_words)
        admitted = time.time()
        self.running.append(s)
        self.emit(s, h.first_token, h.first_logprob, first_token_s=admitted, admitted_s=admitted)

    def pool(self, handle_json: str):
        if handle_json not in self.pools:
            self.pools[handle_json] = open_pool(
                PoolHandle.from_json(handle_json), self.runner.device
            )
        return self.pools[handle_json]

    def ack(self, h: Handoff) -> bool:
        if h.handoff_table not in self.tables:
            self.tables[h.handoff_table] = HandoffTable.open(h.handoff_table)
        return self.tables[h.handoff_table].ack(h.handoff_id)

    def step(self) -> None:
        seqs = [s.seq for s in self.running]
        try:
            out = self.runner.decode_sampled(seqs)
        except Exception as e:  # fail this batch with a FINAL error each, keep serving
            for s in list(self.running):
                self.finish(s, "error", error=f"decode step failed: {_describe(e)}")
            return
        for s, tok, lp in zip(list(self.running), out.tokens, out.logprobs, strict=True):
            self.emit(s, tok, logprob_list(lp))

    def emit(
        self, s: Stream, token: int, logprob=None, first_token_s: float = 0.0, admitted_s=0.0
    ) -> None:
        """Append one sampled token, send its text, and finish the request when it is done."""
        s.seq.append_token(token)
        s.num_output += 1
        p = s.handoff.params
        if logprob is not None:
            s.logprobs.append(logprob_entry(self.tokenizer, token, logprob))
        if p.sampling.is_stop_token(token, self.eos):  # masked until min_tokens is reached
            return self.finish(s, "stop", first_token_s=first_token_s, admitted_s=admitted_s)
        text, stopped = s.text.push(token)
        if stopped:
            return self.finish(s, "stop", text, first_token_s=first_token_s, admitted_s=admitted_s)
        if s.num_output >= p.max_tokens:
            return self.finish(
                s, "length", text, first_token_s=first_token_s, admitted_s=admitted_s
            )
        self.outbox.put(
            Delta(
                s.key,
                text,
                s.num_output,
                first_token_s=first_token_s,
                admitted_s=admitted_s,
                logprobs=s.take_logprobs(),
            )
        )

    def finish(self, s: Stream, reason: str, text: str = "", error: str = "", **times) -> None:
        if s in self.running:
            self.running.remove(s)
        if s.seq is not None:
            self.blocks.release(s.seq)
        tail = s.text.flush() if s.text is not None and reason != "cancelled" else ""
        self.outbox.put(
            Delta(
                s.key, text + tail, s.num_output, reason, error, logprobs=s.take_logprobs(), **times
            )
        )

    def publish(self) -> None:
        publish_stats(self.stats, self.runner, self.blocks, len(self.running), len(self.waiting), 0)


def _describe(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"
