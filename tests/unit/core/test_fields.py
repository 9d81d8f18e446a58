"""Field selection reads the schema: names or globs over family names, the same rules everywhere."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from exporter import backends
from exporter.core import schema
from exporter.core.options import FieldFilter, FieldSelectionError
from tests.harness.exporter import REPO


def test_default_collects_everything_and_publishes_all_but_topology() -> None:
    f = FieldFilter()
    for fam in schema.FAMILIES:
        assert f.enabled(fam.name)
        assert f.exposed(fam.name) == fam.default
    assert not f.exposed("gpu_topology_level") and not f.exposed("gpu_p2p_supported")


def test_include_by_exact_name_selects_that_family_only() -> None:
    f = FieldFilter(include=["gpu_memory_used_bytes"])
    assert f.enabled("gpu_memory_used_bytes") and f.exposed("gpu_memory_used_bytes")
    assert not f.enabled("gpu_memory_total_bytes") and not f.enabled("gpu_power_watts")
    assert f.exposed("gpu_exporter_collector_success")  # self-metrics are always published


def test_include_glob_puts_topology_back() -> None:
    f = FieldFilter(include=["gpu_*"])
    assert f.exposed("gpu_topology_level") and f.exposed("gpu_power_watts")


def test_exclude_wins_and_self_metrics_cannot_be_excluded() -> None:
    f = FieldFilter(include=["gpu_memory_*"], exclude=["gpu_memory_reserved_bytes"])
    assert f.enabled("gpu_memory_used_bytes") and not f.enabled("gpu_memory_reserved_bytes")
    with pytest.raises(FieldSelectionError):  # gpu_exporter_* are not filterable: no family matches
        FieldFilter(exclude=["gpu_exporter_*"])


@pytest.mark.parametrize(("entry", "nearest"), [
    ("gpu_memroy_used_bytes", "gpu_memory_used_bytes"),
    ("gpu_power_wats", "gpu_power_watts"),
    ("gpu_memory_used", "gpu_memory_used_bytes"),
])
def test_unknown_name_names_the_nearest_family(entry: str, nearest: str) -> None:
    with pytest.raises(FieldSelectionError, match=rf"unknown metric family '{entry}'; did you mean {nearest}\?"):
        FieldFilter(include=[entry])


def test_backends_must_ask_with_exact_names() -> None:
    f = FieldFilter()
    with pytest.raises(KeyError, match="unknown metric family"):
        f.enabled("gpu_memory_*")  # a glob from a backend is a bug: it would ignore exact selections


@pytest.mark.parametrize("flag", ["--fields-include", "--fields-exclude"])
def test_check_config_rejects_an_unknown_family(flag: str) -> None:
    res = subprocess.run([sys.executable, "-m", "exporter", "serve", "--check-config", flag,
                          "gpu_utilisation_ratio"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "gpu_utilisation_ratio" in lines[0] and "gpu_utilization_ratio" in lines[0], lines


def test_check_config_reports_each_family_from_the_schema() -> None:
    res = subprocess.run([sys.executable, "-m", "exporter", "serve", "--check-config",
                          "--fields-exclude", "gpu_clock_*"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    families = json.loads(res.stdout)["families"]
    assert set(families) == {f.name for f in schema.FAMILIES}
    assert families["gpu_clock_hertz"] == "off" and families["gpu_clock_max_hertz"] == "off"
    assert families["gpu_topology_level"] == "collected" and families["gpu_power_watts"] == "published"


def test_schema_rows_are_consistent() -> None:
    names = [f.name for f in schema.FAMILIES]
    assert len(names) == len(set(names))
    for f in schema.FAMILIES:
        assert (f.kind == schema.COUNTER) == f.name.endswith("_total"), f.name
        assert f.help and f.unit and f.group, f.name
        assert f.every_backend or any(cls.fills(f.name) for cls in backends.registry().values()), (
            f"{f.name}: no backend declares it in its families")
        assert f.scope in schema.SCOPE_LABELS, f.name
        for unit_word in ("bytes", "celsius", "watts", "joules", "hertz", "seconds"):
            if f.name.removesuffix("_total").endswith(unit_word) and f.unit != "bytes per second":
                assert f.unit == unit_word, f"{f.name}: unit {f.unit}"
        if f.name.endswith("_ratio"):
            assert f.unit == "ratio", f.name


def test_help_text_is_written_only_in_its_row() -> None:
    """No family's help appears anywhere in the package but its schema row: plugins, the renderer and the
    tools take it from ``schema.family(...)`` (implicitly concatenated literals are one constant to ``ast``)."""
    import ast

    texts = {f.help: f.name for f in schema.FAMILIES}
    heads = {h[:40]: n for h, n in texts.items() if len(h) >= 40}
    found = []
    for path in sorted((REPO / "exporter").rglob("*.py")):
        if path.name == "schema.py" and path.parent.name == "core":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                hit = texts.get(node.value) or next((n for h, n in heads.items() if h in node.value), None)
                if hit:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: help of {hit}")
    assert not found, "\n".join(found)


def test_any_enabled_is_true_when_one_family_of_the_group_is_collected() -> None:
    f = FieldFilter(include=["gpu_power_watts"])
    for _ in range(2):  # the second answer comes from the cache: the same
        assert f.any_enabled("gpu_utilization_ratio", "gpu_power_watts") is True
        assert f.any_enabled("gpu_utilization_ratio", "gpu_clock_hertz") is False
        assert f.any_enabled("gpu_power_watts") is True
    g = FieldFilter(exclude=["gpu_clock_*"])
    assert g.any_enabled("gpu_clock_hertz", "gpu_clock_max_hertz") is False
    assert g.any_enabled("gpu_clock_hertz", "gpu_power_watts") is True


def test_a_row_gives_any_vendor_tools_equivalents_none_required() -> None:
    """A row's equivalents are a mapping of vendor tool -> what it shows: a family no nvidia-smi shows leaves it
    out (no placeholder column), a third vendor's tool has its place, and docs/metrics.md's table shows each."""
    row = schema._g("gpu_widget_ratio", schema.GAUGE, "ratio", "Widget activity (0-1).", "utilization",
                    "widget_ratio", "", {"zeta-smi": "zeta-smi --json: widget_pct"})
    assert dict(row.tools) == {"zeta-smi": "zeta-smi --json: widget_pct"}
    assert row.equivalent("nvidia-smi") == "" and row.equivalent("zeta-smi") == "zeta-smi --json: widget_pct"
    with pytest.raises(TypeError):  # the row is frozen, and so are its equivalents
        row.tools["nvidia-smi"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):  # the old fixed (smi, amd) pair of strings
        schema._g("gpu_widget_ratio", schema.GAUGE, "ratio", "h.", "utilization", "widget_ratio", "",
                  "widget.pct", "(none)")  # type: ignore[misc]
    with pytest.raises(TypeError, match="gpu_widget_ratio: the row's equivalents are a mapping"):
        schema._g("gpu_widget_ratio", schema.GAUGE, "ratio", "h.", "utilization", "widget_ratio", "",
                  "widget.pct")  # type: ignore[arg-type]
    hash(row)
    shipped = {f.name: f for f in schema.FAMILIES}
    assert schema.equivalents(shipped["gpu_power_watts"]) == {
        **dict.fromkeys(schema.tool_names(), ""), "nvidia-smi": "power.draw",
        "amd-smi": "amd-smi metric --power: socket_power"}
    # a backend's own tool (Backend.equivalents) adds a key for every family, its text where it gives one
    extra = {"zeta-smi": {"gpu_power_watts": "zeta-smi --json: power_w"}}
    assert schema.equivalents(shipped["gpu_power_watts"], extra)["zeta-smi"] == "zeta-smi --json: power_w"
    assert schema.equivalents(shipped["gpu_up"], extra)["zeta-smi"] == ""
