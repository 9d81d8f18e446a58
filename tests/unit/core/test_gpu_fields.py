"""The GPU field table (exporter.core.views.FIELDS): ``/stats``, gpu-metrics and ``GpuStatus`` are its views.

A row added to the table appears in every view its row names, in each view's unit, and in both JSON schemas
and the docs table, with no other change.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jsonschema
import pytest

from exporter.core.readings import Collection, GpuReading, HostInfo
from exporter.core.snapshot import Snapshot
from exporter.core.views import FIELDS, Field, GpuSource, Legacy, getter, stats_view, status_values
from exporter.python_api.status import GpuStatus, status
from exporter.serve.api import gpu_metrics_view
from exporter.serve.api_schema import (
    DOCS,
    PYTHON_API_DOCS,
    fields_table,
    gpu_metrics_schema,
    render_docs,
    render_python_api_docs,
    stats_schema,
)

FAN = Field("fan_speed_ratio", "ratio", "reading.fan_speed_ratio", digits=6, maximum=1,
            doc="fan speed, 0-1 (nvidia-smi fan.speed / 100)", status=True,
            legacy=Legacy("fan.speed", "percent (nvidia-smi fan.speed)", "percent", 100, digits=1, maximum=100))
TABLE = (*FIELDS, FAN)


def _snap(*gpus: GpuReading) -> Snapshot:
    return Snapshot([Collection("nvml", list(gpus))], HostInfo("node-1", "cpu", "6.1", "Debian"), {}, 1.7e9)


def _views(table: tuple[Field, ...], snap: Snapshot) -> tuple[dict[str, Any], dict[str, Any]]:
    return stats_view(snap, {}, table), gpu_metrics_view(snap, table)


def test_a_field_added_to_the_table_appears_in_each_view() -> None:
    up = GpuReading(index=0, uuid="GPU-0", name="H100", fan_speed_ratio=0.4567891, power_watts=70.0)
    down = GpuReading(index=1, uuid="GPU-1", name="H100", fan_speed_ratio=0.5).down("lost")
    snap = _snap(up, down)
    stats, legacy = _views(TABLE, snap)
    assert [g["fan_speed_ratio"] for g in stats["gpus"]] == [0.456789, None]  # SI, the row's digits
    assert [g["fan"] for g in legacy["gpus"]] == [{"speed": 45.7}, {"speed": None}]  # legacy unit, null while down
    assert status_values(GpuSource("nvml", 0, up), TABLE)["fan_speed_ratio"] == 0.4567891
    assert status_values(GpuSource("nvml", 1, down), TABLE)["fan_speed_ratio"] is None
    # the schemas are generated from the same rows, and the documents conform
    jsonschema.validate(stats, stats_schema(TABLE))
    jsonschema.validate(legacy, gpu_metrics_schema(TABLE))
    gpu = stats_schema(TABLE)["properties"]["gpus"]["items"]
    assert gpu["properties"]["fan_speed_ratio"] == {"type": ["number", "null"], "minimum": 0, "maximum": 1,
                                                    "description": "fan speed, 0-1 (nvidia-smi fan.speed / 100)"}
    assert "fan_speed_ratio" in gpu["required"]
    speed = gpu_metrics_schema(TABLE)["properties"]["gpus"]["items"]["properties"]["fan"]["properties"]["speed"]
    assert speed["maximum"] == 100
    # and the docs table lists it
    row = ("| `fan_speed_ratio` | ratio | `reading.fan_speed_ratio` | `fan_speed_ratio` | `fan.speed` (percent) | yes "
           "| - | - | - |")
    assert row in fields_table(TABLE)
    # without the row, no view has it
    stats, legacy = _views(FIELDS, snap)
    assert "fan_speed_ratio" not in stats["gpus"][0] and "fan" not in legacy["gpus"][0]
    with pytest.raises(jsonschema.ValidationError):  # a view with a key its schema lacks is refused
        jsonschema.validate(_views(TABLE, snap)[0], stats_schema(FIELDS))


def test_gpustatus_declares_exactly_the_rows_marked_status() -> None:
    """GpuStatus's attributes are the table's ``status`` rows (made from the table at import: a row added to
    the table needs no edit of the class), plus the index across backends and the score."""
    attrs = [f.name for f in dataclasses.fields(GpuStatus)]
    assert set(attrs) == {f.name for f in FIELDS if f.status} | {"index", "score"}
    g = GpuReading(index=3, uuid="GPU-3", name="A100", memory_total_bytes=100.0, memory_used_bytes=25.0,
                   utilization_ratio=0.5, temperature_celsius={"gpu": 40.0}, power_watts=90.0)
    s = status(7, g)
    assert (s.index, s.uuid, s.name, s.memory_free_bytes, s.up) == (7, "GPU-3", "A100", 75, True)
    assert s.score == pytest.approx(0.6 * 0.75 + 0.4 * 0.5)
    lost = status(7, g.down("lost"))
    assert (lost.uuid, lost.name, lost.up, lost.memory_total_bytes, lost.power_watts, lost.score) == (
        "GPU-3", "A100", False, None, None, 0.0)


def test_every_source_reads_a_reading() -> None:
    """Each row's path names real attributes: read from a reading with every field set, none raises."""
    g = GpuReading(index=0, uuid="GPU-0", temperature_celsius={"gpu": 1.0}, clock_hertz={"graphics": 1.0})
    src = GpuSource("nvml", 0, g, (1.0, 2.0))
    for f in FIELDS:
        f.read(src)
    assert len({f.name for f in FIELDS}) == len(FIELDS)
    assert len({f.stats_key for f in FIELDS if f.stats_key}) == len([f for f in FIELDS if f.stats_key])
    assert getter("reading.clock_hertz[video]")(src) is None  # a missing key is None, not an error
    with pytest.raises(ValueError, match="not name, name\\(\\) or name\\[key\\]"):
        getter("reading.clock_hertz['video']")


