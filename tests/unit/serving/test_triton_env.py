"""The environment tritonserver (and through it every stub) starts with."""

from pathlib import Path

from bucketserve.serving.launch.triton_env import GLIBC_MALLOC, TritonInstall, server_env

INSTALL = TritonInstall(Path("/x/bin/tritonserver"), Path("/x/backends/python"), None,
                        (Path("/x/lib"),))  # fmt: skip


def test_glibc_malloc_is_told_not_to_hoard(monkeypatch):
    for name in (*GLIBC_MALLOC, "MALLOC_MMAP_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    env = server_env(INSTALL, {"BUCKETSERVE_RUN_CONFIG": "/r.json"})
    assert env["MALLOC_ARENA_MAX"] == "2"
    assert "MALLOC_MMAP_THRESHOLD_" not in env  # adaptive: a fixed one slowed decode steps
    assert env["BUCKETSERVE_RUN_CONFIG"] == "/r.json"
    assert env["LD_LIBRARY_PATH"].split(":")[0] == "/x/lib"


def test_the_callers_malloc_settings_win(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    env = server_env(INSTALL)
    assert env["MALLOC_ARENA_MAX"] == "8"
