"""ModelRunner: owns the model and the KV pool; runs packed prefill and batched decode steps."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time

import torch

from bucketserve.engine import loader
from bucketserve.engine.attention import (
    AttentionMetadata,
    block_size_for,
    make_backend,
    resolve_backend_name,
)
from bucketserve.engine.config import EngineConfig, dtype_reason, resolve_device, resolve_dtype
from bucketserve.engine.cuda_graphs import DecodeGraphs
from bucketserve.engine.decode_inputs import StaticDecodeInputs
from bucketserve.engine.device import bind_thread, device_context
from bucketserve.engine.fusion import WARM_LOGIT_ROWS, OneDnnLinear, optimize, warm_onednn
from bucketserve.engine.guided import GrammarCache
from bucketserve.engine.kv_pool import allocate_kv_pool, auto_num_blocks
from bucketserve.engine.sampler import SampleOutput, Sampler, SampleRow
from bucketserve.engine.sequence import Chunk, Sequence
from bucketserve.engine.shapes import ModelConfig
from bucketserve.engine.step_stats import StepStats

log = logging.getLogger(__name__)

PAGED_BACKENDS = ("flash_attn", "triton", "cpu_paged")  # decode reads [B, max_blocks] tables


def to_device(data: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a tensor on `device` (CUDA: from pinned memory, without blocking)."""
    is_cuda = device.type == "cuda"
    t = torch.tensor(data, dtype=dtype, pin_memory=is_cuda)
    return t.to(device, non_blocking=True) if is_cuda else t


def tokenizer_dir(model_dir: str | None, model: str) -> str:
    """Directory with the tokenizer of `model` (SmolLM2's for dummy shapes, resolved then)."""
    return model_dir or loader.resolve_model(model)


