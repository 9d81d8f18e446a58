"""Node reads and annotation patches with the official ``kubernetes`` client.

One JSON merge patch per changed node (``application/merge-patch+json``), carrying the
``resourceVersion`` it was computed from, so a concurrent change to the node makes the API
server answer 409 instead of us overwriting it: we then read the node again, recompute
and retry. Responses are read as raw JSON (``_preload_content=False``): deserialising
1,000 Node models costs seconds we do not need to spend.

RBAC the profiler needs on ``nodes`` (cluster scope): ``list`` (one per cycle), ``get``
(after a conflict) and ``patch``. A 403 names the missing verb.
"""

from __future__ import annotations

import json
import logging
import random
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# error kinds (label values of gpu_profiler_errors_total)
KUBE_FORBIDDEN = "kube_forbidden"
KUBE_CONFLICT = "kube_conflict"  # still conflicting after the retries
KUBE_SERVER = "kube_server_error"
KUBE_UNREACHABLE = "kube_unreachable"
KUBE_REJECTED = "kube_rejected"  # 4xx other than 403/404/409: our patch is wrong
KUBE_BAD_RESPONSE = "kube_bad_response"
KINDS = (KUBE_FORBIDDEN, KUBE_CONFLICT, KUBE_SERVER, KUBE_UNREACHABLE, KUBE_REJECTED, KUBE_BAD_RESPONSE)

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class KubeError(Exception):
    """An API call failed for good; ``kind`` is one of :data:`KINDS`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class NodeGone(Exception):
    """404: the node was deleted since we listed it."""


class Conflict(Exception):
    """409: the node changed since we read it."""


@dataclass
class NodeInfo:
    name: str
    annotations: dict[str, str]
    resource_version: str
    condition: dict[str, str] | None = None  # its GPUHealthy condition (health.py), if any


def _node_info(obj: Any, keep: str | None = None) -> NodeInfo:
    """``keep``: only annotations whose key starts with it (ours): the plan reads nothing else,
    and 10,000 nodes' foreign annotations would cost tens of MiB."""
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        raise KubeError(KUBE_BAD_RESPONSE, "API server answered something that is not a Node")
    meta = obj["metadata"]
    ann = meta.get("annotations") or {}
    if not isinstance(ann, dict):
        raise KubeError(KUBE_BAD_RESPONSE, "a Node's annotations are not an object")
    return NodeInfo(name=str(meta.get("name", "")),
                    annotations={str(k): str(v) for k, v in ann.items() if keep is None or str(k).startswith(keep)},
                    resource_version=str(meta.get("resourceVersion", "")), condition=_condition(obj))


def _condition(obj: dict[str, Any], kind: str = "GPUHealthy") -> dict[str, str] | None:
    """The node's ``kind`` condition (strings only), None without one."""
    status = obj.get("status")
    conds = status.get("conditions") if isinstance(status, dict) else None
    for c in conds if isinstance(conds, list) else ():
        if isinstance(c, dict) and c.get("type") == kind:
            return {str(k): str(v) for k, v in c.items() if isinstance(v, str)}
    return None


_VERBS = {"GET": "get", "PATCH": "patch", "LIST": "list"}


