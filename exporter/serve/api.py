"""JSON API and live page on the exporter's port.

- ``GET /api/v1/monitoring/gpu-metrics``: the fleet manager's shape, in its legacy units
  (percent, MB = MiB, celsius, W, MHz). ``/metrics`` stays the SI source of truth.
- ``GET /stats``: the audit view (identity, memory, average power from the energy counter,
  PCIe links, P2P/topology, host), the same document as ``gpu-exporter snapshot --json``.
- ``GET /``: a dependency-free live page polling the two endpoints above.

Both JSON endpoints read through ``engine.scrape()``, so they share collections (and the
scrape cache) with Prometheus. Schemas: :mod:`exporter.serve.api_schema`, docs/api.md.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any

from exporter import backends
from exporter.core.engine import Engine
from exporter.core.options import FieldFilter
from exporter.core.schema import FAMILIES
from exporter.core.snapshot import Snapshot
from exporter.core.views import MIB, PowerTracker, iso_time, numbered, stats_view
from exporter.platform.http import GpuHTTPServer, Handler, Response

GPU_METRICS_PATH = "/api/v1/monitoring/gpu-metrics"
STATS_PATH = "/stats"
FAMILIES_PATH = "/api/v1/families"
JSON_TYPE = "application/json"
_NO_STORE = {"Cache-Control": "no-store"}


def _mib(v: float | None) -> int | None:
    return None if v is None else round(v / MIB)


def _round(v: float | None, digits: int) -> float | None:
    return None if v is None else round(v, digits)


def _percent(ratio: float | None) -> float | None:
    return None if ratio is None else round(ratio * 100, 2)


def _mhz(clocks: dict[str, float], name: str) -> float | None:
    hz = clocks.get(name)
    return None if hz is None else round(hz / 1e6, 1)


def gpu_metrics_view(snap: Snapshot) -> dict[str, Any]:
    """The fleet manager's response (schema: GPU_METRICS). A reading the GPU lacks is null, never 0."""
    gpus = []
    for number, _backend, g in numbered(snap):
        up = g.up
        free = g.free_memory_bytes()
        gpus.append({
            "id": f"gpu-{number}",
            "name": g.name,
            "uuid": g.uuid,
            "utilization": _percent(g.utilization_ratio) if up else None,
            "memory": {
                "total": _mib(g.memory_total_bytes),
                "used": _mib(g.memory_used_bytes) if up else None,
                "free": _mib(free) if up else None,
            },
            "temperature": _round(g.temperature_celsius.get("gpu"), 2) if up else None,
            "power_usage": _round(g.power_watts, 3) if up else None,
            "clock_speeds": {
                "graphics": _mhz(g.clock_hertz, "graphics") if up else None,
                "memory": _mhz(g.clock_hertz, "memory") if up else None,
            },
        })
    return {"timestamp": iso_time(snap.created), "gpus": gpus}


def families_view(fields: FieldFilter) -> dict[str, Any]:
    """Every metric family of the schema and what the field selection does with it."""
    return {"families": [
        {"name": f.name, "type": f.kind, "unit": f.unit, "help": f.help, "labels": list(f.all_labels),
         "group": f.group, "backends": backends.supporters(f.name), "when": f.when or None,
         "state": "published" if fields.exposed(f.name) else "collected" if fields.enabled(f.name) else "off",
         "nvidia_smi": f.smi or None, "amd_smi": f.amd or None}
        for f in FAMILIES]}


def live_page(metrics_path: str) -> bytes:
    """``exporter/serve/web/index.html`` with the metrics path filled in."""
    text = resources.files("exporter.serve").joinpath("web/index.html").read_text(encoding="utf-8")
    return text.replace("{{METRICS_PATH}}", html.escape(metrics_path, quote=True)).encode()


def _json(doc: dict[str, Any]) -> Response:
    return Response(200, json.dumps(doc, separators=(",", ":")).encode(), JSON_TYPE, dict(_NO_STORE))


def register(server: GpuHTTPServer, engine: Engine, metrics_path: str = "/metrics") -> None:
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
