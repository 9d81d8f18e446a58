"""Grafana dashboard 12239 (dcgm-exporter's) on our exporter, through dashboards/rules/compat-dcgm.yaml.

The dashboard's queries are transcribed, with their source, in
``tests/fixtures/dashboards/dcgm-12239.json``. A real Prometheus scrapes the NVML backend over
the fake ``libnvidia-ml.so.1`` (an H100 fleet, GPM supported) and evaluates the compatibility
rules; each template variable is resolved from its own query as Grafana would, and each panel's
query must return data, with every variable at "All" and then pinned to one host and GPU.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.fakenvml import GPM_ANY_TENSOR_UTIL, FakeNvml
from tests.harness.exporter import ExporterProcess
from tests.harness.poll import wait_until
from tests.harness.prom import Prometheus

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "dashboards" / "dcgm-12239.json"
COMPAT_RULES = ROOT / "dashboards" / "rules" / "compat-dcgm.yaml"


def dashboard() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


def test_fixture_names_its_source_and_covers_every_panel() -> None:
    d = dashboard()
    assert d["source"]["gnetId"] == 12239 and re.fullmatch(r"[0-9a-f]{40}", d["source"]["commit"])
    assert [p["title"] for p in d["panels"]] == [
        "GPU Temperature", "GPU Avg. Temp", "GPU Power Usage", "GPU Power Total", "GPU SM Clocks",
        "GPU Utilization", "Tensor Core Utilization", "GPU Framebuffer Mem Used"]
    names = {m for p in d["panels"] for m in re.findall(r"\bDCGM_FI_\w+", p["expr"])}
    names |= {m for v in d["variables"] for m in re.findall(r"\bDCGM_FI_\w+", v["query"])}
    recorded = set(re.findall(r"- record: (DCGM_FI_\w+)", COMPAT_RULES.read_text()))
    assert names <= recorded, f"queried but not recorded: {sorted(names - recorded)}"


def _substitute(expr: str, values: dict[str, str]) -> str:
    return re.sub(r"\$(\w+)", lambda m: values[m.group(1)], expr)


def _resolve(prom: Prometheus, pinned: dict[str, str]) -> dict[str, str]:
    """Variables as Grafana resolves them: label_values(), then All = (v1|v2|...) or the pinned value."""
    values: dict[str, str] = {}
    for v in dashboard()["variables"]:
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"])
        assert m, v["query"]
        selector, label = _substitute(m.group(1), values), m.group(2)
        found = sorted({s["metric"].get(label, "") for s in prom.query(f"group by ({label}) ({selector})")} - {""})
        assert found, f"${v['name']} ({v['query']}) has no values"
        if v["name"] in pinned:
            assert pinned[v["name"]] in found, (v["name"], found)
            found = [pinned[v["name"]]]
        # Grafana escapes regex characters for =~, doubling the backslash inside the PromQL string.
        values[v["name"]] = "(" + "|".join(re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", x) for x in found) + ")"
    return values


def _empty_panels(prom: Prometheus, pinned: dict[str, str]) -> list[str]:
    values = _resolve(prom, pinned)
    return [f"{p['title']}: {_substitute(p['expr'], values)}" for p in dashboard()["panels"]
            if not prom.query(_substitute(p["expr"], values))]


@pytest.mark.prometheus
def test_dashboard_12239_shows_data_on_our_series(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2)
    with ExporterProcess(["--backend", "nvml"], env={**fleet.env(), "NODE_NAME": "nv-node"}) as ex:
        scrape = [{"job_name": "gpu-exporter", "static_configs": [
            {"targets": [f"127.0.0.1:{ex.port}"], "labels": {"node": "nv-node"}}]}]
        with Prometheus(tmp_path / "prom", extra_scrape_configs=scrape, rule_files=[COMPAT_RULES]) as prom:
            # GPM metrics need two samples, so they appear from the second scrape on.
            prom.wait_for('DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname="nv-node", gpu="1"}', timeout=30)
            prom.wait_for('DCGM_FI_DEV_FB_FREE{Hostname="nv-node", gpu="1"}', timeout=30)
            wait_until(lambda: not _empty_panels(prom, {}), timeout=10, interval=0.5,
                       what="every panel of dashboard 12239 with data")
            assert not _empty_panels(prom, {"Hostname": "nv-node", "gpu": "1"})
            # The values are ours, in dcgm-exporter's units.
            g1 = fleet.gpus[1]
            temp = prom.value('max(DCGM_FI_DEV_GPU_TEMP{Hostname="nv-node", gpu="1"}) by (Hostname, gpu, uuid)')
            assert temp == g1["temp_gpu"]
            used = prom.value('DCGM_FI_DEV_FB_USED{Hostname="nv-node", gpu="1"}')
            assert used == pytest.approx(g1["mem_used"] / 2**20)
            tensor = prom.value('DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname="nv-node", gpu="1"}')
            assert tensor == pytest.approx(g1["gpm"][GPM_ANY_TENSOR_UTIL] / 100)
