"""KvIntake: the decode side of the prefill -> decode hand-off (open pools, copy, acknowledge)."""

from __future__ import annotations

from bucketserve.kv.handoff import HandoffTable
from bucketserve.kv.transport import PoolHandle, copy_blocks, open_pool
from bucketserve.serving.handoff import Handoff


class KvIntake:
    """Opens each prefill instance's pool and ack table once, then copies blocks per request."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.pools: dict[str, object] = {}
        self.tables: dict[str, HandoffTable] = {}

    def copy(self, h: Handoff, block_table: list[int]) -> None:
        """Copy the hand-off's prompt blocks into this instance's blocks `block_table`."""
        if h.pool not in self.pools:
            self.pools[h.pool] = open_pool(PoolHandle.from_json(h.pool))
        n_src = len(h.block_ids)
        copy_blocks(self.pools[h.pool], h.block_ids, self.runner.pool, block_table[:n_src])

    def ack(self, h: Handoff) -> bool:
        """Tell the prefill instance its blocks are free; False if they had already expired."""
        if h.handoff_table not in self.tables:
            self.tables[h.handoff_table] = HandoffTable.open(h.handoff_table)
        return self.tables[h.handoff_table].ack(h.handoff_id)
