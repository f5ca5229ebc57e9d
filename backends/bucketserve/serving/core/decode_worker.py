"""The engine loop of a decode (or colocated) instance: the engine Scheduler decides each
iteration, this class moves KV in, runs the runner, and turns tokens into text deltas."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import replace

from bucketserve.engine.scheduler import (
    BatchLimits,
    PreemptionCounters,
    ScheduledStep,
    Scheduler,
    StepResult,
)
from bucketserve.engine.sequence import Sequence, check_stop
from bucketserve.scheduling.memory import capacity_message
from bucketserve.scheduling.roles import out_of_slack
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.core.decode_stream import Delta, Stream
from bucketserve.serving.core.detok import TextStream, logprob_entry
from bucketserve.serving.core.engine_glue import logprob_list, publish_stats
from bucketserve.serving.core.kv_intake import KvIntake
from bucketserve.serving.core.messages import MIGRATED, Handoff
from bucketserve.serving.core.migration import Migration

IDLE_WAIT_S = 0.01

log = logging.getLogger(__name__)


class DecodeWorker(PreemptionCounters):
    """Owns the runner's iterations; `submit`/`cancel` are the only entry points.

    A request arrives either with its KV in a prefill pool (disaggregated: a hand-off, pulled
    when the Scheduler admits it) or as a bare prompt (colocated: prefilled here in chunks of
    the iteration's token budget, fused with the running decodes). Memory, admission order,
    preemption and the stop rule are the engine Scheduler's. A hand-off that waits too long
    for blocks gives its prefill blocks back at once and is recomputed here instead, so no
    request fails because the pool is busy.

    Hybrid (`migration` set): the iteration's token budget is the one the scheduler's role
    controller gives this instance (0: decode-only, which still recomputes in chunks of
    `token_budget`), and a decode that runs out of TPOT slack on an instance with a budget
    moves to a decode-only peer through the KV hand-off (`move`); decodes moved here arrive as
    hand-offs from the peer's pool with what they generated so far.
    """

    def __init__(self, runner, blocks, tokenizer, stats, outbox: queue.Queue, timeout_s: float,
                 max_batch: int = 256, watermark: float = 0.01,
                 token_budget: int = 4096, run: ServeConfig | None = None,
                 migration: Migration | None = None) -> None:  # fmt: skip
        self.runner, self.blocks, self.stats, self.outbox = runner, blocks, stats, outbox
        self.tokenizer, self.timeout_s = tokenizer, timeout_s
        mc = runner.model_config
        limits = BatchLimits(max_batch, token_budget, watermark)
        self.scheduler = Scheduler(blocks, limits, mc.eos_token_ids, mc.max_model_len)
        self.memory = self.scheduler.memory
        self.inbox: queue.Queue = queue.Queue()
        self.cancelled: set[int] = set()
        self.cancel_lock = threading.Lock()
        self.streams: dict[int, Stream] = {}  # key (= seq_id) -> stream, until FINAL
        self.migration, self.recompute_budget, self.budget = migration, token_budget, None
        own = migration.index if migration is not None else -1
        self.intake = KvIntake(runner, run, own)  # run: where the source pools are
        self.num_received = 0  # requests the scheduler sent here (moved decodes not counted)
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
                for s in list(self.streams.values()):
                    self.finish(s, "error", error=f"decode engine error: {_describe(e)}")
        for s in list(self.streams.values()):
            self.finish(s, "cancelled", error="server shutting down")

    def iterate(self) -> None:
        """One round: take new requests and cancellations, schedule, pull KV, one step."""
        self.drain_inbox(block=not self.scheduler.has_work)
        self.apply_cancellations()
        self.detach_stale()
        if self.migration is not None:
            self.hybrid_round()
        step = self.scheduler.schedule()
        for seq in step.admitted:
            s = self.streams[seq.seq_id]
            if s.kv_pending and not self.pull(s):
                step.drop(seq)
        if not step.is_empty:
            self.run(step)
        self.publish()

    def drain_inbox(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=IDLE_WAIT_S) if block else self.inbox.get_nowait()
            while True:
                if item is not None:
                    self.accept(item)
                item = self.inbox.get_nowait()
        except queue.Empty:
            pass

    def accept(self, s: Stream) -> None:
        """A new request: its sequence joins the Scheduler, unless it can never fit."""
        h, p = s.handoff, s.handoff.params
        self.num_received += not h.is_migration
        self.streams[s.key] = s
        s.seq = Sequence(list(h.prompt_ids), p.sampling, seq_id=s.key, cache_salt=p.cache_salt)
        if p.sampling.is_guided:  # its grammar compiles while it waits or prefills
            self.runner.sampler.prefetch([p.sampling])
        s.text = TextStream(self.tokenizer, p.stop_words)
        if h.is_migration:  # a decode moved here: its KV waits in the peer's pool
            s.kv_pending, s.first_sent, s.first_token_s = True, True, h.first_token_s
            for token in h.output_ids:
                s.seq.append_token(token)
            s.seq.num_computed_tokens = s.seq.num_tokens - 1  # the newest token is next
            s.text.resume(h.output_ids, h.text_sent)
            if self.migration is not None:
                self.migration.num_in += 1
        elif h.prefill_index >= 0:  # KV waits in a prefill pool; the first token came with it
            s.kv_pending = True
            s.seq.append_token(h.first_token)
            s.seq.num_computed_tokens = len(h.prompt_ids)
        if not self.memory.fits_ever(p.num_input_tokens + p.max_tokens):
            message = capacity_message(
                p.num_input_tokens, p.max_tokens, self.memory.capacity_tokens
            )
            self.finish(s, "error", error=message, busy=True)
            return
        self.scheduler.add(s.seq)

    def apply_cancellations(self) -> None:
        with self.cancel_lock:
            if not self.cancelled:
                return
            keys, self.cancelled = self.cancelled, set()
        for key in keys:
            if key in self.streams:
                self.finish(self.streams[key], "cancelled")

    def detach_stale(self) -> None:
        """Hand-offs waiting for blocks longer than a third of the hand-off timeout give their
        prefill blocks back and are recomputed here (their first token goes out now)."""
        now = time.monotonic()
        for seq in list(self.scheduler.waiting):
            s = self.streams[seq.seq_id]
            if s.kv_pending and now - s.queued_s > self.timeout_s / 3:
                self.ack(s)
                self.scheduler.recompute(seq)
                if not s.first_sent:  # a moved decode's first token went out long ago
                    self.emit_first(s)

    def pull(self, s: Stream) -> bool:
        """Copy an admitted hand-off's KV into its blocks and send its first token; False if
        the request ended instead (failed copy, expired hand-off, or done at its first token)."""
        try:
            self.intake.copy(s.handoff, s.seq.block_table)
        except Exception as e:  # this request fails; the instance keeps serving the others
            # Its prefill blocks stay un-acked: the prefill instance reclaims them on timeout.
            s.kv_pending = False
            self.finish(s, "error", error=f"decode could not pull the KV: {_describe(e)}")
            return False
        if not self.ack(s):
            self.finish(s, "error", error="KV hand-off expired before decode pulled it; retry the request")  # fmt: skip
            return False
        self.scheduler.register_kv(s.seq)  # the copied prompt KV can serve a recompute here
        if s.handoff.is_migration:
            return True
        self.emit_first(s, admitted_s=time.time())
        return not s.done

    def ack(self, s: Stream) -> bool:
        """Release the hand-off's prefill blocks (once); False if they had expired."""
        if not s.kv_pending:
            return True
        s.kv_pending = False
        return self.intake.ack(s.handoff)

    def run(self, step: ScheduledStep) -> None:
        started = time.perf_counter()
        try:
            out = self.runner.step_sampled(step.decodes, step.chunks)
        except Exception as e:  # fail this iteration's requests with a FINAL error each
            for seq in step.decodes + [c.seq for c in step.chunks]:
                self.finish(self.streams[seq.seq_id], "error", error=f"decode step failed: {_describe(e)}")  # fmt: skip
            return
        if self.migration is not None:
            prompt_tokens = sum(c.num_tokens for c in step.chunks)
            self.migration.observe_step(time.perf_counter() - started, prompt_tokens)
        now = time.time()
        for r, lp in zip(self.scheduler.postprocess(step, out.tokens), out.logprobs, strict=True):
            s = self.streams[r.seq.seq_id]
            first = {} if s.first_sent else {"first_token_s": now}
            if not s.first_sent:
                s.first_sent, s.first_token_s = True, now
            self.emit(s, r, logprob_list(lp), **first)

    def emit_first(self, s: Stream, admitted_s: float = 0.0) -> None:
        """The hand-off's first token (sampled by prefill), through the same stop rule."""
        h = s.handoff
        reason = check_stop(s.seq, self.scheduler.eos_token_ids, self.scheduler.max_model_len)
        s.first_sent, s.first_token_s = True, time.time()
        result = StepResult(s.seq, h.first_token, reason)
        self.emit(s, result, h.first_logprob, first_token_s=time.time(), admitted_s=admitted_s)

    def emit(self, s: Stream, r: StepResult, logprob=None, **times) -> None:
        """Send one sampled token's text; finish the request when the token ended it."""
        if logprob is not None:
            s.logprobs.append(logprob_entry(self.tokenizer, r.token, logprob))
        n = s.seq.num_completion_tokens
        if r.finish_reason == "stop":  # EOS or a stop id: its text is not part of the output
            return self.finish(s, "stop", **times)
        text, stopped = s.text.push(r.token)
        if stopped or r.finish_reason:
            return self.finish(s, "stop" if stopped else r.finish_reason, text, **times)
        self.outbox.put(Delta(s.key, text, n, logprobs=s.take_logprobs(), **times))

    def finish(self, s: Stream, reason: str, text: str = "", error: str = "", busy: bool = False,
               **times) -> None:  # fmt: skip
        if s.done:
            return
        s.done = True
        self.streams.pop(s.key, None)
        if s.kv_pending:
            self.ack(s)  # the prefill blocks go back without being copied
        if s.seq is not None and not s.seq.is_finished:
            self.scheduler.finish(s.seq, reason)
        tail = s.text.flush() if s.text is not None and reason != "cancelled" else ""
        n = s.seq.num_completion_tokens if s.seq is not None and s.first_sent else 0
        self.outbox.put(Delta(s.key, text + tail, n, reason, error, busy=busy,
                              logprobs=s.take_logprobs(), num_cached_tokens=self.cached(s),
                              **times))  # fmt: skip

    # ---- hybrid: budgets and moving decodes ------------------------------------------------
    def hybrid_round(self) -> None:
        """Free what peers acked, take this instance's budget, move decodes out of slack."""
        m = self.migration
        freed = m.reclaim()
        if freed:
            self.blocks.free(freed)
        budget = m.budget
        if budget != self.budget:
            self.budget = budget
            self.scheduler.set_token_budget(budget or self.recompute_budget)
            log.info("%s: prompt-token budget %d", f"decode{m.index}", budget)
        targets = m.targets()
        if targets:
            self.move_out_of_slack(targets)

    def move_out_of_slack(self, targets: list[int]) -> None:
        """Each decode whose mean TPOT one more step here would push past its slack moves to
        the least loaded decode-only peer (the simulator's rule, scheduling/roles.py)."""
        m = self.migration
        m.new_round()
        next_s = m.next_step_s(self.scheduler.has_prompt_work())
        now = time.time()
        for seq in list(self.scheduler.running):
            s = self.streams.get(seq.seq_id)
            if (s is None or seq.num_uncomputed_tokens != 1 or s.kv_pending or not s.first_token_s
                    or not s.handoff.tpot_slo_s or seq.sampling_params.is_guided):  # fmt: skip
                continue  # prefilling, KV not here yet, or a grammar state that stays here
            elapsed = now - s.first_token_s
            if out_of_slack(elapsed, next_s, seq.num_completion_tokens, s.handoff.tpot_slo_s):
                self.move(s, m.pick(targets))

    def move(self, s: Stream, dest: int) -> None:
        """Hand a running decode to instance `dest`: its blocks wait in this instance's ack
        table, its relay gets the hand-off to follow (finish reason MIGRATED)."""
        seq, m = s.seq, self.migration
        try:
            handoff_id = m.publish(seq.block_table)
        except ValueError as e:  # its last block is pending in another hand-off: stays here
            log.info("decode%d: request %s stays: %s", m.index, s.handoff.params.request_id, e)
            return
        n = seq.num_completion_tokens
        h = replace(s.handoff, prefill_index=m.index, source_role="decode", decode_index=dest,
                    handoff_id=handoff_id, block_ids=self.scheduler.detach(seq),
                    output_ids=seq.completion_token_ids, text_sent=s.text.sent,
                    first_token_s=s.first_token_s, num_cached_tokens=self.cached(s),
                    migrations=s.handoff.migrations + 1, first_token=-1, first_logprob=None)  # fmt: skip
        m.moved(dest)
        s.done = True
        self.streams.pop(s.key, None)
        self.outbox.put(Delta(s.key, "", n, MIGRATED, logprobs=s.take_logprobs(), handoff=h))

    @staticmethod
    def cached(s: Stream) -> int:
        """Prompt tokens a prefix cache served: the prefill instance's count for a hand-off
        (it ran the prompt), this instance's for a prompt prefilled here."""
        if s.handoff.prefill_index >= 0:
            return s.handoff.num_cached_tokens
        return s.seq.num_cached_tokens if s.seq is not None else 0

    def publish(self) -> None:
        sched = self.scheduler
        pending = sum(1 for s in self.streams.values() if s.kv_pending)
        publish_stats(self.stats, self.runner, self.blocks, len(sched.running), len(sched.waiting),
                      pending, self.num_received, sched.prompt_backlog())  # fmt: skip


def _describe(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"
