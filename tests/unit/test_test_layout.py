"""make test's layout (tests/conftest.py): the parity tests one unit of work, the server tests
another, and the unit tests one unit per module."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import work_unit
from tests.server.conftest import session_servers_first


def test_parity_and_server_tests_are_one_unit_each_and_unit_tests_go_by_module():
    assert work_unit("tests/parity/test_chunked_parity.py::test_x[cpu_paged-16]") == "parity"
    assert work_unit("tests/parity/test_logprobs.py::test_y") == "parity"
    assert work_unit("tests/server/test_faults.py::test_y") == "server"
    assert work_unit("tests/server/test_hybrid.py::TestA::test_z[bucketserve@x]") == "server"
    assert (
        work_unit("tests/unit/engine/test_runner.py::test_a[1]")
        == "tests/unit/engine/test_runner.py"
    )
    assert work_unit("tests/unit/test_wheel.py::test_b") == "tests/unit/test_wheel.py"


def test_session_server_modules_run_first_and_each_server_knows_its_last_test():
    def item(nodeid, *fixtures):
        return SimpleNamespace(nodeid=nodeid, fixturenames=["tmp_path", *fixtures])

    items = [
        item("tests/parity/test_p.py::test_a"),
        item("tests/server/test_a.py::test_1"),  # its own server
        item("tests/server/test_b.py::test_1", "colocated"),
        item("tests/server/test_b.py::test_2", "server"),
        item("tests/server/test_c.py::test_1", "server"),
        item("tests/server/test_c.py::test_2"),
        item("tests/server/test_d.py::test_1"),
        item("tests/unit/test_u.py::test_a"),
    ]
    ordered, last_user = session_servers_first(items)
    assert [i.nodeid for i in ordered] == [
        "tests/parity/test_p.py::test_a",
        "tests/server/test_c.py::test_1",  # `server` only
        "tests/server/test_c.py::test_2",
        "tests/server/test_b.py::test_1",  # `colocated`
        "tests/server/test_b.py::test_2",
        "tests/server/test_a.py::test_1",  # their own servers, in file order
        "tests/server/test_d.py::test_1",
        "tests/unit/test_u.py::test_a",
    ]
    assert last_user == {"server": "tests/server/test_b.py::test_2",
                         "colocated": "tests/server/test_b.py::test_1"}  # fmt: skip
    assert session_servers_first(items[:1]) == (items[:1], {})
