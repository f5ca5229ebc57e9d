"""make test's layout (tests/conftest.py): parity and server tests in one unit of work."""

from __future__ import annotations

from tests.conftest import work_unit


def test_parity_and_server_tests_share_one_unit_and_unit_tests_go_by_module():
    serial = {work_unit("tests/parity/test_chunked_parity.py::test_x[cpu_paged-16]"),
              work_unit("tests/server/test_faults.py::test_y"),
              work_unit("tests/server/test_hybrid.py::TestA::test_z[bucketserve@x]")}  # fmt: skip
    assert serial == {"serial"}
    assert (
        work_unit("tests/unit/engine/test_runner.py::test_a[1]")
        == "tests/unit/engine/test_runner.py"
    )
    assert work_unit("tests/unit/test_wheel.py::test_b") == "tests/unit/test_wheel.py"
