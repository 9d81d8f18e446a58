"""NodeStore (profiler/annotate.py) on its own: the real ``kubernetes`` client against the fake API
server in this process, no Prometheus and no cycle (the mutation module ``annotate``).

What a Node read keeps, what each API answer becomes (NodeGone, Conflict, one KubeError kind with a
one-line message), the retry bound and its backoff, pagination and selectors, and the exact requests
a patch sends. The cycles that use NodeStore are tested in test_kube.py and test_health.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from exporter.profiler import annotate
from exporter.profiler.annotate import Conflict, KubeError, NodeGone, NodeInfo, NodeStore
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.net import free_port

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

P = "gpu-exporter.io"


class _Resp:
    """What a ``_preload_content=False`` call returns: ``data`` and ``release_conn``."""

    def __init__(self, data: bytes | Exception) -> None:
        self._data = data
        self.released = 0

    @property
    def data(self) -> bytes:
        if isinstance(self._data, Exception):
            raise self._data
        return self._data

    def release_conn(self) -> None:
        self.released += 1


def _store(**kw: Any) -> tuple[NodeStore, list[float]]:
    """A NodeStore whose calls are driven by hand (``_call``), recording its backoff sleeps."""
    from kubernetes import client

    slept: list[float] = []
    return NodeStore(client.ApiClient(), sleep=slept.append, **kw), slept


def _api_error(status: int | None, reason: str = "Reason", message: str | None = None) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "message": message}).encode() if message else b""
    return exc


# ---- what a Node read keeps ------------------------------------------------------------------------


def test_node_info_keeps_name_version_our_annotations_and_the_condition() -> None:
    node = {"metadata": {"name": "n1", "resourceVersion": "42",
                         "annotations": {f"{P}/pattern": "idle", "example.com/x": "y", f"{P}x/other": "z"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"},
                                      {"type": "GPUHealthy", "status": "False", "reason": "GPULost",
                                       "observedGeneration": 3, "message": "m"}]}}
    info = annotate._node_info(node, f"{P}/")
    assert info == NodeInfo("n1", {f"{P}/pattern": "idle"}, "42",
                            {"type": "GPUHealthy", "status": "False", "reason": "GPULost", "message": "m"})
    assert annotate._node_info(node).annotations == node["metadata"]["annotations"]  # no prefix: all of them
    # missing parts: empty strings, no annotations, no condition
    assert annotate._node_info({"metadata": {}}) == NodeInfo("", {}, "", None)
    assert annotate._node_info({"metadata": {"annotations": None, "name": 7}}).name == "7"
    assert annotate._node_info({"metadata": {"annotations": {"k": 1}}}).annotations == {"k": "1"}


@pytest.mark.parametrize(("obj", "message"), [
    ([], "API server answered something that is not a Node"),
    ({"kind": "Node"}, "API server answered something that is not a Node"),
    ({"metadata": "x"}, "API server answered something that is not a Node"),
    ({"metadata": {"annotations": ["a"]}}, "a Node's annotations are not an object"),
])
def test_a_node_that_is_not_one_is_a_bad_response(obj: Any, message: str) -> None:
    with pytest.raises(KubeError) as err:
        annotate._node_info(obj)
    assert err.value.kind == annotate.KUBE_BAD_RESPONSE and str(err.value) == message


def test_the_condition_of_every_shape() -> None:
    ok = {"type": "GPUHealthy", "status": "True"}
    assert annotate._condition({"status": {"conditions": [ok]}}) == ok
    assert annotate._condition({"status": {"conditions": [{"type": "Ready"}, "junk", ok, {"type": "GPUHealthy"}]}}) \
        == ok  # the first of its type, after what is not one
    assert annotate._condition({"status": {"conditions": [{"type": "Other", "status": "x"}]}}, "Other") == {
        "type": "Other", "status": "x"}
    for obj in ({}, {"status": "x"}, {"status": {}}, {"status": {"conditions": {"type": "GPUHealthy"}}},
                {"status": {"conditions": [{"type": "Ready"}]}}):
        assert annotate._condition(obj) is None, obj


def test_the_reason_of_an_error_answer() -> None:
    assert annotate._reason(_api_error(500, "Internal", "etcd is down")) == "etcd is down"
    assert annotate._reason(_api_error(500, "Internal")) == "Internal"  # not JSON: the HTTP reason
    exc = _api_error(500, "Internal")
    exc.body = json.dumps({"kind": "Status"}).encode()
    assert annotate._reason(exc) == "Internal"  # no message: the HTTP reason

    class Bare:
        body = None

    assert annotate._reason(Bare()) == ""


def test_store_settings() -> None:
    store, _ = _store(retries=-2, keep_prefix=P, timeout=2.5, backoff=0.25, label_selector="a=b")
    assert (store.retries, store.keep, store.timeout, store.backoff, store.label_selector) == (
        0, f"{P}/", 2.5, 0.25, "a=b")
    assert _store(keep_prefix="")[0].keep is None and _store()[0].keep is None
    assert _store()[0].retries == 3 and _store()[0].timeout == 10.0 and _store()[0].backoff == 0.5
    assert _store()[0].requests_sent == 0


# ---- what each answer becomes ----------------------------------------------------------------------


def test_an_answer_is_parsed_and_its_connection_released() -> None:
    store, slept = _store()
    resp = _Resp(b'{"a": 1}')
    assert store._call("GET", "node n", lambda: resp) == {"a": 1}
    assert resp.released == 1 and store.requests_sent == 1 and slept == []
    broken = _Resp(OSError("reset"))  # the body fails: released all the same, retried as unreachable
    store, _ = _store(retries=0)
    with pytest.raises(KubeError) as err:
        store._call("GET", "node n", lambda: broken)
    assert broken.released == 1 and err.value.kind == annotate.KUBE_UNREACHABLE
    assert str(err.value) == "GET node n: OSError: reset"


def test_answers_that_are_not_json_are_a_bad_response_at_once() -> None:
    store, slept = _store()
    with pytest.raises(KubeError) as err:
        store._call("LIST", "nodes", lambda: _Resp(b"<html>"))
    assert err.value.kind == annotate.KUBE_BAD_RESPONSE and str(err.value).startswith(
        "LIST nodes: answer is not JSON (Expecting value")
    assert store.requests_sent == 1 and slept == []


@pytest.mark.parametrize(("status", "raised"), [(404, NodeGone), (409, Conflict)])
def test_gone_and_conflict_are_their_own_exceptions_never_retried(status: int, raised: type[Exception]) -> None:
    store, slept = _store()

    def fn() -> Any:
        raise _api_error(status)

    with pytest.raises(raised) as err:
        store._call("PATCH", "node n", fn)
    assert str(err.value) == "node n" and store.requests_sent == 1 and slept == []


@pytest.mark.parametrize(("verb", "word"), [("GET", "get"), ("PATCH", "patch"), ("LIST", "list"),
                                            ("DELETE", "delete")])
def test_forbidden_names_the_verb_the_service_account_lacks(verb: str, word: str) -> None:
    store, slept = _store()

    def fn() -> Any:
        raise _api_error(403)

    with pytest.raises(KubeError) as err:
        store._call(verb, "node n", fn)
    assert err.value.kind == annotate.KUBE_FORBIDDEN and slept == [] and store.requests_sent == 1
    assert str(err.value) == (f"forbidden to {word} node n: the profiler's service account needs RBAC verb "
                              f"'{word}' on 'nodes' (ClusterRole rules: apiGroups [''], resources ['nodes'], "
                              "verbs ['get', 'list', 'patch'])")


@pytest.mark.parametrize(("status", "kind", "text"), [
    (500, annotate.KUBE_SERVER, "GET node n: HTTP 500 etcd is down"),
    (503, annotate.KUBE_SERVER, "GET node n: HTTP 503 etcd is down"),
    (429, annotate.KUBE_SERVER, "GET node n: HTTP 429 etcd is down"),
])
def test_server_errors_are_retried_with_a_growing_jittered_backoff_then_fail(status: int | None, kind: str,
                                                                            text: str) -> None:
    store, slept = _store(retries=3, backoff=0.5)
    calls = 0

    def fn() -> Any:
        nonlocal calls
        calls += 1
        raise _api_error(status, message="etcd is down")

    with pytest.raises(KubeError) as err:
        store._call("GET", "node n", fn)
    assert (err.value.kind, calls, store.requests_sent, len(slept)) == (kind, 4, 4, 3)
    assert str(err.value) == text
    assert all(0 <= s <= 0.5 * 2 ** i for i, s in enumerate(slept)), slept


@pytest.mark.parametrize("status", [0, None])
def test_a_connection_the_client_could_not_make_is_unreachable_in_one_line(status: int | None) -> None:
    """The client raises ``ApiException(status=0, reason=...)`` for a TLS failure (kubernetes/client/rest.py):
    retried like a server error, and named in one line (it was the exception's multi-line text)."""
    store, slept = _store(retries=1)

    def fn() -> Any:
        raise ApiException(status=status, reason="SSLError(CERTIFICATE_VERIFY_FAILED)")

    with pytest.raises(KubeError) as err:
        store._call("GET", "node n", fn)
    assert (err.value.kind, store.requests_sent, len(slept)) == (annotate.KUBE_UNREACHABLE, 2, 1)
    assert str(err.value) == "GET node n: SSLError(CERTIFICATE_VERIFY_FAILED)"


def test_the_backoff_is_drawn_from_the_whole_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """random.uniform(0, backoff x 2^(attempt-1)): the bounds each retry is drawn between."""
    drawn: list[tuple[float, float]] = []
    monkeypatch.setattr(annotate.random, "uniform", lambda a, b: drawn.append((a, b)) or b)
    store, slept = _store(retries=3, backoff=0.5)

    def fn() -> Any:
        raise _api_error(500)

    with pytest.raises(KubeError):
        store._call("GET", "node n", fn)
    assert drawn == [(0, 0.5), (0, 1.0), (0, 2.0)] and slept == [0.5, 1.0, 2.0]


def test_a_server_error_then_an_answer_is_an_answer() -> None:
    store, slept = _store(retries=1)
    answers: list[Any] = [_api_error(503), _Resp(b"[]")]

    def fn() -> Any:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    assert store._call("GET", "node n", fn) == [] and store.requests_sent == 2 and len(slept) == 1


@pytest.mark.parametrize("status", [400, 401, 410, 422])
def test_other_client_errors_are_our_fault_and_not_retried(status: int) -> None:
    store, slept = _store()

    def fn() -> Any:
        raise _api_error(status, message="metadata.annotations: Invalid value")

    with pytest.raises(KubeError) as err:
        store._call("PATCH", "node n", fn)
    assert err.value.kind == annotate.KUBE_REJECTED and slept == [] and store.requests_sent == 1
    assert str(err.value) == f"PATCH node n: HTTP {status} metadata.annotations: Invalid value"


def test_an_unreachable_server_is_retried_then_named(tmp_path: Path) -> None:
    """A real client pointed at a port where nothing listens: connection refused, retried, counted."""
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{free_port()}"
    cfg.retries = 0
    slept: list[float] = []
    store = NodeStore(client.ApiClient(cfg), retries=2, sleep=slept.append, timeout=2)
    with pytest.raises(KubeError) as err:
        store.get_node("n")
    assert err.value.kind == annotate.KUBE_UNREACHABLE and str(err.value).startswith("GET node n: ")
    assert store.requests_sent == 3 and len(slept) == 2


# ---- the calls, through the real client and the fake API server ----------------------------------


def test_listing_sends_the_limit_the_selector_and_the_timeout(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    kubeapi.add_node("gpu-0", labels={"gpu": "yes"}, annotations={f"{P}/pattern": "idle", "other/x": "1"})
    kubeapi.add_node("cpu-0", labels={"gpu": "no"})
    nodes = NodeStore(kube_client, label_selector="gpu=yes", keep_prefix=P).list_nodes()
    assert list(nodes) == ["gpu-0"] and nodes["gpu-0"].annotations == {f"{P}/pattern": "idle"}
    (req,) = [r for r in kubeapi.requests if r.verb == "list"]
    assert req.query.get("limit") == "500" and req.query.get("labelSelector") == "gpu=yes"
    assert "continue" not in req.query
    everything = NodeStore(kube_client).list_nodes()
    assert sorted(everything) == ["cpu-0", "gpu-0"] and everything["gpu-0"].annotations["other/x"] == "1"
    assert "labelSelector" not in kubeapi.requests[-1].query


def test_listing_pages_follow_the_continue_token_to_the_end(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    for i in range(1001):
        kubeapi.add_node(f"p-{i:04d}")
    nodes = NodeStore(kube_client).list_nodes()
    assert len(nodes) == 1001
    lists = [r for r in kubeapi.requests if r.verb == "list"]
    assert len(lists) == 3 and [bool(r.query.get("continue")) for r in lists] == [False, True, True]


@pytest.mark.parametrize(("status", "message"), [(404, "listing nodes: unexpected NodeGone"),
                                                 (409, "listing nodes: unexpected Conflict")])
def test_a_list_answered_404_or_409_is_a_server_error(kubeapi: FakeKubeAPI, kube_client: ApiClient, status: int,
                                                      message: str) -> None:
    kubeapi.inject("GET", r"^/api/v1/nodes$", status)
    with pytest.raises(KubeError) as err:
        NodeStore(kube_client).list_nodes()
    assert (err.value.kind, str(err.value)) == (annotate.KUBE_SERVER, message)


def test_a_list_without_items_is_a_bad_response() -> None:
    store, _ = _store()
    for doc in (b'{"kind": "NodeList"}', b'{"items": {}}', b"[]"):
        store.api.list_node = lambda doc=doc, **kw: _Resp(doc)  # type: ignore[method-assign]
        with pytest.raises(KubeError) as err:
            store.list_nodes()
        assert (err.value.kind, str(err.value)) == (annotate.KUBE_BAD_RESPONSE, "node list without items")
    # an empty continue token (or none, or no metadata) ends the list
    for doc in (b'{"items": [], "metadata": {"continue": ""}}', b'{"items": []}', b'{"items": [], "metadata": null}'):
        store.api.list_node = lambda doc=doc, **kw: _Resp(doc)  # type: ignore[method-assign]
        assert store.list_nodes() == {}


def test_list_arguments_exactly() -> None:
    store, _ = _store(timeout=3.0)
    seen: list[dict[str, Any]] = []
    pages = [b'{"items": [{"metadata": {"name": "a"}}], "metadata": {"continue": "t1"}}',
             b'{"items": [{"metadata": {"name": "b"}}]}']
    store.api.list_node = lambda **kw: seen.append(kw) or _Resp(pages[len(seen) - 1])  # type: ignore[method-assign]
    assert sorted(store.list_nodes()) == ["a", "b"]
    assert seen == [{"limit": 500, "_preload_content": False, "_request_timeout": 3.0},
                    {"limit": 500, "_preload_content": False, "_request_timeout": 3.0, "_continue": "t1"}]


def test_get_a_node_or_none_once_it_is_gone(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    kubeapi.add_node("n1", annotations={f"{P}/a": "1", "x/y": "2"})
    store = NodeStore(kube_client, keep_prefix=P)
    info = store.get_node("n1")
    assert info is not None and info.name == "n1" and info.annotations == {f"{P}/a": "1"}
    assert info.resource_version == kubeapi.node("n1")["metadata"]["resourceVersion"]
    assert store.get_node("gone") is None
    kubeapi.inject("GET", r"/nodes/n1$", 409)
    with pytest.raises(KubeError) as err:
        store.get_node("n1")
    assert (err.value.kind, str(err.value)) == (annotate.KUBE_SERVER, "GET node n1: unexpected 409")


def test_get_arguments_exactly() -> None:
    store, _ = _store(timeout=4.0)
    seen: list[tuple[Any, ...]] = []
    store.api.read_node = lambda name, **kw: seen.append((name, kw)) or _Resp(  # type: ignore[method-assign]
        b'{"metadata": {"name": "n"}}')
    assert store.get_node("n") == NodeInfo("n", {}, "", None)
    assert seen == [("n", {"_preload_content": False, "_request_timeout": 4.0})]


def test_an_annotation_patch_is_one_merge_patch_with_the_version_it_was_computed_from(
        kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    kubeapi.add_node("n1", annotations={f"{P}/old": "x", "x/keep": "k"})
    store = NodeStore(kube_client, keep_prefix=P)
    rv = kubeapi.node("n1")["metadata"]["resourceVersion"]
    info = store.patch_annotations("n1", {f"{P}/new": "1", f"{P}/old": None}, rv)
    assert info.annotations == {f"{P}/new": "1"} and info.resource_version != rv
    (req,) = kubeapi.patches("n1")
    assert req.content_type == annotate.MERGE_PATCH and req.path == "/api/v1/nodes/n1"
    assert req.body == {"metadata": {"annotations": {f"{P}/new": "1", f"{P}/old": None}, "resourceVersion": rv}}
    assert kubeapi.node("n1")["metadata"]["annotations"] == {"x/keep": "k", f"{P}/new": "1"}
    with pytest.raises(Conflict):  # computed from an older version: never overwrites
        store.patch_annotations("n1", {f"{P}/new": "2"}, rv)
    store.patch_annotations("n1", {f"{P}/new": "3"}, "")  # no version: none sent
    assert "resourceVersion" not in kubeapi.patches("n1")[-1].body["metadata"]
    with pytest.raises(NodeGone):
        store.patch_annotations("gone", {f"{P}/a": "1"}, "")


def test_a_condition_patch_is_a_strategic_merge_of_the_status(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    kubeapi.add_node("n1", conditions=[{"type": "Ready", "status": "True"}])
    store = NodeStore(kube_client)
    cond = {"type": "GPUHealthy", "status": "False", "reason": "GPULost", "message": "m"}
    store.patch_condition("n1", cond)
    (req,) = [r for r in kubeapi.requests if r.method == "PATCH"]
    assert (req.path, req.content_type, req.body) == ("/api/v1/nodes/n1/status", annotate.STRATEGIC_MERGE_PATCH,
                                                      {"status": {"conditions": [cond]}})
    assert [c["type"] for c in kubeapi.node("n1")["status"]["conditions"]] == ["Ready", "GPUHealthy"]
    kubeapi.inject("PATCH", r"/status$", 403)
    with pytest.raises(KubeError) as err:
        store.patch_condition("n1", cond)
    assert err.value.kind == annotate.KUBE_FORBIDDEN and str(err.value) == (
        "forbidden to patch node n1 status: the profiler's service account needs RBAC verb 'patch' on "
        "'nodes/status' (ClusterRole rule: apiGroups [''], resources ['nodes/status'], verbs ['patch']), and its "
        "admission policy must allow the GPUHealthy condition")
    kubeapi.inject("PATCH", r"/status$", 422)  # any other error: as it came
    with pytest.raises(KubeError) as err:
        store.patch_condition("n1", cond)
    assert err.value.kind == annotate.KUBE_REJECTED and str(err.value).startswith("PATCH node n1 status: HTTP 422 ")


def test_a_node_name_is_quoted_in_the_path() -> None:
    store, _ = _store()
    sent: list[tuple[Any, ...]] = []
    store._send = lambda *a: sent.append(a) or _Resp(b'{"metadata": {"name": "a b"}}')
    store.patch_annotations("a b/c", {"k": "v"}, "")
    store.patch_condition("a b/c", {"type": "GPUHealthy"})
    assert [s[:2] for s in sent] == [("PATCH", "/api/v1/nodes/a%20b%2Fc"), ("PATCH", "/api/v1/nodes/a%20b%2Fc/status")]
    assert [json.loads(s[2]) for s in sent] == [{"metadata": {"annotations": {"k": "v"}}},
                                                {"status": {"conditions": [{"type": "GPUHealthy"}]}}]
    assert [s[3:] for s in sent] == [(annotate.MERGE_PATCH, 10.0), (annotate.STRATEGIC_MERGE_PATCH, 10.0)]


def test_without_a_pool_the_generated_methods_send_the_same_patches() -> None:
    """A client with no ``rest_client.pool_manager``: no raw sender, and the generated methods are used
    with the same body, content type and timeout."""
    class NoPool:
        configuration = object()

    assert annotate._raw_sender(NoPool()) is None
    store, _ = _store(timeout=6.0)
    store._send = None
    calls: list[tuple[Any, ...]] = []
    store.api.patch_node = lambda name, body, **kw: calls.append(("node", name, body, kw)) or _Resp(  # type: ignore
        b'{"metadata": {"name": "n"}}')
    store.api.patch_node_status = lambda name, body, **kw: calls.append(("status", name, body, kw)) or _Resp(  # type: ignore
        b"{}")
    store.patch_annotations("n", {"k": None}, "7")
    store.patch_condition("n", {"type": "GPUHealthy"})
    kw = {"_preload_content": False, "_request_timeout": 6.0}
    assert calls == [("node", "n", {"metadata": {"annotations": {"k": None}, "resourceVersion": "7"}},
                      {"_content_type": annotate.MERGE_PATCH, **kw}),
                     ("status", "n", {"status": {"conditions": [{"type": "GPUHealthy"}]}},
                      {"_content_type": annotate.STRATEGIC_MERGE_PATCH, **kw})]


def test_the_raw_sender_sends_the_clients_credentials_and_raises_on_errors(kubeapi: FakeKubeAPI,
                                                                            kube_client: ApiClient) -> None:
    kubeapi.add_node("n1")
    send = annotate._raw_sender(kube_client)
    assert send is not None
    resp = send("PATCH", "/api/v1/nodes/n1", b'{"metadata": {"annotations": {"a/b": "c"}}}', annotate.MERGE_PATCH, 5)
    try:
        assert resp.status == 200 and json.loads(resp.data)["metadata"]["annotations"] == {"a/b": "c"}
    finally:
        resp.release_conn()
    req = kubeapi.patches("n1")[-1]
    assert req.headers.get("authorization") == "Bearer test-token" and req.content_type == annotate.MERGE_PATCH
    assert req.headers.get("accept") == "application/json"
    assert req.headers.get("user-agent") == kube_client.default_headers["User-Agent"]
    with pytest.raises(ApiException) as err:
        send("PATCH", "/api/v1/nodes/gone", b"{}", annotate.MERGE_PATCH, 5)
    assert err.value.status == 404 and json.loads(err.value.body)["code"] == 404
    kubeapi.inject("PATCH", r"/nodes/n1$", 500)
    with pytest.raises(ApiException) as err:
        send("PATCH", "/api/v1/nodes/n1", b"{}", annotate.MERGE_PATCH, 5)
    assert err.value.status == 500 and err.value.reason


def test_the_raw_sender_leaves_out_empty_credentials(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    """Only header credentials with a value are sent (a client without a token sends none)."""
    kubeapi.add_node("n1")
    kube_client.configuration.refresh_api_key_hook = None  # the kubeconfig loader's: it would put the token back
    for key in ({}, {"authorization": ""}):
        kube_client.configuration.api_key = key
        send = annotate._raw_sender(kube_client)
        assert send is not None
        with pytest.raises(ApiException) as err:
            send("PATCH", "/api/v1/nodes/n1", b"{}", annotate.MERGE_PATCH, 5)
        assert err.value.status == 401
        assert "authorization" not in kubeapi.requests[-1].headers, key


def test_each_call_names_itself_in_its_errors(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    """The list and the annotation patch say which call failed, in the server-error line and in the
    forbidden line's RBAC verb."""
    kubeapi.add_node("n1")
    store = NodeStore(kube_client, retries=0)
    cases = [("GET", r"^/api/v1/nodes$", store.list_nodes, "LIST nodes: HTTP 500 ", "forbidden to list nodes: "),
             ("PATCH", r"/nodes/n1$", lambda: store.patch_annotations("n1", {"a/b": "c"}, ""),
              "PATCH node n1: HTTP 500 ", "forbidden to patch node n1: ")]
    for method, path, call, server, forbidden in cases:
        kubeapi.inject(method, path, 500)
        with pytest.raises(KubeError) as err:
            call()
        assert err.value.kind == annotate.KUBE_SERVER and str(err.value).startswith(server), str(err.value)
        kubeapi.inject(method, path, 403)
        with pytest.raises(KubeError) as err:
            call()
        assert err.value.kind == annotate.KUBE_FORBIDDEN and str(err.value).startswith(forbidden), str(err.value)


def test_patches_go_through_the_clients_pool(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    """With the client's urllib3 pool at hand the patches never go through the generated methods (their
    per-call validation is most of a first cycle's CPU: docs/benchmarks.md)."""
    kubeapi.add_node("n1")
    store = NodeStore(kube_client)

    def generated(*a: Any, **kw: Any) -> Any:
        raise AssertionError("the generated method was used")

    store.api.patch_node = generated  # type: ignore[method-assign]
    store.api.patch_node_status = generated  # type: ignore[method-assign]
    assert store.patch_annotations("n1", {"a/b": "c"}, "").annotations == {"a/b": "c"}
    store.patch_condition("n1", {"type": "GPUHealthy", "status": "True"})


def test_the_raw_sender_takes_2xx_only_and_keeps_its_timeout(kubeapi: FakeKubeAPI, kube_client: ApiClient) -> None:
    kubeapi.add_node("n1")
    send = annotate._raw_sender(kube_client)
    assert send is not None
    kubeapi.inject("PATCH", r"/nodes/n1$", 299)
    resp = send("PATCH", "/api/v1/nodes/n1", b"{}", annotate.MERGE_PATCH, 5)  # any 2xx is an answer
    assert resp.status == 299 and json.loads(resp.data)["code"] == 299
    resp.release_conn()
    kubeapi.inject("PATCH", r"/nodes/n1$", 300)
    with pytest.raises(ApiException) as err:
        send("PATCH", "/api/v1/nodes/n1", b"{}", annotate.MERGE_PATCH, 5)
    assert err.value.status == 300
    kubeapi.inject("PATCH", r"/nodes/n1$", None, delay=3.0)  # a server that stalls past the timeout
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):  # a PATCH is sent once: no retry wraps it
        send("PATCH", "/api/v1/nodes/n1", b"{}", annotate.MERGE_PATCH, 0.3)
