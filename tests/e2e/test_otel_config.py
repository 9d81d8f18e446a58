"""Issue 38, item 20: the OpenTelemetry Collector configuration in docs/deploy.md.

No Collector binary comes from the registries the tests may use, so the file is checked against the
Collector's documented configuration structure (https://opentelemetry.io/docs/collector/configuration/):
top-level sections; components defined under receivers/processors/exporters/extensions/connectors by
``type[/name]``; ``service.pipelines.<signal>[/name]`` listing only defined components, and at least
one receiver and one exporter each; and the ``prometheus`` receiver (collector-contrib,
receiver/prometheusreceiver) holding a Prometheus configuration under ``config``. Its scrape job must be
deploy/prometheus/scrape-config.yaml's, once the Collector's ``$$`` escape is undone, so the relabel
replay of tests/e2e/test_deploy.py covers it. The hw.gpu.* table names only families we publish.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from exporter.core.schema import FAMILY_BY_NAME
from tests.e2e.test_deploy import _SCRAPE_KEYS

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "deploy.md").read_text()
SECTION = DOC[DOC.index("## OpenTelemetry Collector"):DOC.index("## Grafana")]
TOP = {"receivers", "processors", "exporters", "extensions", "connectors", "service"}
COMPONENT_ID = re.compile(r"^[a-z][a-z0-9_]*(/[^\s/]+)?$")
SIGNALS = {"metrics", "traces", "logs"}
# OpenTelemetry semantic conventions for hardware (status Development): the GPU names the table may use
OTEL_NAMES = {"hw.gpu.utilization", "hw.gpu.memory.usage", "hw.gpu.memory.limit", "hw.gpu.io", "hw.status",
              "hw.errors"}


def collector_config() -> dict[str, Any]:
    (block,) = re.findall(r"```yaml\n(# otel-collector.yaml.*?)```", SECTION, re.S)
    doc = yaml.safe_load(block)
    assert isinstance(doc, dict)
    return doc


def shape_errors(cfg: dict[str, Any]) -> list[str]:
    """Where ``cfg`` leaves the Collector's documented structure."""
    errors = [f"unknown section {k}" for k in cfg if k not in TOP]
    defined: dict[str, set[str]] = {}
    for section in TOP - {"service"}:
        comps = cfg.get(section) or {}
        if not isinstance(comps, dict):
            errors.append(f"{section} is not a mapping")
            continue
        for cid, conf in comps.items():
            if not COMPONENT_ID.match(str(cid)):
                errors.append(f"{section}: bad component id {cid!r}")
            if conf is not None and not isinstance(conf, dict):
                errors.append(f"{section}.{cid}: settings are not a mapping")
        defined[section] = set(map(str, comps))
    pipelines = (cfg.get("service") or {}).get("pipelines") or {}
    if not pipelines:
        errors.append("service.pipelines is empty")
    for pid, pipe in pipelines.items():
        if str(pid).split("/", 1)[0] not in SIGNALS:
            errors.append(f"pipeline {pid}: not metrics, traces or logs")
        for role in ("receivers", "exporters"):
            if not pipe.get(role):
                errors.append(f"pipeline {pid}: no {role}")
        for role in ("receivers", "processors", "exporters"):
            for cid in pipe.get(role) or []:
                if cid not in defined.get(role, set()) | defined.get("connectors", set()):
                    errors.append(f"pipeline {pid}: {role} {cid} is not defined")
    return errors


def test_shape_check_catches_the_usual_mistakes() -> None:
    good = collector_config()
    assert shape_errors(good) == []
    bad = {**good, "service": {"pipelines": {"metrics": {"receivers": ["prometheus"], "exporters": ["otlphttp"]}}}}
    assert shape_errors(bad) == ["pipeline metrics: exporters otlphttp is not defined"]
    assert shape_errors({**good, "exporter": {}}) == ["unknown section exporter"]
    assert "pipeline metric: not metrics, traces or logs" in shape_errors(
        {**good, "service": {"pipelines": {"metric": good["service"]["pipelines"]["metrics"]}}})


def test_the_collector_config_has_the_documented_shape() -> None:
    cfg = collector_config()
    assert shape_errors(cfg) == []
    assert cfg["service"]["pipelines"]["metrics"]["receivers"] == ["prometheus"]


def test_its_scrape_job_is_the_shipped_one() -> None:
    jobs = collector_config()["receivers"]["prometheus"]["config"]["scrape_configs"]
    (shipped,) = yaml.safe_load((ROOT / "deploy" / "prometheus" / "scrape-config.yaml").read_text())["scrape_configs"]
    unescaped = yaml.safe_load(yaml.safe_dump(jobs).replace("$$", "$"))
    assert unescaped == [shipped]
    for job in jobs:
        assert set(job) <= _SCRAPE_KEYS, set(job) - _SCRAPE_KEYS


def test_hw_gpu_table_maps_published_families_and_says_development() -> None:
    rows = [ln for ln in SECTION.splitlines() if ln.startswith("| `hw.")]
    assert {re.match(r"\| `([^`]+)`", r).group(1) for r in rows if re.match(r"\| `([^`]+)`", r)} == OTEL_NAMES
    for row in rows:
        ours = re.findall(r"`(gpu_[a-z0-9_]+)`", row.split("|")[3])
        assert ours and all(f in FAMILY_BY_NAME for f in ours), row
    assert "**Development**" in SECTION
