"""JSON schemas (draft 2020-12) of the JSON API and of the files the CLI tools write.

This module is the single source: ``docs/api.md`` embeds these schemas verbatim and a test
checks that the two agree; the tests validate every response and file against them. The per-GPU
parts of ``/stats`` and gpu-metrics are generated from the GPU field table
(:data:`exporter.core.views.FIELDS`), as the documents themselves are.
Print one with ``python -m exporter.serve.api_schema gpu-metrics|stats|record``; ``--write-docs``
regenerates docs/api.md's field table and schemas.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from exporter.core.schema import render_blocks
from exporter.core.views import FIELDS, Field

_ISO8601 = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$"
_TIMESTAMP = {"type": "string", "format": "date-time", "pattern": _ISO8601}


def _num(description: str, minimum: float | None = 0, maximum: float | None = None) -> dict[str, Any]:
    """A number or null (null: the GPU or driver does not report it; never a placeholder 0)."""
    out: dict[str, Any] = {"type": ["number", "null"]}
    if description:
        out["description"] = description
    if minimum is not None:
        out["minimum"] = minimum
    if maximum is not None:
        out["maximum"] = maximum
    return out


def _int(description: str) -> dict[str, Any]:
    """A whole number (bytes, lanes, a generation) or null: written as a JSON integer, never 5.0."""
    return {**_num(description), "type": ["integer", "null"]}


def _obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False,
            "required": list(properties) if required is None else required, "properties": properties}


_STR_OR_NULL = {"type": ["string", "null"]}


def _nest(props: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """[(dotted key, schema)] in row order -> the properties of an object; ``pcie.width`` goes into the
    sub-object ``pcie``, placed where its first member is."""
    out: dict[str, Any] = {}
    groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for key, schema in props:
        head, _, rest = key.partition(".")
        if rest:
            out.setdefault(head, None)
            groups.setdefault(head, []).append((rest, schema))
        else:
            out[head] = schema
    for head, members in groups.items():
        out[head] = _obj(_nest(members))
    return out


def _field(f: Field, doc: str, minimum: float | None, maximum: float | None, legacy: bool = False) -> dict[str, Any]:
    """A row's schema; gpu-metrics says "number" for every reading (its MB are whole, but were never promised so)."""
    if f.kind == "string":
        out: dict[str, Any] = dict(_STR_OR_NULL) if f.nullable else {"type": "string"}
        if f.pattern:
            out["pattern"] = f.pattern
        return out
    if f.kind == "boolean":
        return {"type": "boolean"}
    if not f.nullable:
        return {"type": f.kind, "minimum": minimum}
    return _int(doc) if f.kind == "integer" and not legacy else _num(doc, minimum, maximum)


def gpu_stats_schema(fields: Sequence[Field] = FIELDS) -> dict[str, Any]:
    """One GPU of ``/stats``: the table's rows with a /stats key."""
    return _obj(_nest([(key, _field(f, f.doc, f.minimum, f.maximum)) for f in fields
                       if (key := f.stats_key) is not None]))


def gpu_legacy_schema(fields: Sequence[Field] = FIELDS) -> dict[str, Any]:
    """One GPU of gpu-metrics: the table's rows with a legacy key, in legacy units."""
    return _obj(_nest([(f.legacy.key, _field(f, f.legacy.doc, f.legacy.minimum, f.legacy.maximum, legacy=True))
                       for f in fields if f.legacy is not None]))


def gpu_metrics_schema(fields: Sequence[Field] = FIELDS) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:gpu-exporter:schema:gpu-metrics:v1",
        "title": "GET /api/v1/monitoring/gpu-metrics (legacy units: %, MB = MiB, celsius, W, MHz)",
        **_obj({"timestamp": _TIMESTAMP, "gpus": {"type": "array", "items": gpu_legacy_schema(fields)}}),
    }


GPU_METRICS: dict[str, Any] = gpu_metrics_schema()

_P2P = _obj({
    "backend": {"type": "string"},
    "gpu": {"type": "integer", "minimum": 0},
    "peer": {"type": "integer", "minimum": 0},
    "topology_level": {
        "type": ["string", "null"],
        "description": "internal | single | multiple | hostbridge | node | system (nvidia-smi topo -m)"},
    "p2p": {
        "type": "object", "additionalProperties": {"type": "boolean"},
        "description": "capability -> supported: read, write, atomics, nvlink, xgmi (absent: not reported)"},
})


def stats_schema(fields: Sequence[Field] = FIELDS) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:gpu-exporter:schema:stats:v1",
        "title": "GET /stats and gpu-exporter snapshot --json (SI units, like /metrics)",
        **_obj({
            "timestamp": _TIMESTAMP,
            "host": _obj({
                "node_name": {"type": "string"},
                "processor": {"type": "string"},
                "kernel": {"type": "string"},
                "os": {"type": "string"},
                "driver_version": _STR_OR_NULL,
                "cuda_version": {"type": ["string", "null"],
                                 "description": "CUDA driver version; ROCm version on AMD"},
            }),
            "gpus": {"type": "array", "items": gpu_stats_schema(fields)},
            "p2p": {"type": "array", "items": _P2P},
        }),
    }


