"""The static decode step (the buffers a CUDA graph replays against) on CPU: same logits as the
dynamic step, padded rows harmless, block tables updated incrementally."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from bucketserve.engine.block_manager import BlockManager
from bucketserve.engine.config import EngineConfig
from bucketserve.engine.cuda_graphs import capture_sizes
from bucketserve.engine.decode_inputs import StaticDecodeInputs
from bucketserve.engine.runner import ModelRunner

from tests.unit.engine.helpers import prefill_seqs


def _runner(static: bool) -> ModelRunner:
    return ModelRunner(EngineConfig(model="dummy:tiny", device="cpu", num_blocks=64, block_size=4,
                                    static_decode=static, max_num_seqs=8))  # fmt: skip


@pytest.fixture(scope="module")
def runners():
    dynamic, static = _runner(False), _runner(True)
    assert dynamic._graphs is None and static._graphs is not None
    # pad like a captured step would (3 rows run as 4, 5 as 8): the padded rows must not
    # disturb the real ones
    static._graphs = static._decode_graphs(pad=True)
    yield dynamic, static
    dynamic.close()
    static.close()


def test_static_step_matches_dynamic_as_sequences_join_and_leave(runners):
    prompts = [list(range(3, 3 + n)) for n in (1, 6, 13)]
    state = []
    for runner in runners:
        bm = BlockManager(runner.num_blocks, runner.block_size)
        seqs = prefill_seqs(runner, bm, prompts)
        runner.prefill(seqs)
        state.append((bm, seqs))
    for step in range(9):
        if step == 3:  # one leaves, one joins: the static store frees and reuses a row
            for runner, (bm, seqs) in zip(runners, state, strict=True):
                bm.release(seqs.pop(1))
                joined = prefill_seqs(runner, bm, [list(range(40, 50))])
                runner.prefill(joined)
                seqs.extend(joined)
        logits = []
        for runner, (bm, seqs) in zip(runners, state, strict=True):
            for s in seqs:
                s.append_token(7 + step)
                bm.ensure_slot(s)
            logits.append(runner.decode_logits(seqs))
        torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)
    assert runners[1]._graphs.padded_size(3) == 4


def _seq(seq_id, table, n):
    return SimpleNamespace(seq_id=seq_id, block_table=table, num_tokens=n, last_token_id=9)


def test_block_tables_cross_to_the_device_incrementally():
    sent = []

    def to_tensor(data, dtype):
        sent.append(data)
        return torch.tensor(data, dtype=dtype)

    inputs = StaticDecodeInputs(4, 6, 16, 99, torch.device("cpu"), to_tensor)
    a, b = _seq("a", [5, 6], 20), _seq("b", [7], 3)

    def step(seqs, padded):
        sent.clear()
        inputs.update(seqs, padded)
        return [x for x in sent if len(x) and not isinstance(x[0], list)]  # cells/values

    assert step([a, b], 4) == [[0, 1, 6], [5, 6, 7]]  # rows 0, 1 of width 6
    assert inputs.block_tables[:4, :2].tolist() == [[5, 6], [7, 99], [99, 99], [99, 99]]
    assert step([a, b], 2) == []  # nothing new: no block ids sent
    a.block_table.append(8)
    assert step([a, b], 2) == [[2], [8]]  # only the new block
    assert inputs.block_tables[0, :3].tolist() == [5, 6, 8]
    assert inputs.context_lens[:2].tolist() == [20, 3]
    assert inputs.scalars[2, :2].tolist() == [6 * 16 + 3, 7 * 16 + 2]  # slots of the new tokens
    c = _seq("c", [1, 2], 17)
    assert step([b, c], 2) == [[0, 1], [1, 2]]  # a left: c takes its row, written whole
    with pytest.raises(ValueError, match="exceeds max_batch=4"):
        inputs.update([a, b, c], 5)


def test_capture_sizes_cover_every_batch():
    sizes = capture_sizes(100)
    assert sizes[0] == 1 and sizes[-1] == 100 and 96 in sizes
    assert capture_sizes(3) == [1, 2, 3]
