"""Test helpers for the profiler: a fault-injecting proxy in front of a real Prometheus,
and small builders shared by the profiler test modules."""

from __future__ import annotations

import io
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Self

from tests.fakes.profiler_history import GpuHistory, write_openmetrics
from tests.harness.httpfake import JSON, FakeHTTP, Reply, Request, json_reply
from tests.harness.prom import OpenMetricsWriter

if TYPE_CHECKING:
    from exporter.profiler.loop import Profiler

MODES = (None, "500", "garbage", "slow", "nan", "empty", "hang", "truncated", "cut")


class FaultProxy:
    """The fault-injecting mode of the suite's one Prometheus stand-in: an HTTP proxy on 127.0.0.1 (on the
    :class:`~tests.harness.httpfake.FakeHTTP` that :class:`~tests.harness.prom.FakePrometheus` is built on)
    forwarding to ``target`` (a real Prometheus's base URL).

    ``mode`` (changeable while serving): None passes through; ``"500"`` answers HTTP 500; ``"garbage"``
    200 with a body that is not JSON; ``"slow"`` waits ``delay`` s before passing through; ``"nan"``
    passes through with every sample value replaced by NaN; ``"empty"`` passes through with empty
    results; ``"hang"`` holds the request until :meth:`release` (or stop); ``"truncated"`` answers the
    first half of Prometheus' JSON (a consistent Content-Length); ``"cut"`` announces the full length and
    closes the connection half-way through the body. :meth:`down` stops listening (connections refused),
    :meth:`up` listens again on the same port. ``requests`` counts what arrived, ``headers`` and
    ``authorization`` are what each request carried.

    It also speaks the wire format of the stores in front of a fleet's Prometheus data
    (docs/profiler.md, "Stores"): ``prefix``, a path prefix every request must carry (Mimir's
    ``/prometheus``, vmselect's ``/select/<tenant>/prometheus``; 404 otherwise); ``tenant``, the
    ``X-Scope-OrgID`` every request must carry (401 ``no org id`` otherwise, as Mimir and
    Thanos' tenancy proxies answer); ``extra``, top-level fields added to every successful answer
    (Thanos' partial-response ``warnings``, VictoriaMetrics cluster's ``isPartial``); ``refuse``,
    given the query text and the number of series in Prometheus' answer, the (status, error
    text) with which a store over one of its limits refuses it, or None; ``token``, the bearer token
    every request must carry besides (401 ``no org id`` otherwise, as a tenancy proxy checking both).
    """

    def __init__(self, target: str, mode: str | None = None, delay: float = 2.0, *, prefix: str = "",
                 tenant: str | None = None, extra: dict[str, object] | None = None,
                 refuse: Callable[[str, int], tuple[int, str] | None] | None = None,
                 token: str | None = None, names: Reply | None = None) -> None:
        assert mode in MODES
        self.target = target.rstrip("/")
        self.mode = mode
        self.delay = delay
        self.prefix = prefix.rstrip("/")
        self.tenant = tenant
        self.token = token
        self.extra = extra or {}
        self.refuse = refuse
        self.names = names  # the answer to a label values GET (the metric names), instead of the store's
        self.params: list[dict[str, list[str]]] = []  # every request's form parameters, in order
        self.paths: list[str] = []  # every request's API path (/api/v1/query, ...), in order
        self._release = threading.Event()
        self._http = FakeHTTP(self._answer, http11=True)
        self.url = self._http.url

    @property
    def requests(self) -> int:
        return len(self._http.requests)

    @property
    def headers(self) -> list[dict[str, str]]:
        """The headers of each request (lower-case names), in order."""
        return [r.headers for r in self._http.requests]

    @property
    def authorization(self) -> list[str | None]:
        """The Authorization header of each request."""
        return [h.get("authorization") for h in self.headers]

    def _answer(self, req: Request) -> Reply:
        if self.tenant is not None and req.headers.get("x-scope-orgid") != self.tenant:
            return Reply(401, b"no org id\n")
        if self.token is not None and req.headers.get("authorization") != f"Bearer {self.token}":
            return Reply(401, b"no org id\n")
        if not req.path.startswith(self.prefix + "/api/v1/"):
            return Reply(404, b"404 page not found\n")
        path, _, qs = req.path[len(self.prefix):].partition("?")
        params = urllib.parse.parse_qs(qs if req.method == "GET" else req.body.decode())
        query = params.get("query", [""])[0]
        with self._http.lock:
            self.params.append(params)
            self.paths.append(path)
        mode = self.mode
        if mode == "hang":
            self._release.wait(120)
            mode = None
        if mode == "slow":
            self._release.wait(self.delay)
        if mode == "500":
            return json_reply(b'{"status":"error","errorType":"internal","error":"injected"}', 500)
        if mode == "garbage":
            return json_reply(b'{"status":"success","data":{"resultType":"vector","result":[{"met')
        if req.method == "GET" and self.names is not None:
            return self.names
        if req.method == "GET":  # label values: passed on as they are (the faults below are the queries')
            code, data = forward_get(self.target + path + "?" + qs)
            return json_reply(data, code)
        code, data = forward_post(self.target + path, req.body, req.headers.get("content-type", ""))
        if code == 200 and mode == "truncated":
            return json_reply(data[: len(data) // 2])
        if code == 200 and mode == "cut":
            return Reply(200, data[: len(data) // 2], JSON, length=len(data), close=True)
        if code == 200 and (self.refuse is not None or self.extra):
            doc = json.loads(data)
            refused = self.refuse(query, len(doc["data"]["result"])) if self.refuse is not None else None
            if refused is not None:
                status, text = refused
                return json_reply({"status": "error", "errorType": "execution", "error": text}, status)
            data = json.dumps({**doc, **self.extra}).encode()
        if code == 200 and mode in ("nan", "empty"):
            doc = json.loads(data)
            if mode == "empty":
                doc["data"]["result"] = []
            else:
                for s in doc["data"]["result"]:
                    if "value" in s:
                        s["value"][1] = "NaN"
                    for pt in s.get("values", []):
                        pt[1] = "NaN"
            data = json.dumps(doc).encode()
        return json_reply(data, code)

    @property
    def queries(self) -> list[str]:
        """Every query text that reached the store, in order."""
        return [p.get("query", [""])[0] for p in self.params]

    def release(self) -> None:
        """Let held ("hang") requests through."""
        self._release.set()

    def down(self) -> None:
        """Stop listening (held requests are let through first); :meth:`up` listens again on the same port."""
        self._release.set()
        self._http.down()
        self._release.clear()

    def up(self) -> Self:
        self._http.up()
        return self

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self._release.set()
        self._http.close()


def forward_get(url: str) -> tuple[int, bytes]:
    """GET ``url`` (a proxy passing a label values request on): (status, answer body)."""
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def forward_post(url: str, body: bytes, content_type: str) -> tuple[int, bytes]:
    """POST ``body`` to ``url`` (a proxy passing a query on to Prometheus): (status, answer body)."""
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def history_file(path: Path, histories: list[GpuHistory], node_label: bool = True) -> Path:
    """Write ``histories`` as OpenMetrics for backfilling; returns the path."""
    with OpenMetricsWriter(path) as w:
        write_openmetrics(w, histories, node_label=node_label)
    return path


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (the port was free a moment ago)."""
    from tests.harness.net import free_port

    return f"http://127.0.0.1:{free_port()}"


def build_profiler(prometheus_url: str, *flags: str, kubeconfig: Path | None = None,
                   out: IO[str] | None = None, tune: Mapping[str, object] | None = None,
                   **inject: object) -> Profiler:
    """The one way a test makes a profiler in process: ``gpu-exporter profile``'s own wiring (its settings
    table, its loader, ``main.build_profiler``) from ``flags``, against ``prometheus_url`` and the API server
    of ``kubeconfig`` (None: a dry run without a cluster, ``--dry-run`` implied, whatever kubeconfig this
    machine has). ``inject``: what no flag
    can give, put in place of the profiler's own (``elector=`` a replica that never leads, ``clock=``,
    ``events=`` a recorder on a fake clock); ``tune``: values deeper down that no flag sets, by dotted path
    (``{"store.backoff": 0.01, "reader.client.backoff": 0.01}``: retries without the real backoff's wait).
    A name the profiler lacks is an error. The process itself:
    ``tests.harness.exporter.DaemonProcess("profile", ...)``."""
    from unittest import mock

    from exporter.platform import kube
    from exporter.profiler import main

    argv = ["--prometheus-url", prometheus_url, *flags]
    argv += ["--kubeconfig", str(kubeconfig)] if kubeconfig is not None else ["--dry-run"]
    settings = main.parse_args(argv, environ={})
    if kubeconfig is not None:
        prof = main.build_profiler(settings, out=out if out is not None else io.StringIO())
    else:  # no cluster at all: never the developer's ~/.kube/config or $KUBECONFIG (tests talk only to 127.0.0.1)
        def no_cluster(*args: object, **kwargs: object) -> object:
            raise kube.NoKubeConfig("no cluster in this test (tests/harness/profiler.py)")

        with mock.patch.object(kube, "api_client", no_cluster):
            prof = main.build_profiler(settings, out=out if out is not None else io.StringIO())
    for path, value in [*inject.items(), *(tune or {}).items()]:
        *parents, name = path.split(".")
        owner: object = prof
        for step in parents:
            owner = getattr(owner, step)
        if not hasattr(owner, name):
            raise AttributeError(f"the profiler has no {path!r} to set")
        setattr(owner, name, value)
    return prof
