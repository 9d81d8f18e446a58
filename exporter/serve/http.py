"""The exporter's routes on the shared server (``exporter/platform/http.py``): /metrics, /, /healthz, /readyz.

Rendered bytes are shared by every scraper of a collection, so cost does not grow with the
number of scrapers. ``/healthz`` is answered on the I/O thread itself and ``/readyz`` in the
probe lane: neither ever waits behind a scrape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.platform.http import GpuHTTPServer, Handler, Response, Route, wants_gzip, wants_openmetrics
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


def metrics_route(engine: Engine) -> Route:
    def route(h: Handler, path: str, query: str) -> Response:
        om = wants_openmetrics(h.headers.get("Accept", ""))
        gz = wants_gzip(h.headers.get("Accept-Encoding", ""))
        rendered = engine.scrape()
        body = rendered.body(openmetrics=om, gz=gz)
        headers = {"Vary": "Accept, Accept-Encoding"}  # caches must key on what the answer depends on
        if gz:
            headers["Content-Encoding"] = "gzip"
        return Response(200, body, OPENMETRICS_TYPE if om else TEXT_TYPE, headers)

    return route


def build_server(engine: Engine, address: str, port: int, metrics_path: str, ready_max_age: float,
                 max_connections: int = 64, read_timeout: float = 10.0, web: WebConfig | None = None) -> GpuHTTPServer:
    srv = GpuHTTPServer((address, port), max_connections=max_connections, read_timeout=read_timeout, web=web)
    landing = LANDING.format(metrics=metrics_path).encode()

    def index(h: Handler, path: str, query: str) -> Response:
        return Response(200, landing, "text/html; charset=utf-8")

    def healthz(h: Handler, path: str, query: str) -> Response:
        return Response(200, b"ok\n")

    def readyz(h: Handler, path: str, query: str) -> Response:
        ok, why = engine.ready(ready_max_age)  # may collect once (collect on scrape): the probe lane
        if not h.authorized:  # an anonymous probe under basic auth learns up or down, nothing else
            why = "ok" if ok else "not ready"
        return Response(200 if ok else 503, (why + "\n").encode())

    srv.route(metrics_path, metrics_route(engine))
    srv.route("/", index, "inline")
    srv.route("/healthz", healthz, "inline")
    srv.route("/readyz", readyz, "probe")
    return srv
