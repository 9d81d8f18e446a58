"""The profiler's API client refreshes its credentials at most once a second, and still picks up a
rotated token (issue 29: the kubernetes client re-applies its whole configuration before every
request, a third of a node patch's client CPU; with an expired exec-plugin token it even runs the
plugin again before every request).

Real kubeconfig loader and exec plugin (a Python script that prints an ``ExecCredential``), real
client, the fake API server; only the throttle's clock is the test's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from exporter.platform.kube import api_client as build_api_client
from exporter.profiler.annotate import KUBE_REJECTED, Conflict, KubeError, NodeStore
from tests.harness.clock import FakeClock
from tests.harness.kubeapi import FakeKubeAPI

PLUGIN = """
import json, pathlib, sys
here = pathlib.Path(sys.argv[1])
with open(here / "runs", "a") as f:
    f.write("x")
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": (here / "token").read_text(),
                             "expirationTimestamp": "2001-01-01T00:00:00Z"}}))
"""


def _exec_kubeconfig(api: FakeKubeAPI, tmp: Path) -> Path:
    (tmp / "plugin.py").write_text(PLUGIN)
    (tmp / "token").write_text(str(api.token))
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "exec"}}],
        "users": [{"name": "exec", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
            "args": [str(tmp / "plugin.py"), str(tmp)], "interactiveMode": "Never"}}}],
    }
    path = tmp / "kubeconfig"
    path.write_text(json.dumps(cfg))
    return path


def _runs(tmp: Path) -> int:
    return len((tmp / "runs").read_text())


def test_an_expired_token_is_refreshed_at_most_once_a_second_and_a_rotated_one_is_used(
        kubeapi: FakeKubeAPI, tmp_path: Path) -> None:
    kubeapi.add_node("gpu-1")
    clock = FakeClock()
    store = NodeStore(build_api_client(str(_exec_kubeconfig(kubeapi, tmp_path)), clock=clock))
    loaded = _runs(tmp_path)  # the loader runs the plugin once while it reads the kubeconfig
    for _ in range(20):
        assert store.get_node("gpu-1") is not None
    # the token is expired, so without the throttle every request ran the plugin again (21 runs)
    assert _runs(tmp_path) == loaded + 1

    # the cluster rotates the token; within the second the client still sends the old one
    kubeapi.token = "rotated-token"
    (tmp_path / "token").write_text("rotated-token")
    clock.now += 0.999
    with pytest.raises(KubeError) as err:
        store.get_node("gpu-1")
    assert err.value.kind == KUBE_REJECTED and "401" in str(err.value)
    assert _runs(tmp_path) == loaded + 1

    # a second after the last refresh, the next request refreshes and sends the new token
    clock.now += 0.001
    assert store.get_node("gpu-1") is not None
    assert _runs(tmp_path) == loaded + 2
    clock.now += 5
    assert store.get_node("gpu-1") is not None and store.get_node("gpu-1") is not None
    assert _runs(tmp_path) == loaded + 3


def test_a_static_token_client_sends_its_token_on_every_request(kubeapi: FakeKubeAPI, tmp_path: Path) -> None:
    """The throttle skips the loader's hook, never the Authorization header: requests inside the
    second carry the token too."""
    kubeapi.add_node("gpu-1")
    store = NodeStore(build_api_client(str(kubeapi.kubeconfig(tmp_path / "kc")), clock=FakeClock()))
    kubeapi.clear_requests()
    for _ in range(5):
        assert store.get_node("gpu-1") is not None
    assert len(kubeapi.requests) == 5  # each answered 200: a request without the token gets 401


def _sent(kubeapi: FakeKubeAPI, store: NodeStore) -> list[tuple[str, str, str | None, object, dict[str, str]]]:
    kubeapi.clear_requests()
    store.patch_annotations("gpu-1", {"gpu-exporter.io/gpu-0.pattern": "idle", "gpu-exporter.io/x": None}, "")
    store.patch_condition("gpu-1", {"type": "GPUHealthy", "status": "True", "reason": "AllGPUsHealthy",
                                    "message": "ok", "lastTransitionTime": "2026-11-26T00:00:00Z"})
    with pytest.raises(Conflict):
        store.patch_annotations("gpu-1", {"gpu-exporter.io/gpu-0.pattern": "idle"}, "1")  # a stale version
    keep = ("authorization", "user-agent", "accept")
    return [(r.method, r.path, r.content_type, r.body, {k: v for k, v in r.headers.items() if k in keep})
            for r in kubeapi.requests]


def test_node_patches_through_the_pool_are_the_generated_methods_requests(kubeapi: FakeKubeAPI,
                                                                             tmp_path: Path) -> None:
    """The node patches go through the client's urllib3 pool without the generated methods'
    validation layer (a third of their CPU); the server sees the same requests either way, and a
    409 is the same Conflict."""
    kubeapi.add_node("gpu-1")
    kc = str(kubeapi.kubeconfig(tmp_path / "kc"))
    fast = NodeStore(build_api_client(kc))
    assert fast._send is not None  # this client version has a pool: the fast path is the one tested
    generated = NodeStore(build_api_client(kc))
    generated._send = None
    got, want = _sent(kubeapi, fast), _sent(kubeapi, generated)
    assert got == want
    assert [r[0:2] for r in got] == [("PATCH", "/api/v1/nodes/gpu-1"), ("PATCH", "/api/v1/nodes/gpu-1/status"),
                                     ("PATCH", "/api/v1/nodes/gpu-1")]
    assert got[0][4]["authorization"] == f"Bearer {kubeapi.token}"
