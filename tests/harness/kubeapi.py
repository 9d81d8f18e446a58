"""A small fake Kubernetes API server (Nodes only) for the real ``kubernetes`` Python client.

No kube-apiserver can be installed on the development machines, so the profiler's Node
writes are tested against this HTTP server on 127.0.0.1. It emulates what matters for them:

* ``GET /api/v1/nodes`` (``labelSelector``, ``fieldSelector=metadata.name=...``, ``limit`` and
  ``continue``), ``GET /api/v1/nodes/{name}``, ``PUT`` and ``PATCH /api/v1/nodes/{name}``.
* PATCH as ``application/merge-patch+json`` (RFC 7386, ``null`` deletes a key),
  ``application/strategic-merge-patch+json`` (maps merge like a merge patch, lists are
  replaced; ``$setElementOrder/...`` keys are ignored, other ``$`` directives are refused)
  and ``application/json-patch+json`` (RFC 6902: add, remove, replace, move, copy, test;
  ``~1`` escapes ``/``). Server-side apply is refused with 415.
* ``GET`` and ``PATCH /api/v1/nodes/{name}/status`` (all three patch types; a strategic merge
  merges ``status.conditions`` by ``type``); a status patch that changes anything but the
  ``GPUHealthy`` condition is refused with 403, as the profiler's admission policy refuses it.
* ``metadata.resourceVersion`` is a server-wide counter bumped on every write that changes the
  object (a no-op patch does not bump it, like the real server). A patch or PUT carrying a
  different ``resourceVersion`` gets 409 Conflict: optimistic concurrency.
* The real server's validation of what the profiler writes: label and annotation keys
  (``prefix/name``, DNS subdomain prefix, name at most 63 characters), label values, string
  values only, and at most 256 KiB of annotations per object (422 Invalid / 400 BadRequest).
* Errors are ``Status`` objects with ``reason`` and ``code``, so ``ApiException`` parses them.
* A bearer token (``test-token``) is required; anything else gets 401.

Namespaced objects, for leader election and Events: ``coordination.k8s.io/v1`` Leases
(``/apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]``) and core ``v1`` Events
(``/api/v1/namespaces/{ns}/events[/{name}]``): create (POST, 409 AlreadyExists), get, list,
update (PUT, 409 on a stale ``resourceVersion``) and merge/strategic patch. Each request's
RBAC verb and resource are on :class:`RecordedRequest` (``verb``, ``resource``).

Test controls: :meth:`FakeKubeAPI.add_node`, :meth:`~FakeKubeAPI.node`,
:meth:`~FakeKubeAPI.edit_node` (another writer), :meth:`~FakeKubeAPI.delete_node`,
:meth:`~FakeKubeAPI.inject` (fail or stall matching requests), :attr:`~FakeKubeAPI.requests`
and :meth:`~FakeKubeAPI.patches` (what the client sent), :meth:`~FakeKubeAPI.kubeconfig`.

Retries inside the client (kubernetes 37, measured): a GET answered 429 or 503 *with* a
``Retry-After`` header is retried up to 3 times after that delay (4 requests in all); without
the header it is not. A GET or PUT whose read times out is retried by urllib3 up to 3 times
(then ``MaxRetryError``); a PATCH is sent once (``ReadTimeoutError``). Count requests with
that in mind. Watches of Nodes are not supported (400).

List + watch collections (``_WATCHABLE``; Pods at ``/api/v1/pods``): list and ``watch=true`` with
``fieldSelector`` on any dotted path (``spec.nodeName=...``), ``labelSelector``, ``resourceVersion``
(none or ``0``: the current objects as ADDED first) and ``timeoutSeconds``; events are chunked JSON
lines. :meth:`~FakeKubeAPI.add_pod`, :meth:`~FakeKubeAPI.delete_pod`, :meth:`~FakeKubeAPI.put_object`,
:meth:`~FakeKubeAPI.delete_object`; :meth:`~FakeKubeAPI.expire_watches` ends open watches and
answers older resourceVersions with 410 Expired.

DRA ResourceSlices are list + watch collections too, one per ``resource.k8s.io`` version
(``/apis/resource.k8s.io/{v1,v1beta2,v1beta1}/resourceslices``):
:meth:`~FakeKubeAPI.put_resource_slice` (v1 shape) stores a slice in every version's shape
(v1beta1 wraps device fields in ``basic``), :meth:`~FakeKubeAPI.delete_resource_slice` removes it;
only the versions in :attr:`~FakeKubeAPI.slice_versions` are served (others 404, as on a
1.32 server with ``("v1beta1",)``).

Discovery of ``resource.k8s.io`` (``GET /apis/resource.k8s.io``: the APIGroup;
``GET /apis/resource.k8s.io/{version}``: its APIResourceList) and cluster-scoped
``DeviceTaintRule`` objects (``/apis/resource.k8s.io/{version}/devicetaintrules[/{name}]``: list
with ``labelSelector``, create, get, merge patch, delete), served in the versions of
:attr:`~FakeKubeAPI.taint_rule_versions` only (``()``: the ``DRADeviceTaintRules`` gate off, the
resource absent from discovery and 404). Their shape is checked as the real server checks it
(kubernetes/api resource/v1beta2 and v1alpha3 types.go at 10b39a39: ``spec.deviceSelector``
holds only ``driver``, ``pool``, ``device``; ``spec.taint`` needs a label-name ``key``, a
label-value ``value`` and ``effect`` None, NoSchedule or NoExecute; ``timeAdded`` is set when
absent); anything else is 422. :meth:`~FakeKubeAPI.taint_rules` lists them.
"""

from __future__ import annotations

import base64
import copy
import http.server
import json
import marshal
import re
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self

TOKEN = "test-token"


