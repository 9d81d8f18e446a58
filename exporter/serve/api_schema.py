"""JSON schemas (draft 2020-12) of the JSON API and of the files the CLI tools write.

This module is the single source: ``docs/api.md`` embeds these schemas verbatim and a test
checks that the two agree; the tests validate every response and file against them.
Print one with ``python -m exporter.serve.api_schema gpu-metrics|stats|record``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

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

GPU_METRICS: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "urn:gpu-exporter:schema:gpu-metrics:v1",
    "title": "GET /api/v1/monitoring/gpu-metrics (legacy units: %, MB = MiB, celsius, W, MHz)",
    **_obj({
        "timestamp": _TIMESTAMP,
        "gpus": {"type": "array", "items": _obj({
            "id": {"type": "string", "pattern": "^gpu-[0-9]+$"},
            "name": _STR_OR_NULL,
            "uuid": {"type": "string"},
            "utilization": _num("GPU utilisation, percent 0-100 (nvidia-smi utilization.gpu)", 0, 100),
            "memory": _obj({
                "total": _num("framebuffer memory, MB = MiB (nvidia-smi memory.total [MiB])"),
                "used": _num("MB = MiB (nvidia-smi memory.used [MiB])"),
                "free": _num("MB = MiB (nvidia-smi memory.free [MiB])"),
            }),
            "temperature": _num("GPU die sensor, celsius (nvidia-smi temperature.gpu; amd-smi edge)", None),
            "power_usage": _num("board power draw, W (nvidia-smi power.draw)"),
            "clock_speeds": _obj({
                "graphics": _num("MHz (nvidia-smi clocks.gr)"),
                "memory": _num("MHz (nvidia-smi clocks.mem)"),
            }),
        })},
    }),
}

_GPU_STATS = _obj({
    "backend": {"type": "string"},
    "index": {"type": "integer", "minimum": 0},
    "uuid": {"type": "string"},
    "name": _STR_OR_NULL,
    "vendor": {"type": "string"},
    "up": {"type": "boolean"},
    "pci_bus_id": _STR_OR_NULL,
    "serial": _STR_OR_NULL,
    "driver_version": _STR_OR_NULL,
    "cuda_version": _STR_OR_NULL,
    "memory_total_bytes": _int("bytes (nvidia-smi memory.total)"),
    "memory_used_bytes": _int("bytes (nvidia-smi memory.used)"),
    "memory_free_bytes": _int("bytes (nvidia-smi memory.free)"),
    "memory_used_ratio": _num("memory used / total, 0-1", 0, 1),
    "utilization_ratio": _num("GPU utilisation, 0-1 (nvidia-smi utilization.gpu / 100)", 0, 1),
    "temperature_celsius": _num("GPU die sensor, celsius", None),
    "power_watts": _num("instantaneous power draw, W (nvidia-smi power.draw)"),
    "power_average_watts": _num("average power over the last interval, W: energy counter difference / time"),
    "power_average_seconds": _num("length of that interval, s"),
    "power_limit_watts": _num("W (nvidia-smi power.limit)"),
    "energy_joules": _num("energy counter since driver load, J"),
    "pcie": _obj({
        "generation": _int("current link generation (nvidia-smi pcie.link.gen.current)"),
        "generation_max": _int("max link generation (nvidia-smi pcie.link.gen.max)"),
        "width": _int("current link width, lanes (nvidia-smi pcie.link.width.current)"),
        "width_max": _int("max link width, lanes (nvidia-smi pcie.link.width.max)"),
    }),
})

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

STATS: dict[str, Any] = {
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
        "gpus": {"type": "array", "items": _GPU_STATS},
        "p2p": {"type": "array", "items": _P2P},
    }),
}

_AGG = _obj({"min": _num("", None), "max": _num("", None), "mean": _num("", None)})

RECORD: dict[str, Any] = {
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
            "utilization": _obj({
                "min": _num("percent", 0, 100), "max": _num("percent", 0, 100),
                "mean": _num("percent", 0, 100),
                "samples": {"type": "array", "items": {"type": ["number", "null"]},
                            "description": "percent, one per sample (null: not read)"},
            }),
            "memory_used_mb": _AGG,
            "memory_usage_percent": _AGG,
            "temperature_c": _AGG,
            "power_draw_w": _AGG,
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

SCHEMAS: dict[str, dict[str, Any]] = {"gpu-metrics": GPU_METRICS, "stats": STATS, "record": RECORD}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in SCHEMAS:
        sys.stderr.write(f"usage: python -m exporter.serve.api_schema {{{'|'.join(SCHEMAS)}}}\n")
        return 2
    sys.stdout.write(json.dumps(SCHEMAS[argv[0]], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
