"""The edge's allow-list (front/allowlist.py): entry models only, admin APIs behind a key,
the API key on every route but health and metrics; and the Triton flags that match it."""

from __future__ import annotations

import pytest
from bucketserve.serving.config import ServeConfig
from bucketserve.serving.front.allowlist import AccessPolicy, grpc_metadata
from bucketserve.serving.launch.launcher import restricted_apis

OPEN = ["/v2", "/v2/health/ready", "/v2/health/live", "/health", "/metrics", "/v1/models",
        "/v1/chat/completions", "/v2/models/bucketserve", "/v2/models/bucketserve/ready",
        "/v2/models/bucketserve/config", "/v2/models/bucketserve_bls/versions/1/generate_stream",
        "/v2/models/ensemble/generate", "/v2/models/tensorrt_llm_bls/infer",
        "/v2/models/bucketserve/stats",
        # read-only views of every model (perf_analyzer reads an ensemble's steps)
        "/v2/models/decode_router/config", "/v2/models/prefill_0/versions/1/stats",
        "/v2/models/stats"]  # fmt: skip
INTERNAL = ["/v2/models/prefill_0/generate", "/v2/models/decode_0/infer", "/v2/models/scheduler",
            "/v2/models/preprocessing/versions/1/infer", "/v2/models/decode_router/generate_stream",
            "/v2/models/decode_1/ready", "/v2/models/bucketserve/load", "/", "/v2/anything"]  # fmt: skip
ADMIN = ["/v2/systemsharedmemory/region/x/register", "/v2/systemsharedmemory/status",
         "/v2/cudasharedmemory/region/x/register", "/v2/repository/index",
         "/v2/repository/models/prefill_0/load", "/v2/repository/models/bucketserve/unload",
         "/v2/trace/setting", "/v2/models/bucketserve/trace/setting", "/v2/logging"]  # fmt: skip


@pytest.mark.parametrize("path", OPEN)
def test_public_paths_are_served(path):
    assert AccessPolicy().check(path, {}) is None


@pytest.mark.parametrize("path", INTERNAL)
def test_internal_models_and_unknown_paths_are_absent(path):
    found = AccessPolicy().check(path, {})
    assert found.status == 404
    assert "prefill" not in found.message or "unknown model: 'prefill_0'" in found.message


@pytest.mark.parametrize("path", ADMIN)
def test_admin_apis_are_403_without_the_admin_key(path):
    assert AccessPolicy().check(path, {}).status == 403
    assert "no --admin-key set" in AccessPolicy().check(path, {}).message
    keyed = AccessPolicy(admin_key="s3cret-admin")
    assert keyed.check(path, {"admin-key": "wrong-key"}).status == 403
    assert keyed.check(path, {"admin-key": "s3cret-admin"}) is None


def test_api_key_needed_everywhere_but_health_and_metrics():
    policy = AccessPolicy(api_key="k3y-for-clients", admin_key="s3cret-admin")
    for path in ("/v2/models/bucketserve/generate", "/v1/completions", "/v1/models", "/v2"):
        assert policy.check(path, {}).status == 401
        assert policy.check(path, {"authorization": "Bearer nope"}).status == 401
        assert policy.check(path, {"authorization": "Bearer k3y-for-clients"}) is None
    for path in ("/health", "/metrics", "/v2/health/ready", "/v2/health/live"):
        assert policy.check(path, {}) is None
    # the key does not open what is closed, the admin key opens everything
    auth = {"authorization": "bearer k3y-for-clients"}
    assert policy.check("/v2/models/prefill_0/generate", auth).status == 404
    assert policy.check("/v2/repository/index", auth).status == 403
    assert policy.check("/v2/repository/index", {"admin-key": "s3cret-admin"}) is None


def test_triton_ports_restrict_the_same_groups():
    flags = restricted_apis(ServeConfig(), "per-run-key")
    groups = "shared-memory,model-repository,trace,logging"
    assert flags == [f"--http-restricted-api={groups}:admin-key=per-run-key",
                     f"--grpc-restricted-protocol={groups}:admin-key=per-run-key"]  # fmt: skip
    keyed = restricted_apis(ServeConfig(api_key="k3y-for-clients"), "a")
    assert keyed[-1] == "--grpc-restricted-protocol=inference,metadata:api-key=k3y-for-clients"
    assert grpc_metadata("k") == (("triton-grpc-protocol-api-key", "k"),)
    assert grpc_metadata("") == ()


def test_keys_are_validated_and_never_written_to_the_run_config(tmp_path):
    with pytest.raises(ValueError, match="api_key must be 8 or more"):
        ServeConfig(api_key="short")
    cfg = ServeConfig(api_key="k3y-for-clients", admin_key="s3cret-admin")
    assert "k3y" not in repr(cfg)
    cfg.write(tmp_path / "run_config.json")
    text = (tmp_path / "run_config.json").read_text()
    assert "k3y" not in text and "s3cret" not in text
    assert ServeConfig.read(tmp_path / "run_config.json").api_key == ""


def test_metrics_can_need_the_key_health_never_does():
    policy = AccessPolicy(api_key="k3y-for-clients", metrics_need_key=True)
    assert policy.check("/metrics", {}).status == 401
    assert policy.check("/metrics", {"authorization": "Bearer k3y-for-clients"}) is None
    assert policy.check("/v2/health/ready", {}) is None and policy.check("/health", {}) is None


def test_keys_come_from_the_command_line_or_the_environment(monkeypatch):
    import bucketserve.serving.launch.cli as cli

    seen = {}
    monkeypatch.setattr(cli, "cmd_serve", lambda a: seen.setdefault("cfg", cli.serve_config(a)))
    monkeypatch.setenv("BUCKETSERVE_API_KEY", "from-the-env-1")
    cli.main(["serve", "--admin-key", "from-the-flag-2", "--metrics-need-api-key"])
    cfg = seen["cfg"]
    assert (cfg.api_key, cfg.admin_key, cfg.metrics_need_api_key) == (
        "from-the-env-1", "from-the-flag-2", True)  # fmt: skip
    seen.clear()
    monkeypatch.delenv("BUCKETSERVE_API_KEY")
    cli.main(["serve"])
    assert (seen["cfg"].api_key, seen["cfg"].admin_key) == ("", "")
