"""Prefix caching in the BlockManager and the Scheduler: hashes, reference counts, LRU
eviction, admission over cached blocks, and no leaks (torch-free)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from bucketserve.engine.block_hash import block_hashes, hash_block, root_hash
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.sampling_params import SamplingParams
from bucketserve.engine.scheduler import BatchLimits, Scheduler
from bucketserve.engine.sequence import Sequence, SequenceStatus
from hypothesis import given, settings
from hypothesis import strategies as st

BS = 4
EOS = 0


def cached_bm(num_blocks: int = 16) -> BlockManager:
    return BlockManager(num_blocks, BS, enable_caching=True)


def prefill(bm: BlockManager, seq: Sequence) -> int:
    """Admit `seq` as the Scheduler does without one: cached prefix, new blocks, register."""
    cached = bm.take_cached(seq, bm.find_cached(seq))
    bm.allocate_for(seq)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_blocks(seq, cached, seq.num_tokens)
    return cached


def assert_idle(bm: BlockManager) -> None:
    """Nothing referenced: every block is free (never cached or evictable)."""
    assert bm.num_free_blocks == bm.num_total_blocks
    assert not any(bm._ref)


# ---- hashes ----------------------------------------------------------------------------------
def test_hashes_are_chained_and_cover_full_blocks_only():
    hashes = block_hashes(list(range(10)), BS)
    assert len(hashes) == 2  # the 2 tokens of a third block are not a full block
    assert hashes[0] == hash_block(root_hash(), [0, 1, 2, 3])
    assert hashes[1] == hash_block(hashes[0], [4, 5, 6, 7])
    # the same block after a different prefix has a different hash
    assert block_hashes([9, 9, 9, 9, 4, 5, 6, 7], BS)[1] != hashes[1]


def test_salt_and_namespace_separate_roots():
    roots = {root_hash(), root_hash(cache_salt=""), root_hash(cache_salt="a"),
             root_hash("model-b"), root_hash("model-b", "a")}  # fmt: skip
    assert len(roots) == 5


def test_hashes_are_stable_across_processes():
    code = (
        "from bucketserve.engine.block_hash import block_hashes as b; print(b([1]*8, 4, 'm', 's'))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == str(block_hashes([1] * 8, 4, "m", "s"))


# ---- block manager ---------------------------------------------------------------------------
def test_shared_prefix_hit_refcounts_and_release():
    bm = cached_bm()
    a = Sequence(list(range(10)))
    assert prefill(bm, a) == 0 and bm.num_cached_blocks == 2
    b = Sequence(list(range(8)) + [50, 51, 52])
    assert bm.find_cached(b) == a.block_table[:2]
    assert prefill(bm, b) == 8 and b.block_table[:2] == a.block_table[:2]
    assert bm.num_queried_tokens == 21 and bm.num_hit_tokens == 8
    bm.release(a)
    assert bm.num_free_blocks == 16 - 3  # b still holds the two shared blocks and its own
    bm.release(b)
    assert_idle(bm)
    assert bm.num_evictable_blocks == 2 and bm.num_cached_blocks == 2  # cached after release


def test_full_hit_leaves_the_last_token_to_compute():
    bm = cached_bm()
    a = Sequence(list(range(8)))  # block-aligned: 2 full blocks, both registered
    prefill(bm, a)
    same = Sequence(list(range(8)))
    assert len(bm.find_cached(same)) == 1  # the block holding the last token is recomputed
    longer = Sequence(list(range(9)))  # a prompt that extends a cached one
    assert len(bm.find_cached(longer)) == 2
    assert bm.find_cached(Sequence([0, 1, 2])) == []  # a prefix shorter than one block


def test_salt_isolates_tenants():
    bm = cached_bm()
    prefill(bm, Sequence(list(range(9)), cache_salt="tenant-a"))
    assert bm.find_cached(Sequence(list(range(9)), cache_salt="tenant-b")) == []
    assert bm.find_cached(Sequence(list(range(9)))) == []
    assert len(bm.find_cached(Sequence(list(range(9)), cache_salt="tenant-a"))) == 2


def test_duplicate_content_stays_uncached():
    bm = cached_bm()
    a, b = Sequence(list(range(5))), Sequence(list(range(5)))
    for s in (a, b):  # both computed before either registered (one step)
        bm.allocate_for(s)
    for s in (a, b):
        bm.cache_blocks(s, 0, 5)
    assert bm.num_cached_blocks == 1 and bm.find_cached(Sequence(list(range(6)))) == [
        a.block_table[0]
    ]
    bm.release(b)
    assert bm.num_evictable_blocks == 0  # b's copy went back as a plain free block
    bm.release(a)
    assert bm.num_evictable_blocks == 1


def test_lru_eviction_only_when_needed_and_forgets_the_hash():
    bm = cached_bm(num_blocks=6)
    old, new = Sequence([1] * 4 + [2]), Sequence([3] * 4 + [4])
    for s in (old, new):
        prefill(bm, s)
    bm.release(old)
    bm.release(new)  # freed after `old`: evicted after it
    assert bm.num_evictable_blocks == 2 and bm.num_free_blocks == 6
    bm.allocate(4)  # the 4 never-cached blocks: nothing evicted
    assert bm.num_evictions == 0 and bm.num_cached_blocks == 2
    bm.allocate(1)
    assert bm.num_evictions == 1
    assert bm.find_cached(Sequence([1] * 4 + [2])) == []  # `old` was least recently freed
    assert len(bm.find_cached(Sequence([3] * 4 + [4]))) == 1


def test_taking_an_evictable_block_uses_up_a_free_one():
    bm = cached_bm(num_blocks=4)
    prefill(bm, a := Sequence([7] * 4 + [1]))
    bm.release(a)
    b = Sequence([7] * 4 + [2])
    hits = bm.find_cached(b)
    assert bm.num_unreferenced(hits) == 1
    bm.take_cached(b, hits)
    assert bm.num_free_blocks == 3 and bm.num_evictable_blocks == 0


def test_caching_off_never_hits_or_counts():
    bm = BlockManager(16, BS)
    prefill(bm, a := Sequence(list(range(9))))
    assert bm.find_cached(Sequence(list(range(9)))) == [] and bm.num_cached_blocks == 0
    assert bm.num_queried_tokens == 0
    bm.release(a)
    assert bm.num_evictable_blocks == 0 and bm.num_free_blocks == 16


def test_double_free_of_a_shared_block_rejected():
    bm = cached_bm()
    prefill(bm, a := Sequence(list(range(9))))
    prefill(bm, b := Sequence(list(range(9))))
    shared = a.block_table[0]
    bm.free([shared, shared])  # both references
    with pytest.raises(ValueError, match="already free"):
        bm.free([shared])
    del a.block_table[0], b.block_table[0]
    bm.release(a)
    bm.release(b)
    assert_idle(bm)


# ---- scheduler -------------------------------------------------------------------------------
def fake_token(seq: Sequence) -> int:
    """A deterministic 'model': the next token depends on the sequence so far."""
    return 1 + (sum(seq.token_ids) * 31 + seq.num_tokens) % 97


def drive(sched: Scheduler, seqs: list[Sequence], max_steps: int = 2000) -> list[list[int]]:
    for s in seqs:
        sched.add(s)
    for _ in range(max_steps):
        if not sched.has_work:
            break
        step = sched.schedule()
        assert not step.is_empty
        for c in step.chunks:  # the chunk starts where the cached prefix (or KV) ends
            assert c.start == c.seq.num_computed_tokens and c.num_tokens >= 1
        sched.postprocess(step, [fake_token(s) for s in step.sampled])
    assert not sched.has_work
    return [s.completion_token_ids for s in seqs]


def scheduler(num_blocks: int, caching: bool, budget: int = 64) -> Scheduler:
    bm = BlockManager(num_blocks, BS, enable_caching=caching)
    return Scheduler(bm, BatchLimits(max_num_seqs=8, token_budget=budget), [EOS], 256)


def test_scheduler_prefills_only_the_uncached_suffix():
    sched = scheduler(64, caching=True)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    system = list(range(1, 22))  # 21 tokens: 5 full blocks
    drive(sched, [Sequence(system + [90], params)])
    second = Sequence(system + [91, 92], params)
    sched.add(second)
    step = sched.schedule()
    assert second.num_cached_tokens == 20 and step.chunks[0].start == 20
    assert step.chunks[0].num_tokens == 3


def test_scheduler_outputs_match_caching_off_and_nothing_leaks():
    rng = random.Random(0)
    system = [rng.randrange(1, 99) for _ in range(30)]
    prompts = [system[: rng.randrange(1, 31)] + [rng.randrange(1, 99) for _ in range(3)]
               for _ in range(12)] + [system, system, system[:16], system[:16]]  # fmt: skip
    outs, scheds = [], []
    for caching in (False, True):
        sched = scheduler(24, caching, budget=16)  # a small pool: preemption and eviction
        seqs = [Sequence(list(p), SamplingParams(max_tokens=12, ignore_eos=True)) for p in prompts]
        outs.append(drive(sched, seqs))
        scheds.append(sched)
    assert outs[0] == outs[1]
    assert scheds[1].blocks.num_hit_tokens > 0
    for sched in scheds:
        assert_idle(sched.blocks)


def test_admission_never_fails_for_the_cache():
    """A pool whose every block is cached and evictable admits what an empty pool admits."""
    sched = scheduler(16, caching=True)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    drive(sched, [Sequence([i + 1] * 16 + [5], params) for i in range(3)])
    assert sched.blocks.num_evictable_blocks > 0
    big = Sequence(list(range(1, 60)), params)  # 15 of the 16 blocks
    sched.add(big)
    step = sched.schedule()
    assert step.admitted == [big]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 6), st.integers(1, 8)),
                min_size=1, max_size=10),
       st.integers(8, 40))  # fmt: skip
def test_random_workloads_match_and_never_leak(specs, num_blocks):
    base = list(range(1, 41))
    prompts = [base[:n] + [90 + t] * t for n, t, _ in specs]
    outs = []
    for caching in (False, True):
        sched = scheduler(num_blocks, caching, budget=12)
        seqs = [Sequence(p, SamplingParams(max_tokens=m, ignore_eos=True))
                for p, (_, _, m) in zip(prompts, specs, strict=True)]  # fmt: skip
        fits = [s for s in seqs if s.num_tokens + s.sampling_params.max_tokens <= num_blocks * BS]
        outs.append(drive(sched, fits))
        assert_idle(sched.blocks)
    assert outs[0] == outs[1]


def running_on_a_full_pool(num_shared: int) -> Scheduler:
    """`num_shared` + 1 sequences running over one cached 2-block prefix, each with one block
    of its own, in a pool with no block free; each needs one more block for its next token."""
    seqs = [Sequence(list(range(1, 9)) + [50 + i] * 4, SamplingParams(max_tokens=8))
            for i in range(num_shared + 1)]  # fmt: skip
    sched = scheduler(2 + len(seqs), caching=True)
    for seq in seqs:
        prefill(sched.blocks, seq)
        seq.append_token(7)  # 13 tokens: the 13th needs a fourth block
        sched.add(seq)
        sched.waiting.remove(seq)
        seq.status = SequenceStatus.RUNNING
        sched.running.append(seq)
    assert sched.blocks.num_free_blocks == 0
    return sched


def test_preemption_counts_only_the_blocks_a_release_frees():
    """Preempting a sequence that shares a cached prefix frees only its own blocks: the
    Scheduler preempts until the rest can really grow (counting the shared ones as freed
    ran the pool dry: OutOfBlocksError)."""
    sched = running_on_a_full_pool(num_shared=2)
    step = sched.schedule()
    assert [s.token_ids[-2] for s in step.preempted] == [52, 51]  # the tail first, two of them
    survivor = sched.running[0]
    assert len(survivor.block_table) == 4 and step.decodes == [survivor]
    assert sched.blocks.num_cached_blocks >= 2  # the prefix stays cached for the recomputes
    sched.postprocess(step, [fake_token(s) for s in step.sampled])
    drive(sched, [])  # the preempted ones come back over the cached prefix and finish
    assert_idle(sched.blocks)


def test_prompt_backlog_leaves_out_the_cached_prefix():
    sched = scheduler(64, caching=True)
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    system = list(range(1, 22))  # 5 full blocks once prefilled
    drive(sched, [Sequence(system + [90], params)])
    sched.add(Sequence(system + [91, 92], params))
    sched.add(Sequence([60] * 10, params))
    assert sched.prompt_backlog() == (23 - 20) + 10
    off = scheduler(64, caching=False)
    off.add(Sequence(system + [91, 92], params))
    assert off.prompt_backlog() == 23


def test_has_prompt_work_is_prompt_backlog_above_zero():
    sched = scheduler(64, caching=True)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    assert not sched.has_prompt_work() and sched.prompt_backlog() == 0
    sched.add(Sequence(list(range(1, 30)), params))
    assert sched.has_prompt_work() and sched.prompt_backlog() > 0
    step = sched.schedule()  # the whole prompt fits the budget: decoding afterwards
    sched.postprocess(step, [fake_token(s) for s in step.sampled])
    assert sched.running and not sched.has_prompt_work() and sched.prompt_backlog() == 0
