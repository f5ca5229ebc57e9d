"""The short soak: perf/reliability/soak.py for one minute at 2x measured capacity with 10 % cancellations."""

from __future__ import annotations

import pytest
from bucketserve.bench import soak

pytestmark = [pytest.mark.server, pytest.mark.soak, pytest.mark.timeout(1200)]


def test_short_soak_no_hung_no_lost_no_leak(tmp_path):
    args = ["--duration", "60", "--capacity-s", "20", "--deadline-s", "120", "--max-queued", "8"]
    report = soak.run(args)
    print(f"\nshort soak: {report['outcomes']} errors {report['errors_by_cause']}"
          f" capacity {report['capacity_rps']:.2f} req/s, rate {report['rate_rps']:.2f} req/s")  # fmt: skip
    assert report["sent"] > 0 and report["outcomes"].get("finished", 0) > 0
    assert report["outcomes"].get("hung", 0) == 0
    assert report["outcomes"].get("lost", 0) == 0
    assert not [c for c in report["errors_by_cause"] if c.startswith(("other", "transport"))]
    # no process died under load: a stub death turns in-flight requests into these errors
    assert "server restarting" not in report["errors_by_cause"], report["errors_by_cause"]
    assert report["kv_leaked_blocks"] == 0, report["kv_blocks"]
    assert report["left_processes"] == [] and report["left_shm"] == []
