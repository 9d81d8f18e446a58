"""Issue 38, item 11: dcgm-exporter's counters CSV (its -f file) as --fields-include.

scripts/dcgm-counters-to-fields reads dcgm-exporter's own published files (tests/fixtures/dcgm-exporter/,
byte for byte) and the compatibility rules; its output must be a selection `serve` accepts, holding the
family behind every field that has one and naming on stderr every field that has none."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.harness.cli import gx
from tests.harness.exporter import REPO

SCRIPT = REPO / "scripts" / "dcgm-counters-to-fields"
FIXTURES = REPO / "tests" / "fixtures" / "dcgm-exporter"


def run(csv: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(csv)], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)


def _active(csv: Path) -> list[str]:
    return [ln.split(",")[0].strip() for ln in csv.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


@pytest.mark.parametrize("name", ["default-counters.csv", "dcp-metrics-included.csv"])
def test_a_published_counters_file_becomes_a_selection_serve_accepts(name: str) -> None:
    proc = run(FIXTURES / name)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith("--fields-include=")
    chosen = line.split("=", 1)[1].split(",")
    check = gx("serve", "--backend", "simulated", line, "--check-config")
    assert check.returncode == 0, check.stderr
    families = json.loads(check.stdout)["families"]
    assert all(families[f] == "published" for f in chosen), chosen
    # every active field is either mapped (its compatibility rule's families are chosen) or named missing
    rules = {r["record"]: r["expr"] for g in yaml.safe_load((REPO / "dashboards" / "rules" / "compat-dcgm.yaml")
                                                            .read_text())["groups"] for r in g["rules"]}
    missing = {ln.split(":")[0] for ln in proc.stderr.splitlines()}
    for field in _active(FIXTURES / name):
        if field in rules:
            assert any(f in rules[field] for f in chosen), field
            assert field not in missing
        elif field != "DCGM_FI_DRIVER_VERSION":
            assert field in missing, field
    assert "gpu_utilization_ratio" in chosen and "gpu_memory_used_bytes" in chosen


def test_commented_rows_select_nothing(tmp_path: Path) -> None:
    csv = tmp_path / "c.csv"
    csv.write_text("# DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).\nDCGM_FI_DEV_GPU_TEMP, gauge, t\n")
    proc = run(csv)
    assert proc.stdout.strip() == "--fields-include=gpu_temperature_celsius", proc.stdout


def test_migration_doc_shows_the_script() -> None:
    text = (REPO / "docs" / "migration.md").read_text()
    assert "scripts/dcgm-counters-to-fields" in text and "--fields-include" in text
