"""KvIntake: the receiving side of a KV hand-off (open pools, copy, acknowledge).

A hand-off names its source instance by role and index, never a segment: each prefill
instance (and, in the hybrid topology, each engine instance, whose decodes may move to a
peer) publishes its pool's handle in the run directory at start (`publish_pool`), and the
receiver opens only the pools and ack tables of the instances the run configured."""

from __future__ import annotations

import os
from pathlib import Path

from bucketserve.kv.handoff import HandoffTable
from bucketserve.kv.names import shm_name
from bucketserve.kv.transport import PoolHandle, copy_blocks, open_pool
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.core.messages import Handoff


def pool_path(cfg: ServeConfig, index: int, role: str = "prefill") -> Path:
    return cfg.run_path / "kv" / f"{role}{index}.json"


def publish_pool(cfg: ServeConfig, index: int, handle: PoolHandle, role: str = "prefill") -> None:
    """Where peers find instance `role``index`'s pool (written whole, then renamed)."""
    path = pool_path(cfg, index, role)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(handle.to_json())
    tmp.replace(path)


class KvIntake:
    """Opens each source instance's pool and ack table once, then copies blocks per request."""

    def __init__(self, runner, cfg: ServeConfig | None, own_index: int = -1) -> None:
        self.runner, self.cfg, self.own_index = runner, cfg, own_index
        self.pools: dict[tuple[str, int], object] = {}
        self.tables: dict[tuple[str, int], HandoffTable] = {}

    def check(self, h: Handoff) -> tuple[str, int]:
        """The source (role, index); ValueError unless the hand-off names a configured
        instance of that role (a peer, for a moved decode) and distinct blocks."""
        if h.source_role == "decode":
            n, ok = len(self.cfg.decode_devices), self.cfg.is_hybrid
            if h.prefill_index == self.own_index:
                raise ValueError(
                    f"a decode cannot move to the instance it left ({h.prefill_index})"
                )
        else:
            n, ok = len(self.cfg.engine_prefill_devices), True
        if not ok or not 0 <= h.prefill_index < n:
            raise ValueError(f"{h.source_role} instance {h.prefill_index} is not one of this run's")
        if len(h.block_ids) != len(set(h.block_ids)):
            raise ValueError("block_ids repeat a block")
        return h.source_role, h.prefill_index

    def pool(self, role: str, index: int):
        if (role, index) not in self.pools:
            handle = PoolHandle.from_json(pool_path(self.cfg, index, role).read_text())
            expected = shm_name(self.cfg.run_id, role, index, "kv")
            if handle.name != expected:  # a file left by another run
                raise RuntimeError(f"{role}{index} has not published its KV pool for this run")
            self.pools[role, index] = open_pool(handle)
        return self.pools[role, index]

    def copy(self, h: Handoff, block_table: list[int]) -> None:
        """Copy the hand-off's blocks into this instance's blocks `block_table`."""
        source = self.check(h)
        n_src = len(h.block_ids)
        copy_blocks(self.pool(*source), h.block_ids, self.runner.pool, block_table[:n_src])

    def ack(self, h: Handoff) -> bool:
        """Tell the source instance its blocks are free; False if they had already expired."""
        source = self.check(h)
        if source not in self.tables:
            self.tables[source] = HandoffTable.open(shm_name(self.cfg.run_id, *source, "ho"))
        return self.tables[source].ack(h.handoff_id)