class ModelRunner:
    """One model instance on one device with one paged KV pool."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        bind_thread(self.device)  # Triton launches and graph capture use the current device
        if config.num_threads and self.device.type == "cpu":
            # Process-wide, on purpose: instances sharing a CPU must not oversubscribe it
            # (OpenMP threads spin-wait; two 2-thread processes on 2 cores run ~5x slower).
            torch.set_num_threads(config.num_threads)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.dtype_reason = dtype_reason(config.dtype, self.device)  # for describe()
        log.info("dtype %s (%s)", str(self.dtype).removeprefix("torch."), self.dtype_reason)
        is_dummy = loader.is_dummy(config.model)
        self._model_dir = None if is_dummy else loader.resolve_model(config.model)
        self.model_config = self._load_model_config()
        self.attention_backend = resolve_backend_name(config.attention, self.device, self.dtype)
        self.block_size = block_size_for(self.attention_backend, config.block_size)
        self._backend = make_backend(self.attention_backend)
        self.model = loader.build_model(
            self.model_config, self._model_dir, self.device,
            self.dtype, self.model_config.max_model_len, config.seed,
        )  # fmt: skip
        # What runs the linears ("onednn" / "torch") and the norms, rope and SwiGLU ("cpp" /
        # "torch"): the eager HF layout unless optimize_weights.
        self.linear_impl, self.elementwise_impl = (
            optimize(self.model, self.device, self.dtype, self._triton_elementwise())
            if config.optimize_weights
            else ("torch", "torch")
        )
        self.warmed = ""  # what ran at start-up, for describe()
        if config.warm_gemms and self.linear_impl == "onednn":
            start = time.perf_counter()
            cap = config.max_num_batched_tokens
            n = warm_onednn(self.model, cap, min(config.max_num_seqs, cap, WARM_LOGIT_ROWS))
            self.warmed = f", {n} GEMM shapes run at start-up ({time.perf_counter() - start:.1f} s)"
        self.num_blocks = config.num_blocks or auto_num_blocks(
            config, self.device, self.block_size, self.model_config, self.attention_backend
        )
        name = config.pool_name or f"bs_engine_{os.getpid()}_{id(self) & 0xFFFF:x}_kv"
        # One block past num_blocks is scratch: padded rows of a captured decode step write
        # and read it; the BlockManager never hands it out.
        self.pool, self.pool_handle = allocate_kv_pool(
            self.model_config, self.num_blocks + 1, self.block_size, self.dtype, self.device, name
        )  # pool: [L, 2, num_blocks + 1, block_size, KVH, hd]
        mc = self.model_config  # structured output compiles against this tokenizer, on demand
        model_dir, model = self._model_dir, config.model  # not `self`: no reference cycle
        grammars = GrammarCache(lambda: tokenizer_dir(model_dir, model), mc.vocab_size,
                                mc.eos_token_ids)  # fmt: skip
        self.sampler = Sampler(self.device, config.seed, grammars)
        self.stats = StepStats()
        self._graphs = self._decode_graphs() if config.static_decode else None

    @property
    def uses_cuda_graphs(self) -> bool:
        """Decode steps replay captured CUDA graphs."""
        return self._graphs is not None and self._graphs.use_graphs

    def _triton_elementwise(self) -> bool:
        """attention='triton' is the whole Triton fast path: the fused element-wise kernels
        too (on CUDA; on CPU only when TRITON_INTERPRET=1 asks for them, as tests do)."""
        return self.attention_backend == "triton" and (
            self.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
        )

    def _decode_graphs(self, pad: bool = False) -> DecodeGraphs | None:
        """The static decode step, for attention backends that read block tables (SDPA plans
        its gathers per step, so it stays dynamic)."""
        if self.attention_backend not in PAGED_BACKENDS:
            return None
        max_blocks = -(-self.model_config.max_model_len // self.block_size)
        inputs = StaticDecodeInputs(self.config.max_num_seqs, max_blocks, self.block_size,
                                    self.num_blocks, self.device,
                                    functools.partial(to_device, device=self.device))  # fmt: skip
        use_graphs = self.device.type == "cuda" and self.config.cuda_graphs
        # The step closes over what it reads, not over `self`: a runner that holds a reference
        # to itself lives on, weights and KV pool with it, until Python's cyclic collector runs
        # (an in-process parity session grew to 12 GB of RSS that way).
        model, pool, backend = self.model, self.pool, self._backend

        def static_forward(padded: int) -> torch.Tensor:
            ids, pos = inputs.ids_positions(padded)
            hidden = model(ids, pos, inputs.metadata(padded), pool, backend)
            return model.compute_logits(hidden)

        return DecodeGraphs(static_forward, inputs, use_graphs, pad=pad)

    def describe(self) -> str:
        """One line for logs: model, device, dtype and which implementation runs each part."""
        return (f"{self.config.model} on {self.device} {str(self.dtype).removeprefix('torch.')} "
                f"({self.dtype_reason}): "
                f"attention {self.attention_backend}, linears {self.linear_impl}"
                f"{self._linear_detail()}, "
                f"norms/rope/SwiGLU {self.elementwise_impl}, decode "
                f"{'CUDA graphs' if self.uses_cuda_graphs else 'eager'}, "
                f"{self.num_blocks} KV blocks of {self.block_size} tokens{self.warmed}"
                f"{self._threads()}")  # fmt: skip

    def _linear_detail(self) -> str:
        """What runs the oneDNN linears' small steps (csrc/small_linear.cpp: bf16 on AVX512-BF16
        CPUs, fp32 and bf16 on AVX2 CPUs without AVX-512) and where their weights are (one
        buffer: engine/weight_arena.py), and in which dtype their GEMMs run when it is not the
        model's (bf16 weights on CPUs without oneDNN bf16 GEMMs)."""
        linears = [m for m in self.model.modules() if isinstance(m, OneDnnLinear)]
        parts = []
        rows = max((m.small_rows for m in linears), default=0)
        if rows:
            plain = [m.plain_weight for m in linears if m.plain_weight is not None]
            buffers = {w.untyped_storage().data_ptr() for w in plain}
            where = ""
            if len(buffers) == 1:  # engine/weight_arena.py placed them
                where = f", its {sum(w.nbytes for w in plain) / 2**20:.0f} MB in one buffer"
            parts.append(f"1-{rows} rows: small_linear{where}")
        gemm = {m.gemm_dtype for m in linears if m.gemm_dtype != m.dtype}
        if gemm:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in gemm))
            parts.append(f"GEMMs in {names} over the {str(self.dtype).removeprefix('torch.')} "
                         "weights")  # fmt: skip
        return f" ({'; '.join(parts)})" if parts else ""

    def _threads(self) -> str:
        """CPU: the intra-op threads this instance runs with (the serving layer splits the
        cores among the CPU instances: P/D gives each half, colocated gives one all)."""
        return f", {torch.get_num_threads()} CPU threads" if self.device.type == "cpu" else ""

    @property
    def tokenizer_dir(self) -> str:
        """Directory with the tokenizer (SmolLM2's for dummy shapes, resolved on first use)."""
        return tokenizer_dir(self._model_dir, self.config.model)

    def _load_model_config(self) -> ModelConfig:
        dtype_name = str(resolve_dtype(self.config.dtype, self.device)).removeprefix("torch.")
        mc = loader.model_config_for(self.config.model, dtype=dtype_name)
        max_len = min(self.config.max_model_len or mc.max_model_len, mc.max_model_len)
        return dataclasses.replace(mc, max_model_len=max_len)

    # ---- public steps -------------------------------------------------------------------

    def prefill(self, seqs: list[Sequence]) -> list[int]:
        """Run all tokens of each sequence; returns the sampled next token per sequence."""
        return self.prefill_sampled(seqs).tokens

    def decode(self, seqs: list[Sequence]) -> list[int]:
        """One step: feed each sequence's newest token; returns the next token per sequence."""
        return self.decode_sampled(seqs).tokens

    @torch.inference_mode()
    def prefill_sampled(self, seqs: list[Sequence]) -> SampleOutput:
        """Like prefill, with the log-probs of rows whose SamplingParams ask for them."""
        if not seqs:
            return SampleOutput([], [])
        return self.step_sampled([], [Chunk(s, 0, s.num_tokens) for s in seqs])

    @torch.inference_mode()
    def decode_sampled(self, seqs: list[Sequence]) -> SampleOutput:
        """Like decode, with the log-probs of rows whose SamplingParams ask for them."""
        if not seqs:
            return SampleOutput([], [])
        start = time.perf_counter()
        with device_context(self.device):
            out = self.sampler(self._decode_logits(seqs), self._sample_rows(seqs))
        self.stats.record(False, len(seqs), len(seqs), time.perf_counter() - start)
        return out

    @torch.inference_mode()
    def step_sampled(self, decodes: list[Sequence], chunks: list[Chunk]) -> SampleOutput:
        """One fused iteration: the newest token of each decode sequence, plus prompt chunks
        that attend to their sequence's KV already in the pool. Samples one token per decode
        and per chunk that reaches its sequence's last token (`Chunk.is_last`), in that order."""
        if not chunks:
            return self.decode_sampled(decodes)
        start = time.perf_counter()
        with device_context(self.device):
            logits, rows = self._step_logits(decodes, chunks)
            out = self.sampler(logits, self._sample_rows(rows))
            # The KV written here may be published to another instance right after: make
            # "written" explicit rather than rely on the sampler happening to sync.
            self._sync()
        seconds, num_chunk = time.perf_counter() - start, sum(c.num_tokens for c in chunks)
        if decodes:
            self.stats.record_mixed(len(decodes), num_chunk, seconds)
        else:
            self.stats.record(True, len(chunks), num_chunk, seconds)
        return out

    @torch.inference_mode()
    def prefill_logits(self, seqs: list[Sequence]) -> torch.Tensor:
        """Like prefill, but returns the last-position logits [B, V] (float32)."""
        with device_context(self.device):
            return self._step_logits([], [Chunk(s, 0, s.num_tokens) for s in seqs])[0]

    @torch.inference_mode()
    def decode_logits(self, seqs: list[Sequence]) -> torch.Tensor:
        """Like decode, but returns the logits [B, V] (float32)."""
        with device_context(self.device):
            return self._decode_logits(seqs)

    def close(self) -> None:
        """Release the KV pool's shared memory / IPC export."""
        from bucketserve.kv.transport import release_pool

        release_pool(self.pool_handle)

    # ---- step inputs --------------------------------------------------------------------

    def _step_logits(self, decodes: list[Sequence], chunks: list[Chunk]):
        """Logits [R, V] of the sampled rows (every decode, then chunks that end their prompt)
        and the sequences they belong to. Rows: decode tokens first, then chunk tokens."""
        ids, positions, slots, context_lens = self._decode_rows(decodes)
        last_rows, rows = list(range(len(decodes))), list(decodes)
        for c in chunks:
            self._check_blocks(c.seq)
            end = c.start + c.num_tokens
            ids.extend(c.seq.token_ids[c.start : end])
            positions.extend(range(c.start, end))
            slots.extend(self._slots(c.seq.block_table, c.start, end))
            if c.is_last:
                last_rows.append(len(ids) - 1)
                rows.append(c.seq)
        meta = self._step_metadata(decodes, chunks, slots, context_lens)
        hidden = self._forward(ids, positions, meta)  # [T, D]
        return self.model.compute_logits(hidden[self._tensor(last_rows, torch.int64)]), rows

    def _decode_rows(self, seqs: list[Sequence]):
        """(token ids, positions, KV slots, context lengths) of one decode token per sequence."""
        bs, ids, positions, slots, context_lens = self.block_size, [], [], [], []
        for seq in seqs:
            n = self._check_blocks(seq)
            ids.append(seq.last_token_id)
            positions.append(n - 1)
            slots.append(seq.block_table[(n - 1) // bs] * bs + (n - 1) % bs)
            context_lens.append(n)
        return ids, positions, slots, context_lens

    def _step_metadata(self, decodes, chunks, slots, context_lens) -> AttentionMetadata:
        seq_lens = [c.num_tokens for c in chunks]
        cu_seqlens = [0]
        for n in seq_lens:
            cu_seqlens.append(cu_seqlens[-1] + n)
        starts = [c.start for c in chunks]
        meta = AttentionMetadata(
            is_prefill=not decodes, slot_mapping=self._tensor(slots, torch.int64),
            seq_lens=seq_lens, max_seqlen=max(seq_lens),
            cu_seqlens=self._tensor(cu_seqlens, torch.int32),
            num_decode_tokens=len(decodes), context_starts=starts,
        )  # fmt: skip
        if meta.has_context:
            need = [-(-(c.start + c.num_tokens) // self.block_size) for c in chunks]
            meta.chunk_block_ids = [self._tensor(c.seq.block_table[:k], torch.int64)
                                    for c, k in zip(chunks, need, strict=True)]  # fmt: skip
        else:
            self._backend.prepare_prefill(meta, self._tensor)
        if decodes:
            tables = [s.block_table for s in decodes]
            self._backend.prepare_decode(meta, tables, context_lens, self.block_size, self._tensor)
        return meta

    def _decode_logits(self, seqs: list[Sequence]) -> torch.Tensor:
        if self._graphs is not None and self._graphs.can_run(len(seqs)):
            for seq in seqs:
                self._check_blocks(seq)
            return self._graphs.run(seqs)
        input_ids, positions, slot_mapping, context_lens = self._decode_rows(seqs)
        meta = AttentionMetadata(
            is_prefill=False, slot_mapping=self._tensor(slot_mapping, torch.int64),
            seq_lens=context_lens, max_seqlen=max(context_lens),
        )  # fmt: skip
        tables = [s.block_table for s in seqs]
        self._backend.prepare_decode(meta, tables, context_lens, self.block_size, self._tensor)
        hidden = self._forward(input_ids, positions, meta)  # [B, D]
        return self.model.compute_logits(hidden)

    def _forward(self, input_ids: list[int], positions: list[int], meta) -> torch.Tensor:
        ids = self._tensor(input_ids, torch.int64)
        pos = self._tensor(positions, torch.int64)
        return self.model(ids, pos, meta, self.pool, self._backend)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _check_blocks(self, seq: Sequence) -> int:
        n = seq.num_tokens
        if n > self.model_config.max_model_len:
            raise ValueError(
                f"sequence {seq.seq_id} has {n} tokens, max_model_len is "
                f"{self.model_config.max_model_len}"
            )
        if len(seq.block_table) * self.block_size < n:
            raise ValueError(
                f"sequence {seq.seq_id} needs blocks for {n} tokens, its block_table covers "
                f"{len(seq.block_table) * self.block_size}; allocate through the BlockManager"
            )
        return n

    def _slots(self, block_table: list[int], start: int, end: int) -> list[int]:
        """Flat cache slots of token positions [start, end) of one sequence."""
        bs, slots, pos = self.block_size, [], start
        while pos < end:
            first = block_table[pos // bs] * bs
            stop = min(end, (pos // bs + 1) * bs)
            slots.extend(range(first + pos % bs, first + pos % bs + stop - pos))
            pos = stop
        return slots

    def _tensor(self, data: list, dtype: torch.dtype) -> torch.Tensor:
        return to_device(data, dtype, self.device)

    def _sample_rows(self, seqs: list[Sequence]) -> list[SampleRow]:
        eos = self.model_config.eos_token_ids
        return [
            SampleRow(s.sampling_params, s.num_completion_tokens, eos, s.token_ids) for s in seqs
        ]
