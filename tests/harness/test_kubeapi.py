"""Self-tests for tests/harness/kubeapi.py, driven through the real ``kubernetes`` client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, config
from kubernetes.client import ApiClient, ApiException, CoreV1Api

from tests.harness.kubeapi import ApiError, FakeKubeAPI, json_patch, label_selector, merge_patch

GPU_KEY = "gpu.example.com/profile"
FOREIGN = {"node.alpha.kubernetes.io/ttl": "0", "other.io/owner": "someone-else"}


@pytest.fixture
def core(kube_client: ApiClient) -> CoreV1Api:
    return CoreV1Api(kube_client)


def _status(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body)
    return body


def test_list_and_get_nodes(kubeapi: FakeKubeAPI, core: CoreV1Api) -> None:
    kubeapi.add_node(
        "gpu-1", labels={"gpu": "true", "zone": "a"}, annotations=FOREIGN, capacity={"nvidia.com/gpu": "8"}
    )
    kubeapi.add_node("gpu-2", labels={"gpu": "true", "zone": "b"})
    kubeapi.add_node("cpu-1", labels={"zone": "a"})

    assert [n.metadata.name for n in core.list_node().items] == ["cpu-1", "gpu-1", "gpu-2"]
    assert [n.metadata.name for n in core.list_node(label_selector="gpu=true,zone!=b").items] == ["gpu-1"]
    assert [n.metadata.name for n in core.list_node(label_selector="!gpu").items] == ["cpu-1"]
    assert [n.metadata.name for n in core.list_node(label_selector="zone in (b, c)").items] == ["gpu-2"]
    assert [n.metadata.name for n in core.list_node(field_selector="metadata.name=gpu-2").items] == ["gpu-2"]

    page = core.list_node(limit=2)
    assert [n.metadata.name for n in page.items] == ["cpu-1", "gpu-1"]
    rest = core.list_node(limit=2, _continue=page.metadata._continue)
    assert [n.metadata.name for n in rest.items] == ["gpu-2"] and rest.metadata._continue is None

    node = core.read_node("gpu-1")
    assert node.metadata.annotations == FOREIGN
    assert node.status.capacity == {"nvidia.com/gpu": "8"}
    assert node.metadata.resource_version == kubeapi.node("gpu-1")["metadata"]["resourceVersion"]

    with pytest.raises(ApiException) as e:
        core.read_node("nope")
    assert e.value.status == 404 and _status(e.value)["reason"] == "NotFound"
    with pytest.raises(ApiException) as e:
        core.list_node(label_selector="a in (b")
    assert e.value.status == 400


def test_patch_kinds_and_recording(kubeapi: FakeKubeAPI, core: CoreV1Api) -> None:
    kubeapi.add_node("n1", annotations=FOREIGN)
    rv0 = int(kubeapi.node("n1")["metadata"]["resourceVersion"])

    # dict body -> strategic merge patch
    out = core.patch_node("n1", {"metadata": {"annotations": {GPU_KEY: "a", "gpu.example.com/x": "1"}}})
    assert out.metadata.annotations == {**FOREIGN, GPU_KEY: "a", "gpu.example.com/x": "1"}
    rv1 = int(out.metadata.resource_version)
    assert rv1 > rv0

    # merge patch: null deletes one key, foreign keys survive
    core.patch_node(
        "n1", {"metadata": {"annotations": {"gpu.example.com/x": None}}}, _content_type="application/merge-patch+json"
    )
    assert kubeapi.node("n1")["metadata"]["annotations"] == {**FOREIGN, GPU_KEY: "a"}

    # list body -> JSON patch, with ~1 escaping '/' in the key
    core.patch_node(
        "n1",
        [
            {"op": "test", "path": f"/metadata/annotations/{GPU_KEY.replace('/', '~1')}", "value": "a"},
            {"op": "replace", "path": f"/metadata/annotations/{GPU_KEY.replace('/', '~1')}", "value": "b"},
            {"op": "add", "path": "/metadata/labels/gpu.example.com~1profiled", "value": "true"},
        ],
    )
    stored = kubeapi.node("n1")["metadata"]
    assert stored["annotations"] == {**FOREIGN, GPU_KEY: "b"}
    assert stored["labels"] == {"gpu.example.com/profiled": "true"}

    # a failing test op aborts the whole JSON patch
    with pytest.raises(ApiException) as e:
        core.patch_node(
            "n1",
            [
                {"op": "remove", "path": "/metadata/labels/gpu.example.com~1profiled"},
                {"op": "test", "path": f"/metadata/annotations/{GPU_KEY.replace('/', '~1')}", "value": "a"},
            ],
        )
    assert e.value.status == 422
    assert kubeapi.node("n1")["metadata"]["labels"] == {"gpu.example.com/profiled": "true"}

    # a patch that changes nothing does not bump resourceVersion
    rv = kubeapi.node("n1")["metadata"]["resourceVersion"]
    core.patch_node("n1", {"metadata": {"annotations": {GPU_KEY: "b"}}})
    assert kubeapi.node("n1")["metadata"]["resourceVersion"] == rv

    patches = kubeapi.patches("n1")
    assert [p.content_type for p in patches] == [
        "application/strategic-merge-patch+json",
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/json-patch+json",
        "application/strategic-merge-patch+json",
    ]
    assert [p.status for p in patches] == [200, 200, 200, 422, 200]
    assert patches[1].body == {"metadata": {"annotations": {"gpu.example.com/x": None}}}
    assert patches[0].headers["authorization"] == "Bearer test-token"
    assert kubeapi.patches("other") == []
    kubeapi.clear_requests()
    assert kubeapi.requests == []


def test_optimistic_concurrency(kubeapi: FakeKubeAPI, core: CoreV1Api) -> None:
    kubeapi.add_node("n1", annotations=FOREIGN)
    seen = core.read_node("n1").metadata.resource_version
    kubeapi.edit_node("n1", annotations={"other.io/owner": "changed"})  # another writer wins the race
    body = {"metadata": {"resourceVersion": seen, "annotations": {GPU_KEY: "x"}}}
    with pytest.raises(ApiException) as e:
        core.patch_node("n1", body, _content_type="application/merge-patch+json")
    assert e.value.status == 409 and _status(e.value)["reason"] == "Conflict"
    assert GPU_KEY not in kubeapi.node("n1")["metadata"]["annotations"]

    body["metadata"]["resourceVersion"] = core.read_node("n1").metadata.resource_version
    out = core.patch_node("n1", body, _content_type="application/merge-patch+json")
    assert out.metadata.annotations == {**FOREIGN, "other.io/owner": "changed", GPU_KEY: "x"}

    # full update (PUT) with a stale object conflicts too
    stale = core.read_node("n1")
    kubeapi.edit_node("n1", labels={"l": "v"})
    with pytest.raises(ApiException) as e:
        core.replace_node("n1", stale)
    assert e.value.status == 409


def test_injected_errors_and_delays(kubeapi: FakeKubeAPI, core: CoreV1Api) -> None:
    kubeapi.add_node("n1")
    patch = {"metadata": {"annotations": {GPU_KEY: "v"}}}
    for status in (403, 409, 500):
        kubeapi.inject("PATCH", r"/nodes/n1$", status)
        with pytest.raises(ApiException) as e:
            core.patch_node("n1", patch)
        assert e.value.status == status
        assert _status(e.value)["code"] == status
    assert GPU_KEY not in kubeapi.node("n1")["metadata"]["annotations"]

    kubeapi.inject("*", r"^/api/v1/nodes", 503, times=2)
    statuses = []
    for _ in range(3):
        try:
            core.list_node()
            statuses.append(200)
        except ApiException as exc:
            statuses.append(exc.status)
    assert statuses == [503, 503, 200]
    assert [r.injected for r in kubeapi.requests[-3:]] == [True, True, False]

    # Extra headers reach the client: with Retry-After it retries a GET by itself.
    kubeapi.clear_requests()
    kubeapi.inject("GET", r"^/api/v1/nodes$", 429, headers={"Retry-After": "0"})
    assert [n.metadata.name for n in core.list_node().items] == ["n1"]
    assert [r.status for r in kubeapi.requests] == [429, 200]

    # A hanging server: the client's own timeout fires; PATCH is sent once (never retried).
    kubeapi.clear_requests()
    kubeapi.inject("PATCH", r"/nodes/n1$", 500, delay=5)
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.patch_node("n1", patch, _request_timeout=0.3)
    assert len(kubeapi.patches("n1")) == 1
    core.patch_node("n1", patch)  # the injection was used up: the next call succeeds
    assert kubeapi.node("n1")["metadata"]["annotations"] == {GPU_KEY: "v"}


def test_validation_like_the_real_server(kubeapi: FakeKubeAPI, core: CoreV1Api) -> None:
    kubeapi.add_node("n1")
    for bad, status in [
        ({"Bad_Prefix.io/x": "v"}, 422),
        ({"example.com/" + "n" * 64: "v"}, 422),
        ({"example.com/ok": 5}, 400),
        ({"example.com/big": "x" * (256 * 1024)}, 422),
    ]:
        with pytest.raises(ApiException) as e:
            core.patch_node("n1", {"metadata": {"annotations": bad}})
        assert e.value.status == status, bad
    with pytest.raises(ApiException) as e:
        core.patch_node("n1", {"metadata": {"labels": {"example.com/l": "has space"}}})
    assert e.value.status == 422 and "label value" in _status(e.value)["message"]
    with pytest.raises(ApiException) as e:
        core.patch_node("n1", {"metadata": {"annotations": {"a": "b"}}}, _content_type="application/apply-patch+yaml")
    assert e.value.status == 415
    assert kubeapi.node("n1")["metadata"]["annotations"] == {}


def test_token_is_required(kubeapi: FakeKubeAPI, tmp_path: Path) -> None:
    kubeapi.add_node("n1")
    path = kubeapi.kubeconfig(tmp_path / "kc")
    cfg = json.loads(path.read_text())
    cfg["users"][0]["user"]["token"] = "wrong"
    path.write_text(json.dumps(cfg))
    # built by hand, not the kube_client fixture: this client deliberately carries a wrong token
    api = config.new_client_from_config(config_file=str(path))
    try:
        with pytest.raises(ApiException) as e:
            client.CoreV1Api(api).read_node("n1")
        assert e.value.status == 401
    finally:
        api.close()


def test_stop_cuts_kept_alive_connections(kubeapi: FakeKubeAPI, core: CoreV1Api) -> None:
    kubeapi.add_node("n1")
    core.read_node("n1")  # leaves a pooled keep-alive connection
    kubeapi.stop()  # must cut it: an old handler thread would otherwise still answer
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.read_node("n1", _request_timeout=2)


def test_pure_helpers() -> None:
    doc = {"a": {"b": 1, "c": [1, 2]}, "d": "x"}
    assert merge_patch(doc, {"a": {"b": None, "c": [3]}, "e": {"f": 1}}) == {"a": {"c": [3]}, "d": "x", "e": {"f": 1}}
    assert doc == {"a": {"b": 1, "c": [1, 2]}, "d": "x"}  # inputs untouched
    assert json_patch(
        doc, [{"op": "add", "path": "/a/c/-", "value": 9}, {"op": "move", "from": "/d", "path": "/z"}]
    ) == {
        "a": {"b": 1, "c": [1, 2, 9]},
        "z": "x",
    }
    with pytest.raises(ApiError, match="does not exist"):
        json_patch(doc, [{"op": "remove", "path": "/a/nope"}])
    sel = label_selector("a=1,b,!c,d notin (x,y)")
    assert (
        sel({"a": "1", "b": "", "d": "z"}) and not sel({"a": "1", "b": "", "c": "1"}) and not sel({"a": "1", "d": "x"})
    )


READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready"}
GPU_HEALTHY = {"type": "GPUHealthy", "status": "False", "reason": "GPULost", "message": "GPULost: GPU 1"}


def test_node_status_patches_admit_only_the_gpu_healthy_condition(kubeapi: FakeKubeAPI, core: CoreV1Api) -> None:
    kubeapi.add_node("gpu-1", capacity={"nvidia.com/gpu": "8"}, conditions=[READY])

    def conditions() -> list[dict[str, Any]]:
        return kubeapi.node("gpu-1")["status"]["conditions"]  # type: ignore[no-any-return]

    def refused(body: Any, ctype: str) -> None:
        with pytest.raises(ApiException) as e:
            core.patch_node_status("gpu-1", body, _content_type=ctype)
        msg = _status(e.value)["message"]
        assert e.value.status == 403 and ("GPUHealthy" in msg or "status field" in msg), msg

    # strategic merge: conditions merge by type, Ready stays
    core.patch_node_status("gpu-1", {"status": {"conditions": [GPU_HEALTHY]}},
                           _content_type="application/strategic-merge-patch+json")
    assert conditions() == [READY, GPU_HEALTHY]
    core.patch_node_status("gpu-1", {"status": {"conditions": [{"type": "GPUHealthy", "status": "True"}]}},
                           _content_type="application/strategic-merge-patch+json")
    assert conditions() == [READY, {**GPU_HEALTHY, "status": "True"}]
    refused({"status": {"conditions": [{**READY, "status": "False"}]}}, "application/strategic-merge-patch+json")
    refused({"status": {"capacity": {"nvidia.com/gpu": "0"}}}, "application/strategic-merge-patch+json")
    # merge patch: the list is replaced whole, so leaving Ready out removes it: refused
    refused({"status": {"conditions": [GPU_HEALTHY]}}, "application/merge-patch+json")
    core.patch_node_status("gpu-1", {"status": {"conditions": [READY, GPU_HEALTHY]}},
                           _content_type="application/merge-patch+json")
    assert conditions() == [READY, GPU_HEALTHY]
    # JSON patch
    core.patch_node_status("gpu-1", [{"op": "replace", "path": "/status/conditions/1/status", "value": "Unknown"}],
                           _content_type="application/json-patch+json")
    assert conditions()[1]["status"] == "Unknown"
    refused([{"op": "replace", "path": "/status/conditions/0/status", "value": "False"}], "application/json-patch+json")
    refused([{"op": "add", "path": "/status/addresses", "value": []}], "application/json-patch+json")
    refused([{"op": "add", "path": "/status/conditions/-", "value": {"type": "Other", "status": "True"}}],
            "application/json-patch+json")
    assert conditions() == [READY, {**GPU_HEALTHY, "status": "Unknown"}]
    assert kubeapi.node("gpu-1")["status"]["capacity"] == {"nvidia.com/gpu": "8"}
    assert {(r.verb, r.resource) for r in kubeapi.requests} == {("patch", "nodes/status")}
