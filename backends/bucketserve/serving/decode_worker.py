"""The decode engine loop: pull KV from prefill pools, continuous batching, text deltas out."""

from __future__ import annotations

import logging
import queue
import threading
import time
from bisect import insort
from collections import deque

from bucketserve.scheduling.memory import DecodeMemory, capacity_message
from bucketserve.serving.decode_stream import Delta, Stream
from bucketserve.serving.detok import TextStream, logprob_entry
from bucketserve.serving.engine_glue import logprob_list, new_sequence, publish_stats
from bucketserve.serving.handoff import Handoff
from bucketserve.serving.kv_intake import KvIntake

IDLE_WAIT_S = 0.01

log = logging.getLogger(__name__)


class DecodeWorker:
    """Owns the decode runner and its blocks; `submit`/`cancel` are the only entry points.

    Memory follows scheduling.memory.DecodeMemory: a request is admitted with the blocks of
    its prompt (plus one slot) and grows as it decodes; when the batch cannot grow, the newest
    requests are preempted (blocks freed) and later recomputed here by a prefill over prompt +
    generated tokens. A hand-off that waits too long for blocks is detached the same way (its
    prefill blocks go back at once), so no request fails because the pool is busy.
    """

    def __init__(
        self,
        runner,
        blocks,
        tokenizer,
        stats,
        outbox: queue.Queue,
        timeout_s: float,
        max_batch: int = 256,
        watermark: float = 0.01,
    ) -> None:
        self.runner, self.blocks, self.stats, self.outbox = runner, blocks, stats, outbox
        self.tokenizer = tokenizer
        self.eos = set(runner.model_config.eos_token_ids)
        self.timeout_s, self.max_batch = timeout_s, max_batch
        self.memory = DecodeMemory(blocks.num_total_blocks, blocks.block_size, watermark)
        self.inbox: queue.Queue = queue.Queue()
        self.cancelled: set[int] = set()
        self.cancel_lock = threading.Lock()
        self.waiting: deque[Stream] = deque()
        self.running: list[Stream] = []  # in arrival order: the tail is preempted first
        self.intake = KvIntake(runner)
        self.num_preemptions = self.num_recomputed_tokens = 0  # read by the metrics thread
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
        self.detach_stale()
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
            if s.seq is None:
                self.ack(s.handoff)  # the prefill blocks go back without being copied
            self.finish(s, "cancelled")
        for s in [s for s in self.running if s.key in keys]:
            self.finish(s, "cancelled")

    def detach_stale(self) -> None:
        """Hand-offs waiting for blocks longer than a third of the hand-off timeout give their
        prefill blocks back and wait as recompute requests (the first token goes out now)."""
        now = time.monotonic()
        for s in [s for s in self.waiting if s.seq is None]:
            if now - s.queued_s > self.timeout_s / 3 and self.fits(s):
                h = s.handoff
                self.ack(h)
                s.seq, s.recompute = new_sequence(h.prompt_ids, h.params.sampling), True
                s.text = TextStream(self.tokenizer, h.params.stop_words)
                self.emit(s, h.first_token, h.first_logprob, first_token_s=time.time())

    def fits(self, s: Stream) -> bool:
        """Whether the request can ever fit this pool; if not it ends with a busy error."""
        p = s.handoff.params
        if self.memory.fits_ever(p.num_input_tokens + p.max_tokens):
            return True
        if s.seq is None:
            self.ack(s.handoff)
        message = capacity_message(p.num_input_tokens, p.max_tokens, self.memory.capacity_tokens)
        self.finish(s, "error", error=message, busy=True)
        return False

    def admit(self) -> None:
        """Admit waiting requests in order while the memory model lets them in."""
        recompute = []
        growth = self.memory.growth(
            [(len(s.seq.block_table), s.seq.num_tokens) for s in self.running]
        )
        while self.waiting and len(self.running) + len(recompute) < self.max_batch:
            s = self.waiting[0]
            if not self.fits(s):
                continue
            stored = s.seq.num_tokens if s.recompute else s.handoff.params.num_input_tokens
            busy = len(self.running) + len(recompute)
            if not self.memory.can_admit(stored, self.blocks.num_free_blocks - growth, busy):
                break
            self.waiting.popleft()
            if s.recompute:
                self.blocks.allocate_for(s.seq, s.seq.num_tokens)
                recompute.append(s)
                continue
            try:
                self.pull(s)
            except Exception as e:  # this request fails; the instance keeps serving the others
                # Its prefill blocks stay un-acked: the prefill instance reclaims them on timeout.
                self.finish(s, "error", error=f"decode could not pull the KV: {_describe(e)}")
        if recompute:
            self.recompute(recompute)

    def pull(self, s: Stream) -> None:
        h = s.handoff
        s.seq = new_sequence(h.prompt_ids, h.params.sampling)
        self.blocks.allocate_for(s.seq, h.params.num_input_tokens)
        self.intake.copy(h, s.seq.block_table)
        if not self.ack(h):
            self.finish(
                s, "error", error="KV hand-off expired before decode pulled it; retry the request"
            )
            return
        s.text = TextStream(self.tokenizer, h.params.stop_words)
        admitted = time.time()
        insort(self.running, s, key=lambda x: x.key)
        self.emit(s, h.first_token, h.first_logprob, first_token_s=admitted, admitted_s=admitted)

    def recompute(self, streams: list[Stream]) -> None:
        """Rebuild the KV of preempted (or detached) requests by one prefill over all their
        tokens; the token it samples is their next token, as a decode step would give."""
        try:
            out = self.runner.prefill_sampled([s.seq for s in streams])
        except Exception as e:
            for s in streams:
                self.finish(s, "error", error=f"decode recompute failed: {_describe(e)}")
            return
        for s, tok, lp in zip(streams, out.tokens, out.logprobs, strict=True):
            s.recompute = False
            self.num_recomputed_tokens += s.seq.num_tokens
            insort(self.running, s, key=lambda x: x.key)
            self.emit(s, tok, logprob_list(lp))

    def ack(self, h: Handoff) -> bool:
        return self.intake.ack(h)

    def grow(self) -> None:
        """Room for every running sequence's next token; preempt from the tail if short."""
        plan = [(len(s.seq.block_table), s.seq.num_tokens) for s in self.running]
        for _ in range(self.memory.preemptions(plan, self.blocks.num_free_blocks)):
            s = self.running.pop()
            self.blocks.release(s.seq)
            s.recompute = True
            self.num_preemptions += 1
            self.waiting.appendleft(s)
        for s in self.running:
            self.blocks.ensure_slot(s.seq)

    def step(self) -> None:
        self.grow()
        seqs = [s.seq for s in self.running]
        try:
            out = self.runner.decode_sampled(seqs) if seqs else None
        except Exception as e:  # fail this batch with a FINAL error each, keep serving
            for s in list(self.running):
                self.finish(s, "error", error=f"decode step failed: {_describe(e)}")
            return
        if out is None:
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
        times = {"first_token_s": first_token_s, "admitted_s": admitted_s}
        if logprob is not None:
            s.logprobs.append(logprob_entry(self.tokenizer, token, logprob))
        if p.sampling.is_stop_token(token, self.eos):  # masked until min_tokens is reached
            return self.finish(s, "stop", **times)
        text, stopped = s.text.push(token)
        if stopped:
            return self.finish(s, "stop", text, **times)
        if s.num_output >= p.max_tokens:
            return self.finish(s, "length", text, **times)
        self.outbox.put(Delta(s.key, text, s.num_output, logprobs=s.take_logprobs(), **times))

    def finish(
        self, s: Stream, reason: str, text: str = "", error: str = "", busy: bool = False, **times
    ) -> None:
        if s.done:
            return
        s.done = True
        if s in self.running:
            self.running.remove(s)
        if s in self.waiting:
            self.waiting.remove(s)
        if s.seq is not None and s.seq.block_table:
            self.blocks.release(s.seq)
        tail = s.text.flush() if s.text is not None and reason != "cancelled" else ""
        lps = s.take_logprobs()
        self.outbox.put(
            Delta(s.key, text + tail, s.num_output, reason, error, busy=busy, logprobs=lps, **times)
        )

    def publish(self) -> None:
        publish_stats(self.stats, self.runner, self.blocks, len(self.running), len(self.waiting), 0)


def _describe(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"
