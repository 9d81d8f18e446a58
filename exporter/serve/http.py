"""The exporter's routes on the shared server (``exporter/platform/http/``): /metrics, /, /healthz, /readyz.

The engine hands out one snapshot per collection; the ``/metrics`` route renders it once per
format and encoding and keeps the bytes (:class:`Exposition`), so that every scraper of a
collection shares them and the cost does not grow with the number of scrapers. ``/healthz``
is answered on the I/O thread itself and ``/readyz`` in the probe lane: neither ever waits
behind a scrape.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from exporter.core.engine import Engine
from exporter.core.options import FieldFilter
from exporter.core.snapshot import Snapshot
from exporter.platform.exposition import answer_headers, encode
from exporter.platform.http import FastRoute, Handler, HTTPServer, Response, Route, wants_gzip, wants_openmetrics
from exporter.serve.render import render

if TYPE_CHECKING:
    from exporter.platform.webconfig import WebConfig


LANDING = """<!doctype html><html><head><meta charset="utf-8"><title>gpu-exporter</title></head>
<body><h1>gpu-exporter</h1><p>Vendor-neutral GPU metrics.</p>
<ul><li><a href="{metrics}">{metrics}</a> Prometheus metrics</li>
<li><a href="/healthz">/healthz</a> liveness</li><li><a href="/readyz">/readyz</a> readiness</li></ul>
</body></html>
"""


class _Rendered:
    """The exposition of one snapshot, per format and encoding, each rendered on first request."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.bodies: dict[bool, bytes] = {}
        self.gz: dict[bool, bytes] = {}
        self.lock = threading.Lock()


class Exposition:
    """The byte cache of the ``/metrics`` route: the rendered bodies of the last snapshot served.

    The engine gives every scraper of one collection the same snapshot object, so the bytes are
    keyed on its identity; a newer snapshot replaces them (an older one, a scraper that waited
    long, is rendered without evicting the newer)."""

    def __init__(self) -> None:
        self._last: _Rendered | None = None  # replaced whole, so the I/O thread reads it unlocked
        self._lock = threading.Lock()

    def rendered(self, snap: Snapshot, openmetrics: bool = False, gz: bool = False) -> bytes | None:
        """The body of ``snap`` if it is already rendered (no work, no lock), else None."""
        last = self._last
        if last is None or last.snap is not snap:
            return None
        return (last.gz if gz else last.bodies).get(openmetrics)

    def body(self, snap: Snapshot, fields: FieldFilter, openmetrics: bool = False, gz: bool = False) -> bytes:
        """The body of ``snap``, rendered now unless it already is (the same ``fields`` every time)."""
        entry = self._last
        if entry is None or entry.snap is not snap:
            with self._lock:
                entry = self._last
                if entry is None or entry.snap is not snap:
                    fresh = _Rendered(snap)
                    if entry is None or snap.created >= entry.snap.created:
                        self._last = fresh
                    entry = fresh
        with entry.lock:  # concurrent scrapers of one collection wait for one render
            raw = entry.bodies.get(openmetrics)
            if raw is None:
                raw = entry.bodies[openmetrics] = render(snap, fields, openmetrics)
            if not gz:
                return raw
            hit = entry.gz.get(openmetrics)
            if hit is None:
                hit = entry.gz[openmetrics] = encode(raw, gz=True)
            return hit


def _metrics_answer(body: bytes, om: bool, gz: bool) -> Response:
    return Response(200, body, *answer_headers(om, gz))


def metrics_route(engine: Engine, cache: Exposition) -> Route:
    def route(h: Handler, path: str, query: str) -> Response:
        om = wants_openmetrics(h.headers.get("Accept", ""))
        gz = wants_gzip(h.headers.get("Accept-Encoding", ""))
        return _metrics_answer(cache.body(engine.scrape(), engine.fields, openmetrics=om, gz=gz), om, gz)

    return route


def metrics_fast(engine: Engine, cache: Exposition) -> FastRoute:
    """The answer from bytes already rendered, on the I/O thread (no thread hand-off); None when a
    collection or a render is needed, which the work lane then does."""
    def fast(h: Handler, path: str, query: str) -> Response | None:
        last = engine.cached()
        if last is None:
            return None
        om = wants_openmetrics(h.headers.get("Accept", ""))
        gz = wants_gzip(h.headers.get("Accept-Encoding", ""))
        body = cache.rendered(last, openmetrics=om, gz=gz)
        return None if body is None else _metrics_answer(body, om, gz)

    return fast


def build_server(engine: Engine, address: str, port: int, metrics_path: str, ready_max_age: float,
                 max_connections: int = 64, read_timeout: float = 10.0, web: WebConfig | None = None,
                 probe_port: int | None = None) -> HTTPServer:
    srv = HTTPServer((address, port), max_connections=max_connections, read_timeout=read_timeout, web=web,
                     probe_port=probe_port)
    landing = LANDING.format(metrics=metrics_path).encode()

    def index(h: Handler, path: str, query: str) -> Response:
        return Response(200, landing, "text/html; charset=utf-8")

    def healthz(h: Handler, path: str, query: str) -> Response:
        return Response(200, b"ok\n")

    def readyz_answer(h: Handler, wait: bool) -> Response | None:
        state = engine.ready(ready_max_age, wait)
        if state is None:
            return None
        ok, why = state
        if not h.authorized:  # an anonymous probe under basic auth learns up or down, nothing else
            why = "ok" if ok else "not ready"
        return Response(200 if ok else 503, (why + "\n").encode())

    def readyz(h: Handler, path: str, query: str) -> Response:
        resp = readyz_answer(h, True)  # may collect once (collect on scrape): in the probe lane
        assert resp is not None
        return resp

    def readyz_fast(h: Handler, path: str, query: str) -> Response | None:
        return readyz_answer(h, False)  # on the I/O thread unless a collection is needed first

    cache = Exposition()
    srv.route(metrics_path, metrics_route(engine, cache), fast=metrics_fast(engine, cache))
    srv.route("/", index, "inline")
    srv.route("/healthz", healthz, "inline")
    srv.route("/readyz", readyz, "probe", fast=readyz_fast)
    return srv
