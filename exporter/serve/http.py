"""The exporter's routes on the shared server (``exporter/platform/http.py``): /metrics, /, /healthz, /readyz.

Rendered bytes are shared by every scraper of a collection, so cost does not grow with the
number of scrapers. ``/healthz`` is answered on the I/O thread itself and ``/readyz`` in the
probe lane: neither ever waits behind a scrape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.platform.http import FastRoute, GpuHTTPServer, Handler, Response, Route, wants_gzip, wants_openmetrics
from exporter.serve.engine import Engine

if TYPE_CHECKING:
    from exporter.platform.webconfig import WebConfig

TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

LANDING = """<!doctype html><html><head><meta charset="utf-8"><title>gpu-exporter</title></head>
<body><h1>gpu-exporter</h1><p>Vendor-neutral GPU metrics.</p>
<ul><li><a href="{metrics}">{metrics}</a> Prometheus metrics</li>
<li><a href="/healthz">/healthz</a> liveness</li><li><a href="/readyz">/readyz</a> readiness</li></ul>
</body></html>
"""


def _metrics_answer(body: bytes, om: bool, gz: bool) -> Response:
    headers = {"Vary": "Accept, Accept-Encoding"}  # caches must key on what the answer depends on
    if gz:
        headers["Content-Encoding"] = "gzip"
    return Response(200, body, OPENMETRICS_TYPE if om else TEXT_TYPE, headers)


def metrics_route(engine: Engine) -> Route:
    def route(h: Handler, path: str, query: str) -> Response:
        om = wants_openmetrics(h.headers.get("Accept", ""))
        gz = wants_gzip(h.headers.get("Accept-Encoding", ""))
        return _metrics_answer(engine.scrape().body(openmetrics=om, gz=gz), om, gz)

    return route


def metrics_fast(engine: Engine) -> FastRoute:
    """The answer from bytes already rendered, on the I/O thread (no thread hand-off); None when a
    collection or a render is needed, which the work lane then does."""
    def fast(h: Handler, path: str, query: str) -> Response | None:
        last = engine.cached()
        if last is None:
            return None
        om = wants_openmetrics(h.headers.get("Accept", ""))
        gz = wants_gzip(h.headers.get("Accept-Encoding", ""))
        body = last.rendered(openmetrics=om, gz=gz)
        return None if body is None else _metrics_answer(body, om, gz)

    return fast


def build_server(engine: Engine, address: str, port: int, metrics_path: str, ready_max_age: float,
                 max_connections: int = 64, read_timeout: float = 10.0, web: WebConfig | None = None) -> GpuHTTPServer:
    srv = GpuHTTPServer((address, port), max_connections=max_connections, read_timeout=read_timeout, web=web)
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

    srv.route(metrics_path, metrics_route(engine), fast=metrics_fast(engine))
    srv.route("/", index, "inline")
    srv.route("/healthz", healthz, "inline")
    srv.route("/readyz", readyz, "probe", fast=readyz_fast)
    return srv