def _clone(value: Any) -> Any:
    """A deep copy of JSON-like data. marshal's round trip copies dicts, lists, strings and
    numbers exactly, in C: ``copy.deepcopy`` made a third of this server's CPU per request
    (five copies of a node each), which the profiler benchmark's cores paid for. Anything
    marshal does not take (a subclass, an object) goes through deepcopy."""
    try:
        return marshal.loads(marshal.dumps(value))
    except ValueError:
        return copy.deepcopy(value)
MAX_ANNOTATIONS_BYTES = 256 * 1024

JsonObj = dict[str, Any]

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_HTTP_PHRASES = {s.value: s.phrase for s in http.HTTPStatus}

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
_NODE_PATH = re.compile(r"/api/v1/nodes/([^/]+)\Z")
_NODE_STATUS_PATH = re.compile(r"/api/v1/nodes/([^/]+)/status\Z")
_NAMESPACED = re.compile(
    r"/(?:api/v1|apis/(?P<group>coordination\.k8s\.io)/v1)/namespaces/(?P<ns>[^/]+)/(?P<res>leases|events)"
    r"(?:/(?P<name>[^/]+))?\Z")
_KINDS = {"leases": ("Lease", "coordination.k8s.io/v1"), "events": ("Event", "v1")}
_TAINT_RULES = re.compile(r"/apis/resource\.k8s\.io/(?P<v>[^/]+)/devicetaintrules(?:/(?P<name>[^/]+))?\Z")
_RESOURCE_VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")  # resource.k8s.io, newest first
_TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")  # DeviceTaintEffect
_DNS_LABEL_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


