"""Grafana dashboards, and the rules against a real exporter and a real Prometheus (issue 7).

Static checks of ``dashboards/*.json``: Grafana conventions (current schemaVersion, a
datasource input and variable, node/GPU/vendor variables, stable uids, a unit on every panel
that matches what the query measures), known metric names only, a panel-by-panel description
in ``docs/dashboards.md``, and the Grafana sidecar ConfigMap in ``deploy/base/`` carrying
exactly these files (regenerate it with ``python -m tests.e2e.test_dashboards --write``).

The end-to-end test runs two real exporters (the simulated backend with 5 GPUs, and the NVML
backend over the fake ``libnvidia-ml.so.1`` with a degraded 3-GPU fleet), the real profiler in
dry-run mode, and a real Prometheus scraping them every second and evaluating
``dashboards/rules/``. It checks the recording rules' values against the fleet, that the
alerts fire for exactly the faults injected (and for nothing on the healthy simulated node),
then runs every target expression of every dashboard through ``/api/v1/query`` with the
variables resolved from their own queries, first with every variable at "All", then pinned
to the NVIDIA node. Each query must parse and return data, unless its panel is listed in
``LEGITIMATELY_EMPTY`` with the reason and the metric whose absence makes it empty (when that
metric exists, the panel must have data after all).

Grafana's own time variables are replaced by fixed values, because the test has seconds of
history, not hours: ``$__rate_interval`` -> ``30s`` (30 samples at the 1 s scrape interval),
``$__interval`` -> ``5s``, ``$__range`` -> ``5m``, ``$__range_s`` -> ``300``. Durations of
``for:`` are removed from the alert rules for this test only: they are proven by the promtool
unit tests (tests/e2e/test_rules.py); here the expressions meet real exporter output.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.core.schema import FAMILIES
from tests.e2e.test_rules import RULE_FILES, alerts, rule_groups
from tests.fakes.fakenvml import UNINITIALIZED, FakeNvml, make_sysfs, sysfs_address
from tests.harness.exporter import ExporterProcess, free_port
from tests.harness.poll import wait_until
from tests.harness.prom import Prometheus
from tests.harness.tools import NODE_MODULES, TOOLS, node_package

ROOT = Path(__file__).resolve().parents[2]
DASH_DIR = ROOT / "dashboards"
DOC = ROOT / "docs" / "dashboards.md"
CONFIGMAP = ROOT / "deploy" / "base" / "dashboards-configmap.yaml"
KUSTOMIZATION = ROOT / "deploy" / "base" / "kustomization.yaml"

# File -> uid. uids are part of every bookmark and link to a dashboard: change one on purpose only.
DASHBOARDS = {
    "gpu-fleet-overview.json": "gpu-exporter-fleet",
    "gpu-node-detail.json": "gpu-exporter-node",
    "gpu-workloads.json": "gpu-exporter-workloads",
}
PANEL_TYPES = {"stat", "timeseries", "table", "bargauge", "heatmap", "piechart", "state-timeline"}
# Grafana unit ids the dashboards may use (https://grafana.com/docs/grafana/latest/panels-visualizations/).
UNITS = {"percentunit", "bytes", "watt", "celsius", "hertz", "joule", "s", "h", "short", "none", "Bps",
         "dateTimeAsIso"}
# Every panel, target and query variable names the import input, so that the data source picked
# in Grafana's import dialog is the one they use. The sidecar ConfigMap, which Grafana loads
# without an import dialog, points them at the ${datasource} variable instead (configmaps()).
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
SIDECAR_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Fields Grafana writes that the @grafana/schema types leave out: a query variable's definition
# (the query as shown in the editor). Everything else must match the schema exactly.
UNTYPED_VARIABLE_FIELDS = {"definition"}

# Grafana's time variables, fixed for the test (see the module docstring).
TIME_VARIABLES = {"__rate_interval": "30s", "__interval": "5s", "__range": "5m", "__range_s": "300"}

# Panels that the test fleet cannot fill: (dashboard uid, panel title) -> (metric, reason). The
# metric is what the panel needs; if the fleet has it after all, the panel must return data.
ATTRIBUTION = ("gpu_allocation_info", "needs pod attribution (kubelet pod-resources), which the "
               "test fleet has only when the exporter's attribution and the fake kubelet are present")
LEGITIMATELY_EMPTY: dict[tuple[str, str], tuple[str, str]] = {
    ("gpu-exporter-node", "MIG / partition memory"): (
        "gpu_mig_memory_total_bytes", "needs a MIG-partitioned NVIDIA GPU or a partitioned AMD GPU"),
    ("gpu-exporter-node", "MIG / partition utilisation"): (
        "gpu_mig_utilization_ratio", "needs a MIG-partitioned NVIDIA GPU or a partitioned AMD GPU"),
    # off /metrics by default (N x (N-1) series per node): shown with --fields-include 'gpu_*'
    ("gpu-exporter-node", "Topology"): ("gpu_topology_level", "off /metrics unless --fields-include selects it"),
    ("gpu-exporter-node", "Peer-to-peer support"): (
        "gpu_p2p_supported", "off /metrics unless --fields-include selects it"),
    **{("gpu-exporter-workloads", title): ATTRIBUTION for title in (
        "GPUs allocated", "Allocated GPUs idle", "Idle allocated GPU-hours", "Power of allocated GPUs",
        "Energy of allocated GPUs", "GPUs allocated by namespace", "Power by namespace",
        "Energy by namespace", "Utilisation by namespace", "Idle allocated GPUs by namespace",
        "Allocations", "GPU utilisation by pod", "GPU memory by pod", "Power by pod", "Energy by pod",
        "Allocated GPUs idle for an hour")},
}
# Template variables that may have no values in the test fleet, same format.
EMPTY_VARIABLES: dict[tuple[str, str], tuple[str, str]] = {
    ("gpu-exporter-workloads", "namespace"): ATTRIBUTION,
    ("gpu-exporter-workloads", "pod"): ATTRIBUTION,
}

# Metrics served by the profiler, as Prometheus stores them: from its families' schema rows
# (schema.PROFILER_FAMILIES, which its /metrics writer reads), a histogram as its _sum, _count and _bucket.
def profiler_metrics() -> set[str]:
    from exporter.core import schema

    out: set[str] = set()
    for f in schema.PROFILER_FAMILIES:
        out |= {f.name + x for x in ("_sum", "_count", "_bucket")} if f.kind == "histogram" else {f.name}
    return out


# ---- loading --------------------------------------------------------------------------------------


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DASH_DIR / name).read_text())
    return data


def all_dashboards() -> list[tuple[str, dict[str, Any]]]:
    return [(name, load(name)) for name in DASHBOARDS]


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that shows data (rows excluded, panels of collapsed rows included)."""
    out: list[dict[str, Any]] = []
    for p in dash["panels"]:
        if p["type"] == "row":
            out.extend(p.get("panels", []))
        else:
            out.append(p)
    return out


