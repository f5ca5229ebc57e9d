"""A hybrid instance's side of decode migration (Triton-free; used by the decode worker).

In the hybrid topology every engine instance runs with the prompt-token budget the
scheduler's RoleController gives it (scheduling/roles.py, read through `RolesReader`): mixed,
prefill-heavy, or 0 (decode-only). A decode on an instance with a budget moves to a
decode-only peer once it runs out of TPOT slack (`roles.out_of_slack`, the rule the
simulator's hybrid runs): its blocks are published in this instance's ack table, exactly as
a prefill instance publishes a prompt's, and the peer copies them (`KvIntake`) and acks.
This class keeps what that needs: the budgets, the peers' stats blocks, the ack table, and
the step times the slack rule predicts the next step from.
"""

from __future__ import annotations

import time

from bucketserve.kv.handoff import HandoffTable
from bucketserve.kv.names import shm_name
from bucketserve.kv.stats import StatsBlock
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.core.roles_file import RolesReader

EMA = 0.3  # weight of the newest step in the step-time averages


class Migration:
    """One hybrid instance's budgets, peers and outgoing hand-offs."""

    def __init__(self, cfg: ServeConfig, index: int, num_blocks: int, create_table: bool = True) -> None:  # fmt: skip
        self.cfg, self.index = cfg, index
        self.roles = RolesReader(cfg)
        name = shm_name(cfg.run_id, "decode", index, "ho")
        self.table = HandoffTable.create(name, num_blocks, cfg.handoff_timeout_s) if create_table else None  # fmt: skip
        self.peers: dict[int, StatsBlock] = {}
        self.sent: dict[int, int] = {}  # peer -> decodes moved there since its last stats read
        self.step_s = {False: 0.0, True: 0.0}  # EMA of step time: without / with prompt tokens
        self.num_out = self.num_in = 0

    @property
    def budget(self) -> int:
        return self.roles.budgets()[self.index]

    def targets(self) -> list[int]:
        """Decode-only peers (budget 0): where this instance's decodes may move."""
        budgets = self.roles.budgets()
        if not budgets[self.index]:
            return []
        return [j for j, b in enumerate(budgets) if b == 0 and j != self.index]

    def observe_step(self, seconds: float, prompt_tokens: int) -> None:
        key = prompt_tokens > 0
        old = self.step_s[key]
        self.step_s[key] = seconds if not old else (1 - EMA) * old + EMA * seconds

    def next_step_s(self, prompt_work: bool) -> float:
        """Predicted time of this instance's next iteration: a step carrying prompt tokens
        while any are queued here, a decode-only step otherwise."""
        with_prompt, plain = self.step_s[True], self.step_s[False]
        return (with_prompt or plain) if prompt_work else plain

    def pick(self, targets: list[int]) -> int:
        """The decode-only peer with the fewest sequences (its stats plus what we sent since)."""
        return min(targets, key=lambda j: (self.load(j), j))

    def load(self, j: int) -> int:
        try:
            if j not in self.peers:
                self.peers[j] = StatsBlock.open(shm_name(self.cfg.run_id, "decode", j, "st"))
            s = self.peers[j].read()
            return s.running + s.waiting + self.sent.get(j, 0)
        except (OSError, ValueError, RuntimeError):  # not up (yet), or died mid-write: last
            return 1 << 30

    def moved(self, j: int) -> None:
        self.sent[j] = self.sent.get(j, 0) + 1
        self.num_out += 1

    def publish(self, block_ids: list[int]) -> int:
        """The hand-off id of a moving decode's blocks (all but its last may be shared: a
        cached prefix can be pending in several hand-offs); ValueError if it cannot go."""
        return self.table.publish(block_ids, time.monotonic(), num_shared=len(block_ids) - 1)

    def new_round(self) -> None:
        self.sent.clear()  # the peers' stats have caught up since the last round

    def reclaim(self) -> list[int]:
        """Blocks of moved decodes the peers acked (or never pulled): the caller frees them."""
        return self.table.reclaim(time.monotonic()) if self.table is not None else []

    @property
    def num_pending(self) -> int:
        return self.table.num_pending if self.table is not None else 0

    def close(self) -> None:
        for p in self.peers.values():
            p.close()
        if self.table is not None:
            self.table.close()
            self.table.unlink()