STATS: dict[str, Any] = stats_schema()


def _recorded(f: Field) -> dict[str, Any]:
    """What record writes of a sampled field: min/max/mean (and its samples) in the record's unit."""
    r = f.record
    assert r is not None
    out = {k: _num(r.doc, r.minimum, r.maximum) for k in ("min", "max", "mean")}
    if r.samples:
        out["samples"] = {"type": "array", "items": {"type": ["number", "null"]},
                          "description": f"{r.doc}, one per sample (null: not read)".lstrip(", ")}
    return _obj(out)


def record_schema(fields: Sequence[Field] = FIELDS) -> dict[str, Any]:
    """The file ``record -o`` writes; per GPU, the table's rows with a ``record``."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:gpu-exporter:schema:record:v1",
        "title": "gpu-exporter record -o run.json",
        **_obj({
            "command": {"type": "array", "items": {"type": "string"}},
            "exit_code": {"type": ["integer", "null"],
                          "description": "the command's exit status (128 + N after signal N); null: recorded "
                                         "in-process by exporter.Monitor, no command"},
            "started": _TIMESTAMP,
            "interval_seconds": {"type": "number", "exclusiveMinimum": 0},
            "monitoring_duration_seconds": {"type": "number", "minimum": 0},
            "sample_count": {"type": "integer", "minimum": 0},
            "gpu_stats": {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                          "additionalProperties": _obj({
                "name": _STR_OR_NULL,
                "uuid": {"type": "string"},
                **{f.record.key: _recorded(f) for f in fields if f.record is not None},
                "energy_joules": _num("energy used during the run, J (energy counter difference)"),
                "lost": {"type": "boolean", "description": "the GPU was lost (gpu_up 0, or gone from the device "
                         "list) in at least one sample; those samples are null, never 0"},
                "lost_at_seconds": _num("seconds since start of the first sample that found it lost; null: never"),
                "lost_reason": {**_STR_OR_NULL, "description": "why, as the backend reported it"},
            })},
            "timestamps": {"type": "array", "items": {"type": "number"},
                           "description": "seconds since start, one per sample"},
        }),
    }


RECORD: dict[str, Any] = record_schema()

SCHEMAS: dict[str, dict[str, Any]] = {"gpu-metrics": GPU_METRICS, "stats": STATS, "record": RECORD}


def fields_table(fields: Sequence[Field] = FIELDS) -> str:
    """docs/api.md: the GPU field table, and where each view shows each field."""
    rows = ["| field | SI unit | read from | `/stats` | gpu-metrics | `GpuStatus` | record | snapshot | diff |",
            "|---|---|---|---|---|---|---|---|---|"]
    for f in fields:
        stats = "-" if f.stats_key is None else f"`{f.stats_key}`"
        legacy = "-"
        if f.legacy is not None:
            legacy = f"`{f.legacy.key}`" + (f" ({f.legacy.unit})" if f.legacy.unit else "")
        rows.append(f"| `{f.name}` | {f.unit or '-'} | `{f.source}` | {stats} | {legacy} | "
                    f"{'yes' if f.status else '-'} | {f'`{f.record.key}`' if f.record else '-'} | "
                    f"{f.column or '-'} | {f.diff or '-'} |")
    return "\n".join(rows) + "\n"


DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"
PYTHON_API_DOCS = DOCS.with_name("python-api.md")
_SCHEMA_BLOCK = re.compile(r"(<!-- schema: ([\w-]+) -->\s*```json\n)(.*?)(\n```)", re.S)


def render_docs(text: str) -> str:
    """docs/api.md with its generated parts replaced: the GPU field table and each embedded schema."""
    text = render_blocks(text, {"gpu-fields": fields_table()})
    return _SCHEMA_BLOCK.sub(lambda m: m[1] + json.dumps(SCHEMAS[m[2]], indent=2) + m[4], text)


def render_python_api_docs(text: str, fields: Sequence[Field] = FIELDS) -> str:
    """docs/python-api.md with its lists of ``GpuStatus`` and ``Recording`` attributes generated from the table."""
    status = ["index", *(f.name for f in fields if f.status), "score"]
    recorded = [f.name for f in fields if f.record is not None]
    return render_blocks(text, {"status-fields": "".join(f"- `{n}`;\n" for n in status),
                                "recorded-fields": "".join(f"  - `{n}`;\n" for n in recorded)})


def main(argv: list[str]) -> int:
    if argv == ["--write-docs"]:
        DOCS.write_text(render_docs(DOCS.read_text(encoding="utf-8")), encoding="utf-8")
        PYTHON_API_DOCS.write_text(render_python_api_docs(PYTHON_API_DOCS.read_text(encoding="utf-8")),
                                   encoding="utf-8")
        return 0
    if len(argv) != 1 or argv[0] not in SCHEMAS:
        sys.stderr.write(f"usage: python -m exporter.serve.api_schema {{{'|'.join(SCHEMAS)}|--write-docs}}\n")
        return 2
    sys.stdout.write(json.dumps(SCHEMAS[argv[0]], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