def variables(dash: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dash["templating"]["list"]}


def known_metric_names() -> set[str]:
    """Every series name the exporter, the profiler and the recording rules produce, plus ``up``."""
    names = {f.name for f in FAMILIES} | {"up"}
    for doc in ("metrics.md", "attribution.md"):
        names |= set(re.findall(r"`(gpu_exporter_\w+)`", (ROOT / "docs" / doc).read_text()))
    served = profiler_metrics()
    assert {"gpu_profile_pattern", "gpu_profiler_cycles_total", "gpu_profiler_cycle_duration_seconds_count"} <= served
    names |= served
    names |= {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}
    return names


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_METRIC = re.compile(r"\b(gpu_\w+|up|[a-z_]+:[a-z0-9_]+:[a-z0-9_]+)\b(?!\s*[=!~]|\s*\()")


def metric_names(expr: str) -> set[str]:
    """Series names an expression selects (label names and functions excluded)."""
    expr = _STRING.sub('""', expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    return set(_METRIC.findall(expr))


# ---- Grafana conventions --------------------------------------------------------------------------


def test_dashboard_files_and_stable_uids() -> None:
    assert {p.name for p in DASH_DIR.glob("*.json")} == set(DASHBOARDS), "list every dashboard in DASHBOARDS"
    uids = {name: load(name)["uid"] for name in DASHBOARDS}
    assert uids == DASHBOARDS, "dashboard uids are stable: bookmarks and links depend on them"
    titles = [load(n)["title"] for n in DASHBOARDS]
    assert len(set(titles)) == len(titles)


@pytest.mark.parametrize("name", DASHBOARDS)
def test_grafana_conventions(name: str) -> None:
    dash = load(name)
    assert dash["schemaVersion"] == grafana_schema()["schemaVersion"], "the schemaVersion Grafana writes today"
    assert dash.get("id") is None, "exported dashboards carry no database id"
    assert "gpu-exporter" in dash["tags"]
    inputs = [i for i in dash["__inputs"] if i["type"] == "datasource"]
    assert [(i["name"], i["pluginId"]) for i in inputs] == [("DS_PROMETHEUS", "prometheus")], "one Prometheus input"

    vs = variables(dash)
    ds = vs["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert ds["current"]["value"] == "${DS_PROMETHEUS}", "the variable starts at the data source picked on import"
    # Nothing refers to the data source any other way.
    refs = set(re.findall(r'"uid": "(\$\{?\w+\}?)"', json.dumps(dash)))
    assert refs <= {"${DS_PROMETHEUS}"}, f"{name}: data source references {refs}"
    for var in ("vendor", "node", "gpu"):
        v = vs[var]
        assert v["type"] == "query" and v["datasource"] == DATASOURCE, f"{name}: ${var}"
        assert v["includeAll"] and v["multi"] and v["allValue"] == ".*", (
            f"{name}: ${var} needs All = .* so that series without the label (no node relabelling) match"
        )
        assert re.fullmatch(r"label_values\(.+, \w+\)", v["definition"]), v["definition"]
        assert v["query"]["query"] == v["definition"]
    # A variable is referenced by some query, or it is decoration.
    exprs = " ".join(t["expr"] for p in panels(dash) for t in p["targets"])
    exprs += " ".join(v.get("definition", "") for v in vs.values())
    for var in vs:
        if var != "datasource":
            assert f"${var}" in exprs, f"{name}: ${var} is never used"


@pytest.mark.parametrize("name", DASHBOARDS)
def test_panels(name: str) -> None:
    dash = load(name)
    ids = [p["id"] for p in dash["panels"]] + [p["id"] for p in panels(dash) if p not in dash["panels"]]
    assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
    titles = [p["title"] for p in panels(dash)]
    assert len(titles) == len(set(titles)), f"{name}: duplicate panel titles"
    for p in panels(dash):
        where = f"{name}: {p['title']!r}"
        assert p["type"] in PANEL_TYPES, f"{where}: panel type {p['type']}"
        assert p["datasource"] == DATASOURCE, f"{where}: use the ${{DS_PROMETHEUS}} input"
        assert len(p.get("description", "")) > 20, f"{where}: describe the panel"
        unit = p["fieldConfig"]["defaults"].get("unit")
        assert unit in UNITS, f"{where}: unit {unit!r} (one of {sorted(UNITS)})"
        assert p["targets"], f"{where}: no query"
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE, f"{where} {t['refId']}"
            assert t["expr"].strip(), f"{where} {t['refId']}: empty expression"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), f"{where}: duplicate refIds"


@pytest.mark.parametrize("name", DASHBOARDS)
def test_layout(name: str) -> None:
    """Panels lie on Grafana's 24-column grid and never overlap."""
    cells: dict[tuple[int, int], str] = {}
    for p in load(name)["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, f"{p['title']}: {g}"
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


_SUFFIX_UNITS = (
    ("_bytes_per_second", "Bps"), ("_ratio", "percentunit"), ("_bytes", "bytes"), ("_watts", "watt"),
    ("_celsius", "celsius"), ("_hertz", "hertz"), ("_seconds", "s"),
    (":ratio", "percentunit"), (":gpu_utilization:avg", "percentunit"),
    (":gpu_availability_score:avg", "percentunit"),
    ("_watts:sum", "watt"), ("_bytes:sum", "bytes"), ("_joules:increase5m", "joule"),
)
# Panels whose unit the suffix rule cannot derive, with the reason.
UNIT_EXCEPTIONS = {
    "Last XID": "a Unix timestamp in milliseconds shown as a date",
    "Idle allocated GPU-hours": "GPU-hours: a GPU count integrated over time",
    "Interconnect links up": "a count of links",
    "Profiler last success": "an age in seconds computed from a timestamp",
}


def expected_unit(expr: str) -> str | None:
    """The unit an expression measures, from Prometheus naming conventions; None when unclear."""
    if re.match(r"\s*count\b", expr) or re.search(r"[<>=]\s*bool\b", expr):
        return "short"  # a count, or a sum of 0/1 comparisons
    if re.search(r"\brate\(\s*gpu_energy_joules_total", expr):
        return "watt"
    if re.search(r"\bincrease\(\s*gpu_energy_joules_total", expr):
        return "joule"
    if re.search(r"\brate\(\s*gpu_\w+_seconds_total", expr):
        return "percentunit"  # seconds per second
    if re.search(r"\b(increase|rate)\(\s*gpu_\w+_total", expr):
        return "short"
    names = [n for n in sorted(metric_names(expr), key=expr.index)
             if n not in ("gpu_info", "gpu_allocation_info", "gpu:allocation_share:ratio")]
    if not names:
        return None
    units = [next((u for s, u in _SUFFIX_UNITS if n.endswith(s)), "short") for n in names]
    if re.search(r"\)\s*/\s*(on|sum|\()", expr) or " / " in expr:
        if len(set(units)) == 1 and len(names) >= 2 and units[0] != "short":
            return "percentunit"  # a quantity over the same quantity
        if "/ sum by (namespace)" in expr:
            return units[0]  # a share-weighted mean keeps the unit
        return None
    return units[0]


@pytest.mark.parametrize("name", DASHBOARDS)
def test_units_match_what_is_measured(name: str) -> None:
    wrong = []
    for p in panels(load(name)):
        if p["title"] in UNIT_EXCEPTIONS:
            continue
        unit = p["fieldConfig"]["defaults"]["unit"]
        for t in p["targets"]:
            exp = expected_unit(t["expr"])
            if exp is not None and exp != unit and not (exp == "short" and unit == "none"):
                wrong.append(f"{p['title']!r} {t['refId']}: unit {unit}, the query measures {exp}")
    assert not wrong, "\n".join(wrong)


def test_unit_rule_derives_units() -> None:
    """Guards the test above: the rule recognises the common shapes."""
    assert expected_unit('(gpu_power_watts{node=~"$node"} and on (instance, gpu, uuid) gpu_info)') == "watt"
    assert expected_unit("rate(gpu_energy_joules_total[5m])") == "watt"
    assert expected_unit("increase(gpu_energy_joules_total[5m])") == "joule"
    assert expected_unit("sum(gpu_memory_used_bytes) / sum(gpu_memory_total_bytes)") == "percentunit"
    assert expected_unit('count(gpu_info{node=~"$node"})') == "short"
    assert expected_unit("gpu_clock_hertz") == "hertz"


def test_metric_names_exist() -> None:
    known = known_metric_names()
    unknown = []
    for name, dash in all_dashboards():
        for p in panels(dash):
            unknown += [f"{name}: {p['title']!r}: {m}"
                        for t in p["targets"] for m in metric_names(t["expr"]) - known]
        for v in variables(dash).values():
            unknown += [f"{name}: ${v['name']}: {m}" for m in metric_names(v.get("definition", "")) - known]
    for rule in (r for g in rule_groups() for r in g["rules"]):
        unknown += [f"rule {rule.get('alert') or rule.get('record')}: {m}"
                    for m in metric_names(str(rule["expr"])) - known]
    assert not unknown, "unknown metric names (typo, or a rename in the exporter):\n" + "\n".join(unknown)
    assert metric_names('sum by (gpu) (gpu_power_watts{gpu="1"}) / on (gpu) node:gpus:count') == {
        "gpu_power_watts", "node:gpus:count"}


def test_allowlists_name_real_panels() -> None:
    by_uid = {load(n)["uid"]: load(n) for n in DASHBOARDS}
    for uid, title in LEGITIMATELY_EMPTY:
        titles = {p["title"] for p in panels(by_uid[uid])}
        assert title in titles, f"LEGITIMATELY_EMPTY: no panel {uid}/{title!r}"
    for uid, var in EMPTY_VARIABLES:
        assert var in variables(by_uid[uid]), f"EMPTY_VARIABLES: no variable {uid}/${var}"
    known = known_metric_names()
    for metric, _ in [*LEGITIMATELY_EMPTY.values(), *EMPTY_VARIABLES.values()]:
        assert metric in known, metric


def test_docs_describe_every_panel() -> None:
    text = DOC.read_text()
    sections = re.split(r"^## ", text, flags=re.M)
    for name, dash in all_dashboards():
        section = next((s for s in sections if s.startswith(dash["title"] + "\n")), None)
        assert section is not None, f"docs/dashboards.md: no section '## {dash['title']}'"
        assert name in section and dash["uid"] in section, f"docs/dashboards.md: name {name} and its uid"
        missing = [p["title"] for p in panels(dash) if f"**{p['title']}**" not in section]
        rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
        missing += [f"row {r}" for r in rows if r not in section]
        assert not missing, f"docs/dashboards.md '{dash['title']}' does not describe: {missing}"


# ---- the ConfigMap -----------------------------------------------------------------------------------


def configmaps() -> list[dict[str, Any]]:
    """One ConfigMap per dashboard, for Grafana's dashboard sidecar."""
    out = []
    for name, uid in DASHBOARDS.items():
        out.append({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"gpu-exporter-dashboard-{uid.removeprefix('gpu-exporter-')}",
                "namespace": "gpu-exporter",
                "labels": {
                    "app.kubernetes.io/name": "gpu-exporter",
                    "app.kubernetes.io/component": "dashboards",
                    "app.kubernetes.io/part-of": "gpu-exporter",
                    "grafana_dashboard": "1",
                },
                "annotations": {"grafana_folder": "GPU"},
            },
            "data": {name: json.dumps(sidecar(load(name)), indent=2, ensure_ascii=False) + "\n"},
        })  # fmt: skip
    return out


def sidecar(dash: dict[str, Any]) -> dict[str, Any]:
    """The dashboard as the Grafana sidecar loads it: no import dialog resolves ${DS_PROMETHEUS}
    there, so every reference goes to the ``datasource`` variable, which starts at Grafana's
    default Prometheus."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (dict(SIDECAR_DATASOURCE) if k == "datasource" and v == DATASOURCE else walk(v))
                    for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    out: dict[str, Any] = walk(dash)
    for v in out["templating"]["list"]:
        if v["type"] == "datasource":
            v.pop("current", None)
    return out


def test_sidecar_copy_uses_the_variable() -> None:
    for name in DASHBOARDS:
        text = json.dumps(sidecar(load(name)))
        assert "DS_PROMETHEUS" not in text.replace('"name": "DS_PROMETHEUS"', "")
        assert '"uid": "${datasource}"' in text


# ---- validation against the current Grafana dashboard schema (npm @grafana/schema) --------------------


@functools.cache
def grafana_schema() -> dict[str, Any]:
    """JSON Schema of the Grafana dashboard model and of each panel plugin's options, generated from
    the TypeScript types of @grafana/schema (tests/e2e/grafana/schema.cjs), cached per version."""
    pkg = node_package("@grafana/schema")
    version = json.loads((pkg / "package.json").read_text())["version"]
    cache = TOOLS / f"grafana-schema-{version}.json"
    if not cache.exists():
        node_package("ts-json-schema-generator")
        proc = subprocess.run(["node", str(ROOT / "tests" / "e2e" / "grafana" / "schema.cjs"), str(NODE_MODULES),
                               str(cache)], capture_output=True, text=True, timeout=240, check=False)
        assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(cache.read_text())
    assert data["version"] == version
    return data


def _optional(schema: Any) -> Any:
    """A panel plugin schema without "required": Grafana fills a plugin's defaults for missing
    options when it loads a panel, while an unknown or misspelt option is silently ignored."""
    if isinstance(schema, dict):
        return {k: _optional(v) for k, v in schema.items() if k != "required"}
    if isinstance(schema, list):
        return [_optional(v) for v in schema]
    return schema


def schema_errors(dash: dict[str, Any]) -> list[str]:
    """Where a dashboard model breaks the current Grafana schema."""
    import jsonschema

    gs = grafana_schema()
    model = {k: v for k, v in dash.items() if not k.startswith("__")}  # export-only keys
    model = json.loads(json.dumps(model))
    for v in model.get("templating", {}).get("list", []):
        for k in UNTYPED_VARIABLE_FIELDS:
            v.pop(k, None)
    errors = [f"/{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(gs["dashboard"]).iter_errors(model)]
    for p in panels(dash):
        plugin = gs["panels"].get(p["type"])
        if plugin is None:
            errors.append(f"{p['title']!r}: no schema for panel type {p['type']}")
            continue
        checks = [("options", plugin["options"], p.get("options", {}))]
        if "fieldConfig" in plugin:
            checks.append(("fieldConfig.defaults.custom", plugin["fieldConfig"],
                           p.get("fieldConfig", {}).get("defaults", {}).get("custom", {})))
        for where, schema, value in checks:
            for e in jsonschema.Draft7Validator(_optional(schema)).iter_errors(value):
                errors.append(f"{p['title']!r} {where}/{'/'.join(map(str, e.absolute_path))}: {e.message}")
    return errors


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboards_match_the_current_grafana_schema(name: str) -> None:
    errors = schema_errors(load(name))
    assert not errors, f"{name}:\n" + "\n".join(errors)


def test_schema_validation_catches_drift() -> None:
    """Guards the test above with the drift issue 19 found: the old table footer, a bad enum."""
    dash = load("gpu-node-detail.json")
    table = next(p for p in panels(dash) if p["type"] == "table")
    table["options"]["footer"] = {"show": False, "reducer": ["sum"], "fields": ""}
    dash["graphTooltip"] = "shared"
    errors = schema_errors(dash)
    assert any("footer" in e for e in errors), errors
    assert any(e.startswith("/graphTooltip") for e in errors), errors


class _BlockDumper(yaml.SafeDumper):
    """The dashboards' JSON as literal blocks, so the ConfigMap diffs like the JSON files."""


def _str_representer(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_BlockDumper.add_representer(str, _str_representer)

CONFIGMAP_HEADER = """\
# GENERATED from dashboards/*.json by `python -m tests.e2e.test_dashboards --write`; do not edit.
# One ConfigMap per dashboard: Grafana's dashboard sidecar (Grafana Helm chart,
# kube-prometheus-stack) loads ConfigMaps labelled grafana_dashboard: "1" from the namespaces
# it searches (sidecar.dashboards.searchNamespace). docs/dashboards.md.
"""


def render_configmaps() -> str:
    return CONFIGMAP_HEADER + yaml.dump_all(configmaps(), Dumper=_BlockDumper, sort_keys=False,
                                            width=1_000_000, allow_unicode=True)


def test_configmap_carries_the_dashboards() -> None:
    assert CONFIGMAP.exists(), f"{CONFIGMAP} missing: python -m tests.e2e.test_dashboards --write"
    committed = [d for d in yaml.safe_load_all(CONFIGMAP.read_text()) if d]
    assert committed == configmaps(), (
        "deploy/base/dashboards-configmap.yaml differs from dashboards/*.json: regenerate it with "
        "`python -m tests.e2e.test_dashboards --write`"
    )
    for cm in committed:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        for text in cm["data"].values():
            json.loads(text)
        # kubectl apply (client side) stores the object in an annotation limited to 256 KiB.
        size = len(json.dumps(cm))
        assert size < 256 * 1024, f"{cm['metadata']['name']}: {size} bytes is too large for kubectl apply"
    assert "dashboards-configmap.yaml" in yaml.safe_load(KUSTOMIZATION.read_text())["resources"]


# ---- end to end: real exporters, real profiler, real Prometheus --------------------------------------------

_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace Grafana variables (``$x``, ``${x}``, ``[[x]]``); an unknown one is an error."""

    def one(m: re.Match[str]) -> str:
        name = next(g for g in m.groups() if g)
        if name not in values:
            raise AssertionError(f"unknown variable ${name} in {expr!r}")
        return values[name]

    return _VAR.sub(one, expr)


def test_substitute() -> None:
    vals = {"node": "a", "namespace": "b", "__range": "5m", "__range_s": "300"}
    assert substitute('x{node=~"$node", namespace=~"${namespace}"}[$__range] * $__range_s', vals) == (
        'x{node=~"a", namespace=~"b"}[5m] * 300')
    with pytest.raises(AssertionError, match="nodes"):
        substitute("x{node=~'$nodes'}", vals)


def resolve_variables(prom: Prometheus, dash: dict[str, Any], pinned: dict[str, str],
                      present: set[str]) -> dict[str, str]:
    """Run each variable's query as Grafana would; pinned ones take the given value, others All."""
    values = dict(TIME_VARIABLES)
    for v in dash["templating"]["list"]:
        if v["type"] == "datasource":
            values[v["name"]] = "unused"
            continue
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["definition"])
        assert m, v["definition"]
        selector, label = substitute(m.group(1), values), m.group(2)
        series = prom.query(f"group by ({label}) ({selector})")
        found = sorted({s["metric"].get(label, "") for s in series} - {""})
        allowed = EMPTY_VARIABLES.get((dash["uid"], v["name"]))
        if not found and not (allowed and allowed[0] not in present):
            raise AssertionError(f"{dash['uid']}: variable ${v['name']} ({v['definition']}) has no values")
        if v["name"] in pinned:
            assert pinned[v["name"]] in found, f"${v['name']}: {pinned[v['name']]!r} not among {found}"
            # Grafana escapes regex characters for =~, doubling the backslash inside the PromQL string.
            values[v["name"]] = re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", pinned[v["name"]])
        else:
            values[v["name"]] = v["allValue"] if v.get("includeAll") else found[0]
    return values


def empty_panels(prom: Prometheus, pinned: dict[str, str]) -> list[str]:
    """Run every target of every dashboard; return what failed to parse or came back empty."""
    present = {m for m in ("gpu_allocation_info", "gpu_mig_memory_total_bytes", "gpu_mig_utilization_ratio")
               if prom.query(f"count({m})")}
    problems = []
    for _, dash in all_dashboards():
        values = resolve_variables(prom, dash, pinned, present)
        for p in panels(dash):
            allowed = LEGITIMATELY_EMPTY.get((dash["uid"], p["title"]))
            for t in p["targets"]:
                expr = substitute(t["expr"], values)
                where = f"{dash['uid']} / {p['title']!r} / {t['refId']}"
                try:
                    result = prom.query(expr)
                except Exception as exc:  # noqa: BLE001 - every failure is reported together
                    problems.append(f"{where}: {exc}")
                    continue
                if not result and not (allowed and allowed[0] not in present):
                    problems.append(f"{where}: no data for {expr}")
    return problems


def _strip_for(tmp: Path) -> list[Path]:
    """Copies of the rule files with every ``for:`` removed (see the module docstring)."""
    out = []
    for path in RULE_FILES:
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                rule.pop("for", None)
        copy = tmp / path.name
        copy.write_text(yaml.safe_dump(doc, sort_keys=False))
        out.append(copy)
    return out


def _value(res: list[dict[str, Any]]) -> float:
    assert len(res) == 1, res
    return float(res[0]["value"][1])


def _close(expected: float) -> Any:
    return lambda res: len(res) == 1 and math.isclose(_value(res), expected, rel_tol=1e-6, abs_tol=1e-9)


@contextlib.contextmanager
def _fake_kubelet(fleet: FakeNvml) -> Iterator[list[str]]:
    """Exporter flags for pod attribution through the fake kubelet, if both exist in this checkout.

    GPU 0 is held by ml/train, GPU 1 is time-sliced between web/infer-a and web/infer-b.
    """
    try:
        from tests.fakes import kubelet as kubelet_fake
    except ImportError:
        yield []
        return
    u0, u1 = fleet.gpus[0]["uuid"], fleet.gpus[1]["uuid"]
    with kubelet_fake.FakeKubelet() as kubelet:
        kubelet.set_response(kubelet_fake.response([
            kubelet_fake.pod("ml", "train", {"main": [("nvidia.com/gpu", [u0])]}),
            kubelet_fake.pod("web", "infer-a", {"server": [("nvidia.com/gpu.shared", [f"{u1}::0"])]}),
            kubelet_fake.pod("web", "infer-b", {"server": [("nvidia.com/gpu.shared", [f"{u1}::1"])]}),
        ]))  # fmt: skip
        yield ["--pod-attribution", "on", "--pod-resources-socket", kubelet.path,
               "--pod-resources-interval", "1"]


def _firing(prom: Prometheus) -> list[dict[str, str]]:
    return [{**a["labels"]} for a in prom.alerts() if a["state"] == "firing"]


def _match(expected: list[dict[str, str]], firing: list[dict[str, str]]) -> tuple[list[Any], list[Any]]:
    """(expected alerts not firing, firing alerts not expected); an expectation is a label subset."""
    missing = [e for e in expected if not any(e.items() <= f.items() for f in firing)]
    extra = [f for f in firing if not any(e.items() <= f.items() for e in expected)]
    return missing, extra


@pytest.mark.prometheus
def test_rules_and_every_dashboard_query_against_real_prometheus(tmp_path: Path) -> None:
    # A degraded NVIDIA node: GPU 0 hot, thermally throttled, power-braked, its memory nearly
    # full with a row remap pending and one failed; GPU 1 idle and power-capped (the fake's
    # default reason for odd GPUs); GPU 2 lost later; one more NVIDIA GPU on the PCI bus than
    # NVML sees (fell off the bus).
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=3, fans=1)
    g0 = fleet.gpus[0]
    fleet.set(0, temp_gpu=95, clocks_event_reasons=0x20 | 0x80, remap_pending=1, remap_failure=1,
              mem_used=g0["mem_total"] - g0["mem_reserved"] - 2**30)
    fleet.set(1, util_gpu=0)
    make_sysfs(tmp_path / "sys", [(sysfs_address(g["bus_id"]), 0x10DE, 0x030200) for g in fleet.gpus]
               + [("0000:5d:00.0", 0x10DE, 0x030200)])
    rules = _strip_for(tmp_path)
    dead = free_port()  # a target nobody listens on: GPUExporterDown
    prof_port = free_port()

    with contextlib.ExitStack() as stack:
        attribution = stack.enter_context(_fake_kubelet(fleet))
        sim = stack.enter_context(ExporterProcess(["--backend", "simulated", "--simulated-gpus", "5"],
                                                  env={"NODE_NAME": "sim-node"}, wait=False))
        nv = stack.enter_context(ExporterProcess(
            ["--backend", "nvml", "--sysfs-root", str(tmp_path / "sys"), "--pcie-throughput", *attribution],
            env={**fleet.env(), "NODE_NAME": "nv-node"}, wait=False))
        sim.wait_healthy()
        nv.wait_healthy()
        scrape: list[dict[str, Any]] = [
            {"job_name": "gpu-exporter", "honor_labels": True, "static_configs": [
                {"targets": [f"127.0.0.1:{sim.port}"], "labels": {"node": "sim-node"}},
                {"targets": [f"127.0.0.1:{nv.port}"], "labels": {"node": "nv-node"}},
                {"targets": [f"127.0.0.1:{dead}"], "labels": {"node": "dead-node"}},
            ]},
            {"job_name": "gpu-exporter-profiler",
             "static_configs": [{"targets": [f"127.0.0.1:{prof_port}"]}]},
        ]  # fmt: skip
        prom = stack.enter_context(
            Prometheus(tmp_path / "prom", extra_scrape_configs=scrape, rule_files=rules))
        prom.wait_for('gpu_up{node="nv-node", gpu="2"} == 1', timeout=30)
        prom.wait_for('gpu_ecc_errors_total{node="nv-node", gpu="0", error_type="uncorrected"} == 0')
        prom.wait_for('gpu_utilization_ratio{node="sim-node"}')

        # The profiler classifies from this Prometheus; no cluster: it plans and prints (dry run).
        env = {**os.environ, "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        profiler = subprocess.Popen(
            [sys.executable, "-m", "exporter", "profile", "--prometheus-url", prom.url, "--dry-run",
             "--interval", "2s", "--window", "5m", "--listen-address", "127.0.0.1",
             "--listen-port", str(prof_port)],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=(tmp_path / "profiler.log").open("w"))
        stack.callback(profiler.wait, 10)
        stack.callback(profiler.terminate)

        # Faults that need history: an ECC counter that moves, XIDs, a GPU lost mid-run.
        fleet.set(0, ecc_uncorrected_volatile=2, ecc_uncorrected_aggregate=2)
        fleet.queue_xid(0, 79)
        fleet.queue_xid(1, 13)  # an application error: no alert
        fleet.lose(2)

        # -- recording rules, against values computed from the fleet --------------------------
        g0, g1 = fleet.gpus[0], fleet.gpus[1]
        prom.wait_for('node:gpus:count{node="nv-node", vendor="nvidia"}', _close(3))
        prom.wait_for('node:gpus_up:sum{node="nv-node", vendor="nvidia"}', _close(2))
        prom.wait_for('node:gpu_utilization:avg{node="nv-node", vendor="nvidia"}',
                      _close((g0["util_gpu"] + g1["util_gpu"]) / 2 / 100))
        prom.wait_for('node:gpu_power_watts:sum{node="nv-node", vendor="nvidia"}',
                      _close((g0["power_mw"] + g1["power_mw"]) / 1000))
        free1 = g1["mem_total"] - g1["mem_reserved"] - g1["mem_used"]
        prom.wait_for('gpu:availability_score:ratio{node="nv-node", gpu="1"}',
                      _close(0.6 * free1 / g1["mem_total"] + 0.4 * (1 - g1["util_gpu"] / 100)))
        prom.wait_for('node:gpu_utilization:avg{node="sim-node", vendor="simulated"}')
        attributed = bool(prom.query("count(gpu_allocation_info)"))
        if attributed:
            prom.wait_for('namespace:gpu_power_watts:sum{namespace="ml"}', _close(g0["power_mw"] / 1000))
            prom.wait_for('namespace:gpu_power_watts:sum{namespace="web"}', _close(g1["power_mw"] / 1000))
            prom.wait_for('namespace:gpu_allocated:sum{namespace="web"}', _close(1.0))

        # -- alerts: exactly the injected faults fire, nothing on the healthy simulated node ---------
        nv_gpu = {"node": "nv-node", "job": "gpu-exporter"}
        expected = [
            {"alertname": "GPUExporterDown", "node": "dead-node"},
            {"alertname": "GPULost", **nv_gpu, "gpu": "2"},
            {"alertname": "GPUFellOffTheBus", **nv_gpu, "vendor": "nvidia"},
            {"alertname": "GPUTemperatureHigh", **nv_gpu, "gpu": "0", "sensor": "gpu"},
            {"alertname": "GPUThermalThrottling", **nv_gpu, "gpu": "0", "reason": "sw_thermal_slowdown"},
            {"alertname": "GPUHardwareSlowdown", **nv_gpu, "gpu": "0", "reason": "hw_power_brake_slowdown"},
            {"alertname": "GPUPowerCapped", **nv_gpu, "gpu": "1", "reason": "sw_power_cap"},
            {"alertname": "GPUUncorrectableEccErrors", **nv_gpu, "gpu": "0"},
            {"alertname": "GPURowRemapPending", **nv_gpu, "gpu": "0"},
            {"alertname": "GPURowRemapFailed", **nv_gpu, "gpu": "0"},
            {"alertname": "GPUCriticalXid", **nv_gpu, "gpu": "0", "xid": "79"},
            {"alertname": "GPUMemoryNearlyFull", **nv_gpu, "gpu": "0"},
        ]
        if attributed:
            expected += [{"alertname": "GPUAllocatedButIdle", **nv_gpu, "gpu": "1", "pod": p}
                         for p in ("infer-a", "infer-b")]
        # Settle: the profiler's target is down until its process listens (GPUProfilerDown, rightly).
        prom.wait_for_up("gpu-exporter-profiler")
        with contextlib.suppress(AssertionError):  # the assertion below says what differs
            wait_until(lambda: _match(expected, _firing(prom)) == ([], []), timeout=30, interval=0.2)
        missing, extra = _match(expected, _firing(prom))
        assert not missing and not extra, f"alerts not firing: {missing}\nunexpected alerts: {extra}"
        assert {a["alert"] for a in alerts()} >= {e["alertname"] for e in expected}

        # Every rule evaluated without error (a many-to-many join fails only at evaluation).
        def evaluated() -> list[dict[str, Any]] | None:
            rs = [r for g in prom.rules() for r in g["rules"]]
            return rs if all(r["health"] != "unknown" for r in rs) else None

        rs = wait_until(evaluated, timeout=10, what="every rule evaluated once")
        bad = [f"{r['name']}: {r.get('lastError')}" for r in rs if r["health"] != "ok"]
        assert not bad, bad

        # -- every dashboard query: All, then pinned to the NVIDIA node ----------------------------
        prom.wait_for('gpu_profile_pattern{node="nv-node"}', timeout=30)
        # Subqueries ([5m:$__interval]) evaluate at steps aligned to multiples of $__interval: let
        # the series and the recording rules be older than one step (10 s of 1 s samples).
        for series in ('gpu_utilization_ratio{node="nv-node", gpu="0"}',
                       'node:gpu_utilization:avg{node="nv-node"}',
                       *(["gpu:allocation_share:ratio"] if attributed else [])):
            prom.wait_for(f"min(count_over_time({series}[1m])) >= 10", timeout=20)
        problems = empty_panels(prom, pinned={})
        problems += [f"[vendor=nvidia, node=nv-node] {p}"
                     for p in empty_panels(prom, pinned={"vendor": "nvidia", "node": "nv-node"})]
        assert not problems, "\n".join(problems)

        # -- finally the driver goes away: the collection fails and says so -------------------------
        fleet.fail("nvmlDeviceGetCount_v2", UNINITIALIZED)
        prom.wait_for('ALERTS{alertname="GPUExporterCollectionFailing", alertstate="firing", node="nv-node"}',
                      timeout=20)
        assert not prom.query('ALERTS{alertname="GPUExporterCollectionFailing", node="sim-node"}')


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.e2e.test_dashboards --write  (regenerates the dashboards ConfigMap)")
    CONFIGMAP.write_text(render_configmaps())
    print(f"wrote {CONFIGMAP.relative_to(ROOT)}")
