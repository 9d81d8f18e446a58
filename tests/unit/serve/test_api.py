"""The JSON API of the real `gpu-exporter serve`: /api/v1/monitoring/gpu-metrics and /stats, validated
against the schemas that docs/api.md publishes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from exporter.serve.api_schema import GPU_METRICS, SCHEMAS, STATS
from tests.fakes.fakenvml import FakeNvml
from tests.harness.exporter import REPO, ExporterProcess, parse_samples, sample

API = "/api/v1/monitoring/gpu-metrics"
MIB = 2**20


def get_json(ex: ExporterProcess, path: str, schema: dict[str, Any]) -> dict[str, Any]:
    status, body, headers = ex.get(path)
    assert status == 200, (
        f"{path} answered {status}: is exporter.serve.api.register(server, engine, metrics_path) called by serve?")
    assert headers["Content-Type"] == "application/json"
    doc: dict[str, Any] = json.loads(body)
    jsonschema.validate(doc, schema, format_checker=jsonschema.FormatChecker())
    return doc


pytestmark = pytest.mark.fleet(gpus=3)  # the `fleet` fixture (tests/conftest.py)


@pytest.fixture
def nvml_exporter(fleet: FakeNvml) -> Iterator[ExporterProcess]:
    env = {**fleet.env(), "NODE_NAME": "node-a7"}
    with ExporterProcess(["--backend", "nvml", "--cache-ttl", "0"], env=env) as ex:
        yield ex


def test_gpu_metrics_has_the_fleet_managers_shape_and_values(fleet: FakeNvml,
                                                             nvml_exporter: ExporterProcess) -> None:
    doc = get_json(nvml_exporter, API, GPU_METRICS)
    assert [g["id"] for g in doc["gpus"]] == ["gpu-0", "gpu-1", "gpu-2"]
    for g, raw in zip(doc["gpus"], fleet.gpus, strict=True):
        free = raw["mem_total"] - raw["mem_reserved"] - raw["mem_used"]
        assert g == {
            "id": g["id"], "name": raw["name"], "uuid": raw["uuid"],
            "utilization": raw["util_gpu"],
            "memory": {"total": round(raw["mem_total"] / MIB), "used": round(raw["mem_used"] / MIB),
                       "free": round(free / MIB)},
            "temperature": raw["temp_gpu"],
            "power_usage": pytest.approx(raw["power_mw"] / 1000),
            "clock_speeds": {"graphics": raw["clock_graphics"], "memory": raw["clock_mem"]},
        }
    assert doc["gpus"][0]["memory"]["total"] == 81559  # what nvidia-smi shows as "81559MiB" for this board


def test_unsupported_and_lost_readings_are_null_never_zero(fleet: FakeNvml,
                                                           nvml_exporter: ExporterProcess) -> None:
    get_json(nvml_exporter, API, GPU_METRICS)  # the exporter knows GPU 2 before it falls off the bus
    fleet.unsupported(0, "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature", "nvmlDeviceGetClockInfo")
    fleet.lose(2)
    doc = get_json(nvml_exporter, API, GPU_METRICS)
    g0, g1, g2 = doc["gpus"]
    assert g0["power_usage"] is None and g0["temperature"] is None
    assert g0["clock_speeds"] == {"graphics": None, "memory": None}
    assert g0["utilization"] == fleet.gpus[0]["util_gpu"]  # the rest of GPU 0 is still there
    assert g1["power_usage"] == pytest.approx(fleet.gpus[1]["power_mw"] / 1000)
    assert g2["uuid"] == fleet.gpus[2]["uuid"]
    assert g2["utilization"] is None and g2["memory"]["used"] is None and g2["power_usage"] is None
    stats = get_json(nvml_exporter, "/stats", STATS)
    assert [g["up"] for g in stats["gpus"]] == [True, True, False]


def test_stats_is_the_audit_view(fleet: FakeNvml, nvml_exporter: ExporterProcess) -> None:
    doc = get_json(nvml_exporter, "/stats", STATS)
    host = doc["host"]
    assert host["node_name"] == "node-a7"
    assert host["driver_version"] == fleet.globals["driver_version"] and host["cuda_version"] == "12.4"
    assert host["processor"]
    for g, raw in zip(doc["gpus"], fleet.gpus, strict=True):
        assert g["name"] == raw["name"] and g["index"] == fleet.gpus.index(raw)
        assert g["pci_bus_id"] == raw["bus_id"].lower().replace("00000000:", "0000:")
        assert g["memory_total_bytes"] == raw["mem_total"]
        assert g["memory_used_ratio"] == pytest.approx(raw["mem_used"] / raw["mem_total"], abs=1e-6)
        assert g["pcie"]["generation_max"] == raw["pcie_max_gen"] and g["pcie"]["width"] == raw["pcie_width"]
    levels = {(p["gpu"], p["peer"]): p["topology_level"] for p in doc["p2p"]}
    assert len(levels) == 6 and set(levels.values()) <= {"node", "system"}
    assert all(p["p2p"]["read"] and p["p2p"]["write"] for p in doc["p2p"])


def test_stats_average_power_is_the_energy_counter_over_the_interval(fleet: FakeNvml,
                                                                    nvml_exporter: ExporterProcess) -> None:
    fleet.unsupported(2, "nvmlDeviceGetTotalEnergyConsumption")
    first = get_json(nvml_exporter, "/stats", STATS)
    assert all(g["power_average_watts"] is None for g in first["gpus"])  # one reading: no interval yet
    fleet.set(0, energy_mj=fleet.gpus[0]["energy_mj"] + 3_000_000)  # GPU 0 used 3 kJ
    second = get_json(nvml_exporter, "/stats", STATS)
    g0, g1, g2 = second["gpus"]
    assert g0["power_average_seconds"] > 0
    assert g0["power_average_watts"] * g0["power_average_seconds"] == pytest.approx(3000.0, rel=1e-3)
    assert g1["power_average_watts"] == 0.0  # its counter stood still
    assert g2["power_average_watts"] is None and g2["energy_joules"] is None  # unsupported: null, not 0
    assert g1["power_watts"] == pytest.approx(fleet.gpus[1]["power_mw"] / 1000)  # the sample is separate


def test_api_and_metrics_come_from_the_same_collection() -> None:
    # background mode: every reader gets the one collection, so the numbers must agree exactly
    args = ["--backend", "simulated", "--simulated-gpus", "3", "--collection-interval", "3600"]
    with ExporterProcess(args) as ex:
        api = get_json(ex, API, GPU_METRICS)
        stats = get_json(ex, "/stats", STATS)
        s = parse_samples(ex.scrape_text())
        for g, st in zip(api["gpus"], stats["gpus"], strict=True):
            i = g["id"].removeprefix("gpu-")
            util = sample(s, "gpu_utilization_ratio", gpu=i)
            used = sample(s, "gpu_memory_used_bytes", gpu=i)
            power = sample(s, "gpu_power_watts", gpu=i)
            assert util is not None and used is not None and power is not None
            # /stats rounds ratios to 6 decimals (half a millionth at most)
            assert g["utilization"] == round(util * 100, 2) and st["utilization_ratio"] == pytest.approx(util, abs=5e-7)
            assert g["memory"]["used"] == round(used / MIB)
            assert st["memory_used_bytes"] == pytest.approx(used, abs=1)
            assert g["power_usage"] == pytest.approx(power) and st["power_watts"] == pytest.approx(power)
            assert sample(s, "gpu_info", gpu=i, uuid=g["uuid"]) == 1.0
        assert api["timestamp"] == stats["timestamp"]


def test_live_page_replaces_the_landing_page_and_links_the_metrics_path() -> None:
    with ExporterProcess(["--backend", "simulated", "--metrics-path", "/gpu-metrics"]) as ex:
        status, body, headers = ex.get("/")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        page = body.decode()
        assert 'href="/gpu-metrics"' in page and 'href="/stats"' in page and API in page
        assert "{{" not in page
        # the host's cuda_version is labelled with the real backends' runtimes (nvml's, amdsmi's), not by hand
        assert '· CUDA/ROCm <b data-host="cuda_version">' in page
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "no external assets allowed"


def test_docs_embed_the_schemas_of_the_code() -> None:
    """docs/api.md shows each schema in a ```json block after a `<!-- schema: NAME -->` marker."""
    text = (REPO / "docs" / "api.md").read_text()
    found = dict(re.findall(r"<!-- schema: ([\w-]+) -->\s*```json\n(.*?)\n```", text, flags=re.S))
    assert sorted(found) == sorted(SCHEMAS)
    for name, block in found.items():
        assert json.loads(block) == SCHEMAS[name], f"docs/api.md: schema {name} differs from the code"
        jsonschema.Draft202012Validator.check_schema(SCHEMAS[name])


def test_families_endpoint_reads_the_schema_and_the_selection(tmp_path: Path) -> None:
    from exporter.core.schema import FAMILIES

    with ExporterProcess(["--backend", "simulated", "--fields-exclude", "gpu_clock_*"]) as ex:
        status, body, headers = ex.get("/api/v1/families")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    doc = {f["name"]: f for f in json.loads(body)["families"]}
    assert set(doc) == {f.name for f in FAMILIES}
    assert doc["gpu_clock_hertz"]["state"] == "off"
    assert doc["gpu_topology_level"]["state"] == "collected"
    assert doc["gpu_power_watts"]["state"] == "published"
    assert doc["gpu_power_watts"]["unit"] == "watts" and doc["gpu_power_watts"]["labels"] == ["gpu", "uuid"]
    # an entry per vendor tool the registry knows (the rows' and the backends' own), not fixed columns
    from exporter import backends
    from exporter.core.schema import tool_names

    tools = tool_names(backends.equivalents())
    assert {"nvidia-smi", "amd-smi"} <= set(tools)
    assert all(list(f["equivalents"]) == tools for f in doc.values())
    assert doc["gpu_power_watts"]["equivalents"]["nvidia-smi"] == "power.draw"
    assert doc["gpu_power_watts"]["equivalents"]["amd-smi"] == "amd-smi metric --power: socket_power"
    assert not {"nvidia_smi", "amd_smi"} & set(doc["gpu_power_watts"])