class NodeStore:
    """Nodes through a ``kubernetes.client.ApiClient`` (built by the caller from a kubeconfig
    or the in-cluster service account)."""

    def __init__(self, api_client: Any, timeout: float = 10.0, retries: int = 3, backoff: float = 0.5,
                 label_selector: str | None = None, sleep: Callable[[float], None] = time.sleep,
                 keep_prefix: str | None = None) -> None:
        from kubernetes import client

        self.api = client.CoreV1Api(api_client)
        self._send = _raw_sender(api_client)
        self.timeout = timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self.label_selector = label_selector
        self.keep = keep_prefix + "/" if keep_prefix else None
        self._sleep = sleep
        self.requests_sent = 0

    # ---- calls with retries ----

    def _call(self, verb: str, what: str, fn: Callable[[], Any]) -> Any:
        """Run one API call: 5xx/429 and connection errors retried with backoff and jitter."""
        from kubernetes.client.exceptions import ApiException

        last: KubeError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(random.uniform(0, self.backoff * 2 ** (attempt - 1)))
            self.requests_sent += 1
            try:
                resp = fn()
                try:
                    raw = resp.data
                finally:
                    resp.release_conn()
                return json.loads(raw)
            except ApiException as exc:
                status = int(exc.status or 0)
                if status == 404:
                    raise NodeGone(what) from None
                if status == 409:
                    raise Conflict(what) from None
                if status == 403:
                    raise KubeError(KUBE_FORBIDDEN, (
                        f"forbidden to {_VERBS.get(verb, verb.lower())} {what}: the profiler's service account "
                        f"needs RBAC verb '{_VERBS.get(verb, verb.lower())}' on 'nodes' (ClusterRole rules: "
                        f"apiGroups [''], resources ['nodes'], verbs ['get', 'list', 'patch'])"
                    )) from None
                if status >= 500 or status == 429:
                    last = KubeError(KUBE_SERVER, f"{verb} {what}: HTTP {status} {_reason(exc)}")
                    continue
                if status == 0:  # the client's own failure (TLS): str(exc) spans lines, the reason does not
                    last = KubeError(KUBE_UNREACHABLE, f"{verb} {what}: {_reason(exc)}")
                    continue
                raise KubeError(KUBE_REJECTED, f"{verb} {what}: HTTP {status} {_reason(exc)}") from None
            except ValueError as exc:
                raise KubeError(KUBE_BAD_RESPONSE, f"{verb} {what}: answer is not JSON ({exc})") from None
            except Exception as exc:  # noqa: BLE001 - urllib3 MaxRetryError, timeouts, resets
                last = KubeError(KUBE_UNREACHABLE, f"{verb} {what}: {type(exc).__name__}: {exc}")
        assert last is not None
        raise last

    # ---- public ----

    def list_nodes(self) -> dict[str, NodeInfo]:
        """Every node (optionally filtered by the label selector), paginated by 500."""
        out: dict[str, NodeInfo] = {}
        cont: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": 500, "_preload_content": False,
                                      "_request_timeout": self.timeout}
            if cont:
                kwargs["_continue"] = cont
            if self.label_selector:
                kwargs["label_selector"] = self.label_selector
            def call(kw: dict[str, Any] = kwargs) -> Any:
                return self.api.list_node(**kw)

            try:
                doc = self._call("LIST", "nodes", call)
            except (NodeGone, Conflict) as exc:
                raise KubeError(KUBE_SERVER, f"listing nodes: unexpected {type(exc).__name__}") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
                raise KubeError(KUBE_BAD_RESPONSE, "node list without items")
            for item in doc["items"]:
                ni = _node_info(item, self.keep)
                out[ni.name] = ni
            cont = (doc.get("metadata") or {}).get("continue")
            if not cont:
                return out

    def get_node(self, name: str) -> NodeInfo | None:
        """The node now, or None if it no longer exists."""
        try:
            doc = self._call("GET", f"node {name}", lambda: self.api.read_node(
                name, _preload_content=False, _request_timeout=self.timeout))
        except NodeGone:
            return None
        except Conflict:
            raise KubeError(KUBE_SERVER, f"GET node {name}: unexpected 409") from None
        return _node_info(doc, self.keep)

    def patch_annotations(self, name: str, annotations: dict[str, str | None], resource_version: str) -> NodeInfo:
        """Send one merge patch; raises Conflict (409), NodeGone (404) or KubeError."""
        body: dict[str, Any] = {"metadata": {"annotations": annotations}}
        if resource_version:
            body["metadata"]["resourceVersion"] = resource_version
        doc = self._call("PATCH", f"node {name}", self._patcher(name, "", body, MERGE_PATCH, self.api.patch_node))
        return _node_info(doc, self.keep)

    def _patcher(self, name: str, sub: str, body: dict[str, Any], content_type: str,
                 generated: Callable[..., Any]) -> Callable[[], Any]:
        """One PATCH of node ``name`` (``sub``: "" or "/status"): through the client's own
        connection pool when it has one (:func:`_raw_sender`), else the generated method."""
        send = self._send
        if send is None:
            return lambda: generated(name, body, _content_type=content_type, _preload_content=False,
                                     _request_timeout=self.timeout)
        path = f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}{sub}"
        data = json.dumps(body).encode()
        return lambda: send("PATCH", path, data, content_type, self.timeout)


    def patch_condition(self, name: str, condition: dict[str, str]) -> None:
        """One strategic merge patch of ``nodes/{name}/status`` setting this condition: the
        conditions list merges by ``type``, so no other condition is touched (a JSON merge patch
        would replace the whole list). RBAC: ``patch`` on ``nodes/status``."""
        body = {"status": {"conditions": [condition]}}
        try:
            self._call("PATCH", f"node {name} status", self._patcher(name, "/status", body, STRATEGIC_MERGE_PATCH,
                                                                    self.api.patch_node_status))
        except KubeError as exc:
            if exc.kind != KUBE_FORBIDDEN:
                raise
            raise KubeError(KUBE_FORBIDDEN, (
                f"forbidden to patch node {name} status: the profiler's service account needs RBAC verb 'patch' "
                "on 'nodes/status' (ClusterRole rule: apiGroups [''], resources ['nodes/status'], verbs "
                "['patch']), and its admission policy must allow the GPUHealthy condition")) from None


def _reason(exc: Any) -> str:
    try:
        doc = json.loads(exc.body)
        return str(doc.get("message") or exc.reason)
    except Exception:  # noqa: BLE001 - the body is only a detail
        return str(getattr(exc, "reason", ""))


def _raw_sender(api_client: Any) -> Callable[[str, str, bytes, str, float], Any] | None:
    """A request function over the client's own urllib3 pool, or None when this version of the
    kubernetes client has no ``rest_client.pool_manager`` (then the generated methods are used).

    The node patches are most of a first cycle's requests (two per node), and the generated
    methods validate their arguments (pydantic, per call) and serialise the body through the
    model layer before urllib3 sees it: 0.2 of 0.6 ms of CPU a patch. This sends the same
    request: the client's host, pool (TLS, client certificates, proxy), default headers
    (User-Agent) and credential headers, and raises ``ApiException`` for any status outside
    2xx, as the generated methods do, so errors are handled in one place (``NodeStore._call``).
    """
    try:
        cfg = api_client.configuration
        request = api_client.rest_client.pool_manager.request
        defaults = api_client.default_headers
        cfg.auth_settings  # noqa: B018 - probed once: every version since 29 has them
        cfg.host  # noqa: B018
    except AttributeError:
        return None
    import urllib3
    from kubernetes.client.exceptions import ApiException

    def send(method: str, path: str, body: bytes, content_type: str, timeout: float) -> Any:
        headers = {**defaults, "Accept": "application/json", "Content-Type": content_type}
        for auth in cfg.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        resp = request(method, cfg.host + path, body=body, headers=headers,
                       timeout=urllib3.Timeout(total=timeout), preload_content=False)
        if not 200 <= resp.status <= 299:
            try:
                exc = ApiException(status=resp.status, reason=resp.reason)
                exc.body = resp.data
            finally:
                resp.release_conn()
            raise exc
        return resp

    return send