class ApiError(Exception):
    """Raised inside the server to answer with a Status object."""

    def __init__(self, code: int, message: str, name: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.name = name
        self.reason = reason or _REASONS.get(code, "Unknown")

    def status(self) -> JsonObj:
        doc: JsonObj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.name is not None:
            doc["details"] = {"name": self.name, "kind": "nodes"}
        return doc


@dataclass
class RecordedRequest:
    """One request as the server saw it. ``status`` is filled in once it has been answered."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: Any  # parsed JSON, the raw text if it was not JSON, None without a body
    headers: dict[str, str]
    time: float
    status: int | None = None
    injected: bool = False

    @property
    def node(self) -> str | None:
        """The node name for ``/api/v1/nodes/{name}``, else None."""
        m = _NODE_PATH.match(self.path)
        return urllib.parse.unquote(m.group(1)) if m else None

    @property
    def resource(self) -> str:
        """``nodes``, ``leases``, ``events`` or the path."""
        if self.path == "/api/v1/nodes" or _NODE_PATH.match(self.path):
            return "nodes"
        if _TAINT_RULES.match(self.path):
            return "devicetaintrules"
        if _NODE_STATUS_PATH.match(self.path):
            return "nodes/status"
        if self.path in _WATCHABLE:
            return self.path.rsplit("/", 1)[1]
        m = _NAMESPACED.match(self.path)
        return m.group("res") if m else self.path

    @property
    def verb(self) -> str:
        """The RBAC verb of this request (get, list, create, update, patch, delete)."""
        if self.path in _WATCHABLE and self.method == "GET":
            return "watch" if self.query.get("watch") in ("true", "1") else "list"
        one = self.path != "/api/v1/nodes" and not (
            (m := _NAMESPACED.match(self.path)) is not None and m.group("name") is None) and not (
            (t := _TAINT_RULES.match(self.path)) is not None and t.group("name") is None)
        return {"GET": "get" if one else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete"}.get(self.method, self.method.lower())


@dataclass
class _Injection:
    method: str
    path: re.Pattern[str]
    status: int | None
    remaining: int
    delay: float
    headers: dict[str, str] = field(default_factory=dict)


# ---- patch semantics --------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return _clone(patch)
    result = _clone(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


def _strip_strategic_directives(patch: Any, where: str = "") -> Any:
    if not isinstance(patch, dict):
        return patch
    out = {}
    for k, v in patch.items():
        if k.startswith("$setElementOrder/"):
            continue  # only orders list elements; our lists are replaced wholesale
        if k.startswith("$"):
            raise ApiError(400, f"fake API server: strategic merge directive {k!r} at {where or '/'} unsupported")
        out[k] = _strip_strategic_directives(v, f"{where}/{k}")
    return out


def _merge_conditions(current: JsonObj, patch: JsonObj) -> JsonObj:
    """A strategic merge patch: as a merge patch, except ``status.conditions``, which merges by its
    patch merge key ``type`` (NodeStatus: ``patchMergeKey=type``) instead of being replaced."""
    conds = (patch.get("status") or {}).get("conditions") if isinstance(patch.get("status"), dict) else None
    if not isinstance(conds, list):
        return dict(merge_patch(current, patch))
    rest = {**patch, "status": {k: v for k, v in patch["status"].items() if k != "conditions"}}
    out = dict(merge_patch(current, rest))
    merged = [dict(c) for c in (out.get("status") or {}).get("conditions") or []]
    for c in conds:
        if not isinstance(c, dict) or "type" not in c:
            raise ApiError(400, "status.conditions: an element without its merge key 'type'")
        same = next((m for m in merged if m.get("type") == c["type"]), None)
        if same is None:
            merged.append(_clone(c))
        else:
            updated = merge_patch(dict(same), c)
            same.clear()
            same.update(updated)
    out.setdefault("status", {})["conditions"] = merged
    return out


def status_refusal(old: JsonObj, new: JsonObj, condition: str = "GPUHealthy") -> str | None:
    """Why the profiler's admission policy refuses this status update (None: admitted): of the
    status it may change the ``GPUHealthy`` condition and nothing else (the policy's metadata
    rules are the annotation patches' and are not repeated here)."""
    def others(node: JsonObj) -> list[Any]:
        return [c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") != condition]

    if others(new) != others(old):
        return f"the profiler may change only the {condition} condition of a Node's status"
    rest_new = {k: v for k, v in (new.get("status") or {}).items() if k != "conditions"}
    rest_old = {k: v for k, v in (old.get("status") or {}).items() if k != "conditions"}
    if rest_new != rest_old:
        return "the profiler may not change a Node's capacity, addresses or any other status field"
    return None


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"json patch path {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    cur = doc
    for p in parts[:-1]:
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
        else:
            raise ApiError(422, f"json patch: path {path!r} does not exist (missing {p!r})")
    return cur


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise ApiError(422, f"json patch: path {path!r} does not exist")


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return _clone(value)
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = _clone(value)
    elif isinstance(parent, list):
        idx = len(parent) if last == "-" else int(last) if last.isdigit() else -1
        if not 0 <= idx <= len(parent):
            raise ApiError(422, f"json patch: bad array index in {path!r}")
        parent.insert(idx, _clone(value))
    else:
        raise ApiError(422, f"json patch: cannot add below a scalar at {path!r}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise ApiError(422, "json patch: cannot remove the whole object")
    _get(doc, path)  # raises when missing, like the real server
    parent = _parent(doc, parts, path)
    if isinstance(parent, dict):
        del parent[parts[-1]]
    else:
        del parent[int(parts[-1])]
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 on a copy of ``doc``; a failing op (including ``test``) aborts the whole patch."""
    if not isinstance(ops, list):
        raise ApiError(400, "json patch body must be a list of operations")
    doc = _clone(doc)
    for i, op in enumerate(ops):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, f"json patch operation {i} needs 'op' and 'path': {op!r}")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise ApiError(400, f"json patch operation {i} ({kind} {path}) needs 'value'")
        if kind == "add":
            doc = _add(doc, path, op["value"])
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = _add(_remove(doc, path), path, op["value"]) if _pointer(path) else op["value"]
        elif kind in ("move", "copy"):
            value = _clone(_get(doc, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise ApiError(422, f"json patch test operation {i} failed: {path} is not {op['value']!r}")
        else:
            raise ApiError(400, f"json patch operation {i}: unknown op {kind!r}")
    return doc


# ---- validation -------------------------------------------------------------------------


def _key_error(key: str) -> str | None:
    prefix, sep, name = key.rpartition("/")
    if sep and not (prefix and len(prefix) <= 253 and _DNS_SUBDOMAIN.match(prefix)):
        return "prefix part must be a lowercase DNS subdomain of at most 253 characters"
    if not name or len(name) > 63 or not _NAME_PART.match(name):
        return (
            "name part must be at most 63 characters: alphanumerics, '-', '_' or '.', "
            "starting and ending with an alphanumeric"
        )
    return None


def validate_node(node: JsonObj) -> None:
    """Raise ApiError as the real server would for the fields the profiler writes."""
    meta = node.get("metadata")
    if not isinstance(meta, dict):
        raise ApiError(400, "metadata must be an object")
    name = meta.get("name", "")
    for fld in ("labels", "annotations"):
        m = meta.get(fld) or {}
        if not isinstance(m, dict):
            raise ApiError(400, f"metadata.{fld} must be an object of strings, got {type(m).__name__}")
        for k, v in m.items():
            if not isinstance(v, str):
                raise ApiError(400, f"metadata.{fld}[{k!r}]: cannot unmarshal {type(v).__name__} into a string", name)
            err = _key_error(k)
            if err:
                raise ApiError(422, f'Node "{name}" is invalid: metadata.{fld}: Invalid value: "{k}": {err}', name)
            if fld == "labels" and (len(v) > 63 or not _LABEL_VALUE.match(v)):
                raise ApiError(
                    422,
                    f'Node "{name}" is invalid: metadata.labels: Invalid value: "{v}": a label value must be '
                    "at most 63 characters: alphanumerics, '-', '_' or '.', starting and ending with one",
                    name,
                )
    size = sum(len(k) + len(v) for k, v in (meta.get("annotations") or {}).items())
    if size > MAX_ANNOTATIONS_BYTES:
        raise ApiError(
            422,
            f'Node "{name}" is invalid: metadata.annotations: Too long: must have at most '
            f"{MAX_ANNOTATIONS_BYTES} bytes",
            name,
        )


# ---- selectors --------------------------------------------------------------------------

_REQ = re.compile(
    r"\s*(?:(?P<not>!)\s*(?P<nkey>[^\s!=,()]+)"
    r"|(?P<key>[^\s!=,()]+)\s*(?:(?P<op>==|!=|=)\s*(?P<val>[^\s!=,()]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<set>[^()]*)\))?)\s*(?:,|\Z)"
)


def label_selector(expr: str) -> Callable[[Mapping[str, str]], bool]:
    """Compile a label selector (``a=b,c!=d,e,!f,g in (x,y),h notin (z)``) to a predicate."""
    reqs: list[tuple[str, str, frozenset[str]]] = []  # (operator, key, values)
    pos = 0
    expr = expr.strip()
    while pos < len(expr):
        m = _REQ.match(expr, pos)
        if not m or m.end() == pos:
            raise ApiError(400, f"unable to parse requirement in labelSelector {expr!r} at {expr[pos:]!r}")
        pos = m.end()
        if m["nkey"]:
            reqs.append(("!", m["nkey"], frozenset()))
        elif m["op"]:
            reqs.append(("!=" if m["op"] == "!=" else "=", m["key"], frozenset([m["val"]])))
        elif m["setop"]:
            reqs.append((m["setop"], m["key"], frozenset(v.strip() for v in m["set"].split(","))))
        else:
            reqs.append(("exists", m["key"], frozenset()))

    def matches(labels: Mapping[str, str]) -> bool:
        for op, key, values in reqs:
            ok = {
                "!": key not in labels,
                "exists": key in labels,
                "=": labels.get(key) in values,
                "in": labels.get(key) in values,
                "!=": labels.get(key) not in values,
                "notin": labels.get(key) not in values,
            }[op]
            if not ok:
                return False
        return True

    return matches


def _field_selector(expr: str) -> Callable[[JsonObj], bool]:
    reqs: list[tuple[str, bool]] = []  # (name, negated)
    for term in filter(None, (t.strip() for t in expr.split(","))):
        m = re.fullmatch(r"metadata\.name\s*(==|!=|=)\s*(.*)", term)
        if not m:
            raise ApiError(400, f'field label not supported by the fake: "{term}"')
        reqs.append((m[2], m[1] == "!="))
    return lambda node: all((node["metadata"]["name"] == want) != neg for want, neg in reqs)


# ---- the server -------------------------------------------------------------------------


class FakeKubeAPI:
    """The fake API server. Use as a context manager (``start()``/``stop()`` also work)."""

    def __init__(self, token: str | None = TOKEN) -> None:
        self.token = token
        self._lock = threading.RLock()
        self._nodes: dict[str, JsonObj] = {}
        self._objects: dict[tuple[str, str, str], JsonObj] = {}  # (resource, namespace, name)
        self._rv = 0
        self._requests: list[RecordedRequest] = []
        self._injections: list[_Injection] = []
        self._watched: dict[str, dict[str, JsonObj]] = {p: {} for p in _WATCHABLE}  # list path -> uid -> obj
        self.slice_versions: tuple[str, ...] = ("v1", "v1beta1")  # resource.k8s.io versions served
        # resource.k8s.io versions serving devicetaintrules: () is the DRADeviceTaintRules gate off
        self.taint_rule_versions: tuple[str, ...] = ("v1beta2", "v1alpha3")
        self._taint_rules: dict[str, JsonObj] = {}
        self._watch_log: list[tuple[int, str, str, JsonObj]] = []  # (rv, list path, event type, object)
        self._compacted = 0  # watches from a resourceVersion below this get 410 Expired
        self._changed = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        # a client killed mid-request (the leader-election test does that) is not a fake's error
        self._server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----

    def start(self) -> Self:
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-kubeapi", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; stalled (delayed) requests are released and open connections cut."""
        self._stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(10)
            self._thread = None
        self._server.server_close()
        with self._lock:
            conns = list(self._connections)
        for c in conns:  # keep-alive connections would otherwise still be served
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig for this server (bearer-token user) to ``path`` and return it.

        It is for a command's ``--kubeconfig`` or ``KUBECONFIG``; a test that wants a client in process
        takes the ``kube_client`` fixture (tests/conftest.py), which is built from it.
        """
        user: JsonObj = {"token": self.token} if self.token else {}
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake-user", "user": user}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake-user"}}],
            "current-context": "fake",
        }
        path = Path(path)
        path.write_text(json.dumps(cfg, indent=2))  # JSON is valid YAML
        return path

    # ---- test controls ----

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def add_node(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        capacity: Mapping[str, str] | None = None,
        conditions: list[JsonObj] | None = None,
    ) -> JsonObj:
        """Create a Node (``capacity`` e.g. ``{"nvidia.com/gpu": "8"}``, status ``conditions``); return a copy."""
        node: JsonObj = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "labels": dict(labels or {}),
                "annotations": dict(annotations or {}),
            },
            "spec": {},
            "status": {"capacity": dict(capacity or {}), "allocatable": dict(capacity or {})},
        }
        if conditions:
            node["status"]["conditions"] = _clone(conditions)
        validate_node(node)
        with self._lock:
            if name in self._nodes:
                raise ValueError(f"node {name!r} already exists")
            node["metadata"]["resourceVersion"] = self._next_rv()
            self._nodes[name] = node
            return _clone(node)

    def node(self, name: str) -> JsonObj:
        """A copy of the stored Node; KeyError if there is none."""
        with self._lock:
            return _clone(self._nodes[name])

    def nodes(self) -> list[str]:
        with self._lock:
            return sorted(self._nodes)

    def edit_node(
        self,
        name: str,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> JsonObj:
        """Change a Node as another writer would (merge semantics, None deletes; bumps resourceVersion)."""
        patch: JsonObj = {"metadata": {}}
        if labels is not None:
            patch["metadata"]["labels"] = dict(labels)
        if annotations is not None:
            patch["metadata"]["annotations"] = dict(annotations)
        with self._lock:
            new = merge_patch(self._nodes[name], patch)
            validate_node(new)
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._nodes[name] = new
            return _clone(new)

    def delete_node(self, name: str) -> None:
        with self._lock:
            del self._nodes[name]
            self._rv += 1

    def inject(
        self,
        method: str,
        path_regex: str,
        status: int | None,
        times: int = 1,
        delay: float = 0.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Answer the next ``times`` requests matching ``method`` (``"*"`` for any) and ``path_regex``
        (``re.search`` on the path, query excluded) with a ``status`` Status object, after waiting
        ``delay`` s. ``status=None`` only delays, then serves normally (a slow server).
        """
        with self._lock:
            self._injections.append(
                _Injection(method.upper(), re.compile(path_regex), status, times, delay, dict(headers or {}))
            )

    def clear_injections(self) -> None:
        """Forget injections not used up yet."""
        with self._lock:
            self._injections.clear()

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, in arrival order (a copy of the list)."""
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def patches(self, node: str | None = None) -> list[RecordedRequest]:
        """The PATCH requests received, optionally only those for one node."""
        return [r for r in self.requests if r.method == "PATCH" and (node is None or r.node == node)]

    # ---- request handling ----

    def _take_injection(self, method: str, path: str) -> _Injection | None:
        with self._lock:
            for inj in self._injections:
                if inj.remaining > 0 and inj.method in ("*", method) and inj.path.search(path):
                    inj.remaining -= 1
                    return inj
        return None

    def objects(self, resource: str, namespace: str | None = None) -> list[JsonObj]:
        """Copies of the stored Leases or Events (``resource``), optionally of one namespace."""
        with self._lock:
            return [_clone(o) for (r, ns, _), o in sorted(self._objects.items())
                    if r == resource and namespace in (None, ns)]

    def _namespaced(self, method: str, m: re.Match[str], ctype: str | None, body: Any) -> JsonObj:
        res, ns, name = m.group("res"), urllib.parse.unquote(m.group("ns")), m.group("name")
        kind, api_version = _KINDS[res]
        with self._lock:
            if name is None:
                if method == "GET":
                    items = [_clone(o) for (r, n, _), o in sorted(self._objects.items()) if r == res and n == ns]
                    return {"kind": kind + "List", "apiVersion": api_version,
                            "metadata": {"resourceVersion": str(self._rv)}, "items": items}
                if method != "POST":
                    raise ApiError(405, f"fake API server: {method} on {res} is not supported")
                if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
                    raise ApiError(400, f"{kind} body must be an object with metadata")
                obj_name = body["metadata"].get("name")
                if not obj_name or not isinstance(obj_name, str):
                    raise ApiError(422, f"{kind} needs metadata.name")
                key = (res, ns, obj_name)
                if key in self._objects:
                    raise ApiError(409, f'{res} "{obj_name}" already exists', obj_name, reason="AlreadyExists")
                obj = _clone(body)
                obj["kind"], obj["apiVersion"] = kind, api_version
                obj["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), resourceVersion=self._next_rv(),
                                       creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
                self._objects[key] = obj
                return _clone(obj)
            key = (res, ns, urllib.parse.unquote(name))
            current = self._objects.get(key)
            if current is None:
                raise ApiError(404, f'{res} "{key[2]}" not found', key[2])
            if method == "GET":
                return _clone(current)
            if method == "PUT":
                if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
                    raise ApiError(400, f"PUT body must be a {kind} object")
                if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                    raise ApiError(409, f'Operation cannot be fulfilled on {res} "{key[2]}": the object has been '
                                        "modified; please apply your changes to the latest version and try again",
                                   key[2])
                new = _clone(body)
            elif method == "PATCH":
                new = self._patched(current, ctype, body)
            else:
                raise ApiError(405, f"fake API server: {method} on {res} is not supported")
            for k in ("name", "namespace", "uid", "creationTimestamp"):
                new["metadata"][k] = current["metadata"][k]
            new["kind"], new["apiVersion"] = kind, api_version
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._objects[key] = new
            return _clone(new)

    # ---- resource.k8s.io discovery and DeviceTaintRules ----

    def taint_rules(self) -> list[JsonObj]:
        """Copies of the stored DeviceTaintRules, by name."""
        with self._lock:
            return [_clone(o) for _, o in sorted(self._taint_rules.items())]

    def _resource_group(self, method: str, path: str, query: Mapping[str, str], ctype: str | None,
                        body: Any) -> Any:
        served = [v for v in _RESOURCE_VERSIONS if v in self.slice_versions or v in self.taint_rule_versions]
        if method == "GET" and path.rstrip("/") == "/apis/resource.k8s.io":
            versions = [{"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in served]
            return {"kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io", "versions": versions,
                    "preferredVersion": versions[0] if versions else None}
        version = path[len(_SLICES):].rstrip("/")
        if method == "GET" and "/" not in version:
            if version not in served:
                raise ApiError(404, f"the server could not find the requested resource ({method} {path})")
            verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
            res = []
            if version in self.slice_versions:
                res.append({"name": "resourceslices", "singularName": "resourceslice", "namespaced": False,
                            "kind": "ResourceSlice", "verbs": verbs})
            if version in self.taint_rule_versions:
                res.append({"name": "devicetaintrules", "singularName": "devicetaintrule", "namespaced": False,
                            "kind": "DeviceTaintRule", "verbs": verbs})
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"resource.k8s.io/{version}",
                    "resources": res}
        m = _TAINT_RULES.match(path)
        if m is None or m["v"] not in self.taint_rule_versions:
            raise ApiError(404, f"the server could not find the requested resource ({method} {path})")
        api_version = f"resource.k8s.io/{m['v']}"
        name = urllib.parse.unquote(m["name"]) if m["name"] else None
        with self._lock:
            if name is None:
                if method == "GET":
                    sel = label_selector(query.get("labelSelector", ""))
                    items = [dict(_clone(o), apiVersion=api_version) for _, o in sorted(self._taint_rules.items())
                             if sel(o["metadata"].get("labels") or {})]
                    return {"kind": "DeviceTaintRuleList", "apiVersion": api_version,
                            "metadata": {"resourceVersion": str(self._rv)}, "items": items}
                if method != "POST":
                    raise ApiError(405, f"fake API server: {method} on devicetaintrules is not supported")
                obj = _clone(body) if isinstance(body, dict) else None
                _check_taint_rule(obj)
                assert obj is not None
                key = obj["metadata"]["name"]
                if key in self._taint_rules:
                    raise ApiError(409, f'devicetaintrules.resource.k8s.io "{key}" already exists', key,
                                   reason="AlreadyExists")
                obj["spec"]["taint"].setdefault("timeAdded", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
                obj.pop("status", None)
                obj["kind"] = "DeviceTaintRule"
                obj["metadata"].update(uid=str(uuid.uuid4()), resourceVersion=self._next_rv(), generation=1,
                                       creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
                self._taint_rules[key] = obj
                return dict(_clone(obj), apiVersion=api_version)
            current = self._taint_rules.get(name)
            if current is None:
                raise ApiError(404, f'devicetaintrules.resource.k8s.io "{name}" not found', name)
            if method == "GET":
                return dict(_clone(current), apiVersion=api_version)
            if method == "DELETE":
                del self._taint_rules[name]
                self._rv += 1
                return dict(_clone(current), apiVersion=api_version)
            if method != "PATCH":
                raise ApiError(405, f"fake API server: {method} on devicetaintrules is not supported")
            new = self._patched(current, ctype, body)
            for k in ("name", "uid", "creationTimestamp"):
                new["metadata"][k] = current["metadata"][k]
            _check_taint_rule(new)
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._taint_rules[name] = new
            return dict(_clone(new), apiVersion=api_version)

    def _dispatch(self, method: str, path: str, query: Mapping[str, str], ctype: str | None, body: Any) -> Any:
        if path.rstrip("/") == "/apis/resource.k8s.io" or (
                path.startswith(_SLICES) and path not in _WATCHABLE and not path.endswith("/resourceslices")):
            return self._resource_group(method, path, query, ctype, body)
        if path in _WATCHABLE:
            if path.startswith(_SLICES) and path[len(_SLICES):].split("/")[0] not in self.slice_versions:
                raise ApiError(404, f"the server could not find the requested resource ({method} {path})")
            return self._watchable(method, path, query)
        nm = _NAMESPACED.match(path)
        if nm is not None:
            return self._namespaced(method, nm, ctype, body)
        if path == "/api/v1/nodes":
            if method != "GET":
                raise ApiError(405, f"fake API server: {method} {path} is not supported")
            return self._list(query)
        m = _NODE_PATH.match(path) or _NODE_STATUS_PATH.match(path)
        if not m:
            raise ApiError(404, f"the server could not find the requested resource ({method} {path})")
        name = urllib.parse.unquote(m.group(1))
        status = path.endswith("/status")
        with self._lock:
            current = self._nodes.get(name)
            if current is None:
                raise ApiError(404, f'nodes "{name}" not found', name)
            if method == "GET":
                return _clone(current)
            if method == "PATCH":
                new = self._patched(current, ctype, body)
            elif method == "PUT" and not status:
                if not isinstance(body, dict):
                    raise ApiError(400, "PUT body must be a Node object")
                new = _clone(body)
                new.setdefault("metadata", {})
            else:
                raise ApiError(405, f"fake API server: {method} {path} is not supported")
            if status:
                # nodes/status: only the status changes (the real strategy keeps the spec), and the
                # profiler's ValidatingAdmissionPolicy (deploy/base/profiler-admission-policy.yaml)
                # refuses anything but the GPUHealthy condition (status_refusal)
                new["spec"] = _clone(current.get("spec", {}))
                why = status_refusal(current, new)
                if why:
                    raise ApiError(403, f'nodes "{name}" is forbidden: ValidatingAdmissionPolicy '
                                        f"'gpu-exporter-profiler-node-annotations' denied request: {why}", name,
                                   reason="Forbidden")
            return self._store(name, current, new)

    def _patched(self, current: JsonObj, ctype: str | None, body: Any) -> JsonObj:
        media = (ctype or "").split(";")[0].strip().lower()
        if media == "application/json-patch+json":
            return dict(json_patch(current, body))
        if media in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(body, dict):
                raise ApiError(400, f"{media} body must be a JSON object, got {type(body).__name__}")
            if media.startswith("application/strategic"):
                body = _strip_strategic_directives(body)
                return dict(_merge_conditions(current, body))
            return dict(merge_patch(current, body))
        raise ApiError(
            415,
            f"the body of the request was in an unknown format ({media or 'no Content-Type'}) - accepted "
            "media types include: application/json-patch+json, application/merge-patch+json, "
            "application/strategic-merge-patch+json",
        )

    def _store(self, name: str, current: JsonObj, new: JsonObj) -> JsonObj:
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            raise ApiError(400, "metadata must be an object")
        if meta.get("name", name) != name:
            raise ApiError(
                400, f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        cur_rv = current["metadata"]["resourceVersion"]
        if meta.get("resourceVersion") not in (None, "", cur_rv):
            raise ApiError(
                409,
                f'Operation cannot be fulfilled on nodes "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                name,
            )
        # Fields the server owns: keep them whatever the client sent.
        for k in ("name", "uid", "creationTimestamp", "resourceVersion"):
            meta[k] = current["metadata"][k]
        new["kind"], new["apiVersion"] = "Node", "v1"
        validate_node(new)
        if new != current:
            meta["resourceVersion"] = self._next_rv()
            self._nodes[name] = new
        return _clone(self._nodes[name])

    def _list(self, query: Mapping[str, str]) -> JsonObj:
        if query.get("watch") in ("true", "1"):
            raise ApiError(400, "fake API server: watch is not supported")
        sel = label_selector(query.get("labelSelector", ""))
        fsel = _field_selector(query.get("fieldSelector", ""))
        cont = query.get("continue")
        after = ""
        if cont:
            try:
                after = base64.urlsafe_b64decode(cont.encode()).decode()
            except ValueError:
                raise ApiError(400, f"invalid continue token {cont!r}") from None
        limit = int(query.get("limit") or 0)
        with self._lock:
            # select first, copy only the page: 10,000 nodes listed in pages of 500 must not
            # deep-copy the whole store for every page (the benchmark would time the fake)
            items = [n for name, n in sorted(self._nodes.items())
                     if name > after and sel(n["metadata"].get("labels") or {}) and fsel(n)]
            rv = str(self._rv)
            meta: JsonObj = {"resourceVersion": rv}
            if limit and len(items) > limit:
                meta["continue"] = base64.urlsafe_b64encode(items[limit - 1]["metadata"]["name"].encode()).decode()
                meta["remainingItemCount"] = len(items) - limit
                items = items[:limit]
            items = [_clone(n) for n in items]
        return {"kind": "NodeList", "apiVersion": "v1", "metadata": meta, "items": items}

    # ---- list + watch collections (_WATCHABLE): Pods ----

    def put_object(self, path: str, obj: JsonObj) -> JsonObj:
        """Create or replace an object of the list+watch collection ``path`` (keyed by metadata.uid,
        made up if absent); watchers get ADDED or MODIFIED. Returns the stored copy."""
        kind, api_version = _WATCHABLE[path]
        new = _clone(obj)
        new["kind"], new["apiVersion"] = kind, api_version
        meta = new.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        with self._lock:
            store = self._watched[path]
            event = "MODIFIED" if meta["uid"] in store else "ADDED"
            meta["resourceVersion"] = self._next_rv()
            store[meta["uid"]] = new
            self._record_event(path, event, new)
            return _clone(new)

    def delete_object(self, path: str, uid: str) -> None:
        """Delete an object of ``path`` by uid; watchers get DELETED."""
        with self._lock:
            obj = self._watched[path].pop(uid)
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._record_event(path, "DELETED", obj)

    def add_pod(self, name: str, namespace: str = "default", node: str = "node-1", uid: str | None = None,
                containers: Mapping[str, str] | None = None, init_containers: Mapping[str, str] | None = None
                ) -> JsonObj:
        """A Pod bound to ``node``; ``containers`` maps container name to its status containerID
        (``containerd://<64 hex>``, ``cri-o://...``; empty: not started yet)."""
        ctrs = dict(containers or {"main": ""})
        inits = dict(init_containers or {})
        status: JsonObj = {"phase": "Running"}
        for fld, src in (("containerStatuses", ctrs), ("initContainerStatuses", inits)):
            if src:
                status[fld] = [{"name": n, "containerID": cid, "ready": True, "restartCount": 0, "image": "x",
                                "imageID": ""} if cid else {"name": n, "ready": False, "restartCount": 0,
                                                            "image": "x", "imageID": ""} for n, cid in src.items()]
        pod: JsonObj = {
            "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
            "spec": {"nodeName": node, "containers": [{"name": n, "image": "x"} for n in ctrs],
                     **({"initContainers": [{"name": n, "image": "x"} for n in inits]} if inits else {})},
            "status": status,
        }
        return self.put_object("/api/v1/pods", pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            uid = next(u for u, o in self._watched["/api/v1/pods"].items()
                       if o["metadata"]["namespace"] == namespace and o["metadata"]["name"] == name)
        self.delete_object("/api/v1/pods", uid)

    def put_resource_slice(self, obj: JsonObj) -> None:
        """Create or replace a ResourceSlice (v1 shape, tests/fakes/dra_slices.py) in every version."""
        from tests.fakes.dra_slices import as_version

        obj = _clone(obj)
        meta = obj.setdefault("metadata", {})
        with self._lock:
            old = next((o for o in self._watched[_SLICES + "v1/resourceslices"].values()
                        if o["metadata"]["name"] == meta["name"]), None)
            meta["uid"] = old["metadata"]["uid"] if old else str(uuid.uuid4())
            for version in _SLICE_VERSIONS:
                self.put_object(f"{_SLICES}{version}/resourceslices", as_version(obj, version))

    def delete_resource_slice(self, name: str) -> None:
        with self._lock:
            uid = next(u for u, o in self._watched[_SLICES + "v1/resourceslices"].items()
                       if o["metadata"]["name"] == name)
            for version in _SLICE_VERSIONS:
                self.delete_object(f"{_SLICES}{version}/resourceslices", uid)

    def expire_watches(self) -> None:
        """Compact the event history (a later watch from an older resourceVersion gets 410 Expired)
        and end every open watch, as an API server restart or etcd compaction does."""
        with self._lock:
            self._compacted = self._rv + 1
            self._watch_log.clear()
            self._changed.notify_all()

    def _record_event(self, path: str, event: str, obj: JsonObj) -> None:
        self._watch_log.append((int(obj["metadata"]["resourceVersion"]), path, event, _clone(obj)))
        self._changed.notify_all()

    def _watchable(self, method: str, path: str, query: Mapping[str, str]) -> Any:
        if method != "GET":
            raise ApiError(405, f"fake API server: {method} {path} is not supported")
        match = _object_selector(query.get("fieldSelector", ""), query.get("labelSelector", ""))
        if query.get("watch") in ("true", "1"):
            return _Stream(path, query, match)
        kind, api_version = _WATCHABLE[path]
        with self._lock:
            items = [_clone(o) for _, o in sorted(self._watched[path].items()) if match(o)]
            return {"kind": kind + "List", "apiVersion": api_version,
                    "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def _stream(self, handler: http.server.BaseHTTPRequestHandler, s: _Stream) -> None:
        """A watch: chunked JSON lines until timeoutSeconds, expire_watches() or stop()."""
        deadline = time.monotonic() + float(s.query.get("timeoutSeconds") or 1800)
        since = s.query.get("resourceVersion") or ""
        with self._lock:
            compacted = self._compacted
            if since and since != "0" and int(since) < compacted:
                lines = [{"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                      "status": "Failure", "reason": "Expired", "code": 410,
                                                      "message": f"too old resource version: {since}"}}]
                cursor, done = self._rv, True
            else:
                done = False
                if since and since != "0":
                    cursor = int(since)
                    lines = []
                else:  # no resourceVersion: the current state as ADDED, then changes
                    cursor = self._rv
                    lines = [{"type": "ADDED", "object": _clone(o)}
                             for _, o in sorted(self._watched[s.path].items()) if s.match(o)]
        try:
            handler.send_response(200, "OK")
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            while True:
                for ev in lines:
                    data = json.dumps(ev).encode() + b"\n"
                    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                handler.wfile.flush()
                if done:
                    break
                with self._lock:
                    while True:
                        if self._compacted != compacted:  # expire_watches(): end now, send nothing more
                            new = []
                            break
                        new = [(rv, t, o) for rv, p, t, o in self._watch_log if p == s.path and rv > cursor]
                        left = deadline - time.monotonic()
                        if new or left <= 0 or self._stopping.is_set():
                            break
                        self._changed.wait(min(left, 0.1))
                    if not new:
                        break
                    cursor = new[-1][0]
                    lines = [{"type": t, "object": _clone(o)} for _, t, o in new if s.match(o)]
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except OSError:
            pass
        handler.close_connection = True

    def _handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
            disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stall

            def setup(self) -> None:
                super().setup()
                with api._lock:
                    api._connections.add(self.connection)

            def finish(self) -> None:
                with api._lock:
                    api._connections.discard(self.connection)
                super().finish()

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._handle()

            def do_PATCH(self) -> None:
                self._handle()

            def do_PUT(self) -> None:
                self._handle()

            def do_POST(self) -> None:
                self._handle()

            def do_DELETE(self) -> None:
                self._handle()

            def _handle(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body: Any = None
                bad_json = False
                if raw:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body, bad_json = raw.decode(errors="replace"), True
                rec = RecordedRequest(
                    method=self.command,
                    path=url.path,
                    query=query,
                    content_type=self.headers.get("Content-Type"),
                    body=body,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    time=time.time(),
                )
                with api._lock:
                    api._requests.append(rec)
                extra_headers: dict[str, str] = {}
                try:
                    if api.token and self.headers.get("Authorization") != f"Bearer {api.token}":
                        raise ApiError(401, "Unauthorized")
                    inj = api._take_injection(self.command, url.path)
                    if inj is not None:
                        rec.injected = True
                        if inj.delay:
                            api._stopping.wait(inj.delay)
                        if inj.status is not None:
                            extra_headers = inj.headers
                            raise ApiError(inj.status, f"injected HTTP {inj.status} by the test", rec.node)
                    if bad_json:
                        raise ApiError(400, f"request body is not valid JSON: {str(body)[:80]!r}")
                    code, doc = 200, api._dispatch(self.command, url.path, query, rec.content_type, body)
                    if isinstance(doc, _Stream):
                        rec.status = 200
                        api._stream(self, doc)
                        return
                except ApiError as e:
                    code, doc = e.code, e.status()
                except Exception as e:  # noqa: BLE001 - a bug in the fake must still answer
                    code, doc = 500, ApiError(500, f"fake API server crashed: {e!r}").status()
                rec.status = code
                data = json.dumps(doc).encode()
                try:
                    self.send_response(code, _HTTP_PHRASES.get(code))
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in extra_headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    self.close_connection = True  # the client gave up (timeout) or we are stopping

        return Handler


def _check_taint_rule(obj: JsonObj | None) -> None:
    """422 unless ``obj`` is a DeviceTaintRule as resource/v1beta2 (and v1alpha3) types.go define it."""
    def bad(why: str) -> ApiError:
        return ApiError(422, f"DeviceTaintRule is invalid: {why}", reason="Invalid")

    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        raise bad("metadata: Required value")
    meta = obj["metadata"]
    name = meta.get("name")
    if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise bad(f"metadata.name: Invalid value: {name!r}")
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict) or any(_key_error(str(k)) for k in labels) or any(
            not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE.match(v) for v in labels.values()):
        raise bad("metadata.labels: Invalid value")
    spec = obj.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("taint"), dict):
        raise bad("spec.taint: Required value")
    extra = set(spec) - {"deviceSelector", "taint"}
    if extra:
        raise bad(f"spec: unknown field(s) {sorted(extra)}")
    sel = spec.get("deviceSelector")
    if sel is not None:
        if not isinstance(sel, dict) or set(sel) - {"driver", "pool", "device"}:
            raise bad("spec.deviceSelector: only driver, pool and device (the rest is tombstoned since 1.35)")
        for k, limit in (("driver", 63), ("pool", 253), ("device", 63)):
            v = sel.get(k)
            if v is not None and (not isinstance(v, str) or not v or len(v) > limit):
                raise bad(f"spec.deviceSelector.{k}: Invalid value: {v!r}")
        if sel.get("device") is not None and not _DNS_LABEL_NAME.match(sel["device"]):
            raise bad(f"spec.deviceSelector.device: Invalid value: {sel['device']!r}: must be a DNS label")
    taint = spec["taint"]
    if set(taint) - {"key", "value", "effect", "timeAdded"}:
        raise bad(f"spec.taint: unknown field(s) {sorted(set(taint) - {'key', 'value', 'effect', 'timeAdded'})}")
    key = taint.get("key")
    if not isinstance(key, str) or _key_error(key):
        raise bad(f"spec.taint.key: Invalid value: {key!r}")
    value = taint.get("value", "")
    if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
        raise bad(f"spec.taint.value: Invalid value: {value!r}")
    if taint.get("effect") not in _TAINT_EFFECTS:
        raise bad(f"spec.taint.effect: Unsupported value: {taint.get('effect')!r}: supported values: "
                  + ", ".join(f'"{e}"' for e in _TAINT_EFFECTS))


# ---- list + watch collections -------------------------------------------------------------
# list path -> (kind, apiVersion). Add a row for another resource served with list and watch.
_WATCHABLE: dict[str, tuple[str, str]] = {"/api/v1/pods": ("Pod", "v1")}
_SLICES = "/apis/resource.k8s.io/"
_SLICE_VERSIONS = ("v1", "v1beta2", "v1beta1")
_WATCHABLE.update({f"{_SLICES}{v}/resourceslices": ("ResourceSlice", f"resource.k8s.io/{v}") for v in _SLICE_VERSIONS})


@dataclass
class _Stream:
    path: str
    query: Mapping[str, str]
    match: Callable[[JsonObj], bool]


def _dotted(obj: Any, path: str) -> str:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return "" if obj is None else str(obj)


def _object_selector(fields: str, labels: str) -> Callable[[JsonObj], bool]:
    """Field selector over any dotted path (``spec.nodeName=n``, ``metadata.namespace!=x``) and label selector."""
    reqs: list[tuple[str, str, bool]] = []
    for term in filter(None, (t.strip() for t in fields.split(","))):
        m = re.fullmatch(r"([A-Za-z][\w.]*)\s*(==|!=|=)\s*(.*)", term)
        if not m:
            raise ApiError(400, f'invalid field selector: "{term}"')
        reqs.append((m[1], m[3], m[2] == "!="))
    sel = label_selector(labels)
    return lambda o: (all((_dotted(o, p) == want) != neg for p, want, neg in reqs)
                      and sel(o.get("metadata", {}).get("labels") or {}))


__all__ = ["TOKEN", "ApiError", "FakeKubeAPI", "RecordedRequest", "json_patch", "label_selector", "merge_patch"]