def test_docs_show_the_table_and_the_schemas_of_the_code() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert render_docs(text) == text, "docs/api.md is stale: python -m exporter.serve.api_schema --write-docs"
    text = PYTHON_API_DOCS.read_text(encoding="utf-8")
    assert render_python_api_docs(text) == text, ("docs/python-api.md is stale: "
                                                  "python -m exporter.serve.api_schema --write-docs")
    assert "- `fan_speed_ratio`;\n- `score`;" in render_python_api_docs(text, TABLE)


def test_a_recording_samples_what_the_views_show() -> None:
    """``record``/``Monitor`` sample the table's rows: a derived value (memory used / total, clamped) is the
    one /stats shows, not a second derivation."""
    from exporter.python_api.recording import _Track

    g = GpuReading(index=0, uuid="GPU-0", memory_total_bytes=1e9, memory_used_bytes=1.2e9,  # a driver's overcount
                   temperature_celsius={"gpu": 41.0, "memory": 60.0}, utilization_ratio=0.25)
    track = _Track(0, "GPU-0", None, 0)
    track.add(g, 0.0)
    stats = stats_view(_snap(g), {})["gpus"][0]
    for name in ("memory_used_ratio", "temperature_celsius", "utilization_ratio"):
        assert track.values[name] == [stats[name]], name
    assert stats["memory_used_ratio"] == 1.0


def test_a_status_row_without_an_annotation_is_an_attribute() -> None:
    """A row marked ``status`` that the class does not annotate is an attribute all the same, typed by its kind
    (before, such a row made every GpuStatus(...) call, and so every query_gpus, raise TypeError)."""
    from exporter.python_api.rows import rows_dataclass

    @rows_dataclass([f for f in TABLE if f.status], after="index", row_type=lambda f: f.python_type | None)
    class Status:
        index: int
        score: float
        uuid: str

    names = [f.name for f in dataclasses.fields(Status)]
    assert names == ["index", *(f.name for f in TABLE if f.status), "score"]
    g = GpuReading(index=0, uuid="GPU-0", fan_speed_ratio=0.5)
    s = Status(index=0, **status_values(GpuSource("nvml", 0, g), TABLE), score=0.0)
    assert s.fan_speed_ratio == 0.5 and s.uuid == "GPU-0"  # type: ignore[attr-defined]
    assert dataclasses.fields(Status)[names.index("fan_speed_ratio")].type == float | None
