"""The hybrid role controller: layouts, the move per binding SLO, hold, revert and cooldown."""

from __future__ import annotations

import pytest
from bucketserve.scheduling.roles import RoleController


def feed(c: RoleController, now: float, ttft: float, tpot: float, n: int = 100):
    """One window of outcomes at the given attainments, then the tick at `now`."""
    for i in range(n):
        c.record_first_token(i < ttft * n)
        c.record_finish(i < tpot * n)
    return c.tick(now)


def test_layouts_run_from_all_mixed_to_splits():
    c = RoleController(4)
    assert c.budgets(0) == (512, 512, 512, 512)
    assert c.budgets(1) == (2048, 0, 0, 0)
    assert c.budgets(3) == (2048, 2048, 2048, 0)
    assert c.num_layouts == 4


def test_a_period_passes_before_any_move_and_small_windows_carry_over():
    c = RoleController(2)
    assert c.tick(0.0) is None  # starts the clock
    assert feed(c, 5.0, 1.0, 0.5) is None  # within the period
    c2 = RoleController(2, min_samples=50)
    c2.tick(0.0)
    assert feed(c2, 10.0, 1.0, 0.0, n=10) is None  # 20 outcomes < 50: kept for the next
    assert feed(c2, 20.0, 1.0, 0.0, n=20) == (2048, 0)


def test_tpot_binding_splits_and_ttft_binding_returns_to_mixed():
    c = RoleController(2, hold=1)
    c.tick(0.0)
    assert feed(c, 10.0, 0.99, 0.7) == (2048, 0)  # decodes suffer interference
    assert feed(c, 20.0, 0.99, 0.98) is None  # held, judged: better, kept
    assert feed(c, 30.0, 0.6, 0.99) == (512, 512)  # too little prefill in the split
    assert c.changes == 2


def test_both_slos_held_means_no_move():
    c = RoleController(4)
    c.tick(0.0)
    assert all(feed(c, 10.0 * i, 0.97, 0.96) is None for i in range(1, 10))
    assert c.layout == 0


def test_a_move_that_hurts_is_reverted_and_barred():
    c = RoleController(4, hold=2, cooldown=3)
    c.tick(0.0)
    assert feed(c, 10.0, 0.99, 0.8) == (2048, 2048, 0, 0)
    assert feed(c, 20.0, 0.5, 0.99) is None  # held
    assert feed(c, 30.0, 0.5, 0.99) == (512,) * 4  # worse (0.5 < 0.8 - 0.05): undone
    # barred for 3 periods although TPOT binds again
    assert [feed(c, t, 0.99, 0.8) for t in (40.0, 50.0)] == [None, None]
    assert feed(c, 60.0, 0.99, 0.8) == (2048, 2048, 0, 0)


def test_split_ratio_moves_one_step_at_a_time():
    c = RoleController(4, hold=1)
    c.tick(0.0)
    feed(c, 10.0, 0.99, 0.7)  # -> 2 heavy
    feed(c, 20.0, 0.99, 0.75)  # judged, kept
    assert feed(c, 30.0, 0.99, 0.8) == (2048, 0, 0, 0)  # TPOT still binds: more decode
    feed(c, 40.0, 0.99, 0.9)
    assert feed(c, 50.0, 0.8, 0.99) == (2048, 2048, 0, 0)  # TTFT binds: more prefill


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="num_instances"):
        RoleController(0)
    with pytest.raises(ValueError, match="mixed_budget"):
        RoleController(2, mixed_budget=2048)
    with pytest.raises(ValueError, match="target"):
        RoleController(2, target=0.0)


def test_the_migration_rule_counts_the_next_step():
    from bucketserve.scheduling.roles import SLACK, out_of_slack

    # 10 tokens in 0.5 s, SLO 0.1 s: a 0.3 s step next makes 0.08 s/token (< 0.09): stays
    assert not out_of_slack(0.5, 0.3, 10, 0.1)
    # a 0.5 s step (a prefill-heavy iteration) makes 0.1 > SLACK x 0.1: leaves
    assert out_of_slack(0.5, 0.5, 10, 0.1)
    assert out_of_slack(0.0, 0.1, 1, 0.1) == (0.1 > SLACK * 0.1)
    assert not out_of_slack(5.0, 5.0, 0, 0.1)  # no token out yet: nothing to judge


def test_fixed_layouts_match_the_controllers():
    from bucketserve.scheduling.roles import fixed_budgets

    c = RoleController(3, mixed_budget=32, heavy_budget=2048)
    for k in range(3):
        assert fixed_budgets(3, k, 32, 2048) == c.budgets(k)
