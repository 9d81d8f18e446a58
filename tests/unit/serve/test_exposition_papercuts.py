"""Issue 28, findings 5 and 14: process_* self-metrics, OpenMetrics # UNIT lines, and a
docs/metrics.md that agrees with itself and with the program."""

from __future__ import annotations

import re
import time

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from exporter.backends import support_table
from exporter.core.schema import FAMILIES, FAMILY_BY_NAME
from exporter.serve.config import SPECS
from tests.harness.exporter import REPO, ExporterProcess, parse_samples, sample
from tests.harness.prom import check_metrics

OPENMETRICS = {"Accept": "application/openmetrics-text; version=1.0.0"}
PROCESS = ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
           "process_start_time_seconds", "process_open_fds", "process_max_fds")


def test_process_self_metrics_and_units() -> None:
    started = time.time()
    with ExporterProcess(["--backend", "simulated"]) as ex:
        text = ex.scrape_text()
        status, body, _ = ex.get("/metrics", OPENMETRICS)
    assert check_metrics(text) == [], "promtool check metrics"
    s = parse_samples(text)
    for name in PROCESS:
        assert sample(s, name) is not None, f"{name} missing"
    assert 1 << 20 < sample(s, "process_resident_memory_bytes") < 1 << 30  # type: ignore[operator]
    assert started - 60 < sample(s, "process_start_time_seconds") <= time.time()  # type: ignore[operator]
    assert 0 < sample(s, "process_open_fds") <= sample(s, "process_max_fds")  # type: ignore[operator]
    assert sample(s, "process_cpu_seconds_total") >= 0  # type: ignore[operator]
    # OpenMetrics: a # UNIT line for every family whose name ends in its unit, and a strict parser agrees.
    om = body.decode()
    assert status == 200
    units = dict(re.findall(r"^# UNIT (\S+) (\S+)$", om, re.M))
    families = set(re.findall(r"^# TYPE (\S+) ", om, re.M))
    for name in families:
        fam = FAMILY_BY_NAME.get(name) or FAMILY_BY_NAME.get(name + "_total")
        assert fam is not None, name
        unit = fam.unit.replace(" ", "_")
        if fam.unit != "1":
            assert units.get(name) == unit, f"{name}: # UNIT {units.get(name)!r}, schema {fam.unit!r}"
    assert units["process_resident_memory_bytes"] == "bytes" and units["gpu_power_watts"] == "watts"
    parsed = {f.name: f.unit for f in parse_openmetrics(om)}
    assert parsed["gpu_energy_joules"] == "joules" and parsed["gpu_utilization_ratio"] == "ratio"


# ---- finding 5: docs/metrics.md agrees with itself and the program ---------------------------------


def _docs() -> str:
    return (REPO / "docs" / "metrics.md").read_text()


def test_a_family_is_never_both_conditional_and_always_published() -> None:
    for line in _docs().splitlines():
        if line.startswith("| `") and "Present:" in line:
            assert "Always published" not in line, line


def test_pcie_throughput_cost_is_stated_once() -> None:
    costs = {re.search(r"about (\d+) ms per GPU", text).group(1)  # type: ignore[union-attr]
             for text in (FAMILY_BY_NAME["gpu_pcie_throughput_bytes_per_second"].help,
                          next(s.help for s in SPECS if s.name == "pcie_throughput"))}
    assert len(costs) == 1, costs


def test_nvlink_errors_are_documented_per_link() -> None:
    fam = FAMILY_BY_NAME["gpu_link_errors_total"]
    assert "link" in fam.labels
    assert "summed over a GPU's links" not in _docs()
    assert "per link" in _docs()


def test_collection_interval_help_names_the_cache() -> None:
    help_ = FAMILY_BY_NAME["gpu_exporter_collection_interval_seconds"].help
    assert "every scrape" not in help_ and "--cache-ttl" in help_


def test_support_table_matches_what_the_simulated_backend_emits() -> None:
    """Every family the simulated backend emits (healthy) is marked "yes" for it, and the docs
    embed the generated table."""
    with ExporterProcess(["--backend", "simulated"]) as ex:
        emitted = {name for name, _ in parse_samples(ex.scrape_text())}
    names = {f.name for f in FAMILIES}
    emitted = {n if n in names else n.rsplit("_", 1)[0] for n in emitted}
    table = support_table()
    assert table in _docs()
    column = {row.split("|")[1].strip().strip("`"): row.split("|")[2].strip() for row in table.splitlines()[2:]}
    wrong = sorted(n for n in emitted if n in column and column[n] != "yes")
    assert not wrong, f"the simulated backend emits these, the support table says no: {wrong}"
