"""KvIntake: the decode side of the prefill -> decode hand-off (open pools, copy, acknowledge).

A hand-off names a prefill instance by index, never a segment: each prefill instance publishes
its pool's handle in the run directory at start (`publish_pool`), and decode opens only the
pools and ack tables of the instances the run configured."""

from __future__ import annotations

import os
from pathlib import Path

from bucketserve.kv.handoff import HandoffTable
from bucketserve.kv.names import shm_name
from bucketserve.kv.transport import PoolHandle, copy_blocks, open_pool
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.core.messages import Handoff


def pool_path(cfg: ServeConfig, index: int) -> Path:
    return cfg.run_path / "kv" / f"prefill{index}.json"


def publish_pool(cfg: ServeConfig, index: int, handle: PoolHandle) -> None:
    """Where decode finds prefill instance `index`'s pool (written whole, then renamed)."""
    path = pool_path(cfg, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(handle.to_json())
    tmp.replace(path)


class KvIntake:
    """Opens each prefill instance's pool and ack table once, then copies blocks per request."""

    def __init__(self, runner, cfg: ServeConfig | None) -> None:
        self.runner, self.cfg = runner, cfg
        self.pools: dict[int, object] = {}
        self.tables: dict[int, HandoffTable] = {}

    def check(self, h: Handoff) -> None:
        """ValueError unless the hand-off names a configured prefill instance and its blocks."""
        n = len(self.cfg.prefill_devices)
        if not 0 <= h.prefill_index < n:
            raise ValueError(f"prefill_index {h.prefill_index} is not one of this run's {n}")
        if len(h.block_ids) != len(set(h.block_ids)):
            raise ValueError("block_ids repeat a block")

    def pool(self, index: int):
        if index not in self.pools:
            handle = PoolHandle.from_json(pool_path(self.cfg, index).read_text())
            expected = shm_name(self.cfg.run_id, "prefill", index, "kv")
            if handle.name != expected:  # a file left by another run
                raise RuntimeError(f"prefill{index} has not published its KV pool for this run")
            self.pools[index] = open_pool(handle)
        return self.pools[index]

    def copy(self, h: Handoff, block_table: list[int]) -> None:
        """Copy the hand-off's prompt blocks into this instance's blocks `block_table`."""
        self.check(h)
        n_src = len(h.block_ids)
        copy_blocks(self.pool(h.prefill_index), h.block_ids, self.runner.pool, block_table[:n_src])

    def ack(self, h: Handoff) -> bool:
        """Tell the prefill instance its blocks are free; False if they had already expired."""
        self.check(h)
        if h.prefill_index not in self.tables:
            name = shm_name(self.cfg.run_id, "prefill", h.prefill_index, "ho")
            self.tables[h.prefill_index] = HandoffTable.open(name)
        return self.tables[h.prefill_index].ack(h.handoff_id)
