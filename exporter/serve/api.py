"""JSON API and live page on the exporter's port.

- ``GET /api/v1/monitoring/gpu-metrics``: the fleet manager's shape, in its legacy units
  (percent, MB = MiB, celsius, W, MHz). ``/metrics`` stays the SI source of truth.
- ``GET /stats``: the audit view (identity, memory, average power from the energy counter,
  PCIe links, P2P/topology, host), the same document as ``gpu-exporter snapshot --json``.

Both are views of one GPU field table, :data:`exporter.core.views.FIELDS` (as is the Python
API's ``GpuStatus``).
- ``GET /``: a dependency-free live page polling the two endpoints above.

Both JSON endpoints read through ``engine.scrape()``, so they share collections (and the
scrape cache) with Prometheus. Schemas: :mod:`exporter.serve.api_schema`, docs/api.md.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

from exporter import backends
from exporter.core.engine import Engine
from exporter.core.options import FieldFilter
from exporter.core.schema import FAMILIES, equivalents
from exporter.core.snapshot import Snapshot
from exporter.core.views import FIELDS, Field, GpuSource, PowerTracker, gpu_legacy, iso_time, numbered, stats_view
from exporter.platform.http import Handler, HTTPServer, Response

GPU_METRICS_PATH = "/api/v1/monitoring/gpu-metrics"
STATS_PATH = "/stats"
FAMILIES_PATH = "/api/v1/families"
JSON_TYPE = "application/json"
_NO_STORE = {"Cache-Control": "no-store"}


def gpu_metrics_view(snap: Snapshot, fields: Sequence[Field] = FIELDS) -> dict[str, Any]:
    """The fleet manager's response (schema: GPU_METRICS): the gpu-metrics view of the field table
    (:data:`exporter.core.views.FIELDS`). A reading the GPU lacks is null, never 0."""
    gpus = [gpu_legacy(GpuSource(backend, number, g), fields) for number, backend, g in numbered(snap)]
    return {"timestamp": iso_time(snap.created), "gpus": gpus}


def families_view(fields: FieldFilter) -> dict[str, Any]:
    """Every metric family of the schema and what the field selection does with it; ``equivalents``: what each
    vendor tool the registry knows shows of it (the rows' tools and the backends' own), null where none says."""
    extra = backends.equivalents()
    return {"families": [
        {"name": f.name, "type": f.kind, "unit": f.unit, "help": f.help, "labels": list(f.all_labels),
         "group": f.group, "backends": backends.supporters(f.name), "when": f.when or None,
         "state": "published" if fields.exposed(f.name) else "collected" if fields.enabled(f.name) else "off",
         "equivalents": {tool: text or None for tool, text in equivalents(f, extra).items()}}
        for f in FAMILIES]}


def live_page(metrics_path: str, fields: Sequence[Field] = FIELDS) -> bytes:
    """``exporter/serve/web/index.html`` with the metrics path, the real backends and their runtimes (the
    registry's: "CUDA/ROCm" names the host's cuda_version) and the GPU fields that name a column (their row's
    ``column``: shown on each card, from ``/stats``) filled in."""
    text = resources.files("exporter.serve").joinpath("web/index.html").read_text(encoding="utf-8")
    real = " | ".join(backends.auto_order())
    shown = [{"key": f.stats_key, "title": f.column, "unit": f.unit} for f in fields if f.column and f.stats_key]
    return (text.replace("{{METRICS_PATH}}", html.escape(metrics_path, quote=True))
            .replace("{{REAL_BACKENDS}}", html.escape(real, quote=True))
            .replace("{{RUNTIMES}}", html.escape(backends.runtime_label(), quote=True))
            .replace("{{FIELDS}}", json.dumps(shown).replace("</", "<\\/")).encode())


def _json(doc: dict[str, Any]) -> Response:
    return Response(200, json.dumps(doc, separators=(",", ":")).encode(), JSON_TYPE, dict(_NO_STORE))


def register(server: HTTPServer, engine: Engine, metrics_path: str = "/metrics") -> None:
    """Add the JSON API and the live page (replacing the plain landing page at ``/``)."""
    tracker = PowerTracker()  # every API read feeds it, so /stats averages over the last interval
    page = live_page(metrics_path)

    def snapshot() -> Snapshot:
        snap = engine.scrape()
        tracker.observe(snap)
        return snap

    def gpu_metrics(h: Handler, path: str, query: str) -> Response:
        return _json(gpu_metrics_view(snapshot()))

    def stats(h: Handler, path: str, query: str) -> Response:
        snap = engine.scrape()
        return _json(stats_view(snap, tracker.observe(snap)))

    def index(h: Handler, path: str, query: str) -> Response:
        return Response(200, page, "text/html; charset=utf-8")

    families: list[bytes] = []  # built on the first request: the selection is fixed at start-up

    def schema(h: Handler, path: str, query: str) -> Response:
        if not families:
            families.append(json.dumps(families_view(engine.fields), separators=(",", ":")).encode())
        return Response(200, families[0], JSON_TYPE, dict(_NO_STORE))

    for path, route in ((GPU_METRICS_PATH, gpu_metrics), (STATS_PATH, stats), (FAMILIES_PATH, schema)):
        server.route(path, route)
    server.route("/", index, "inline")  # fixed bytes: answered on the I/O thread
