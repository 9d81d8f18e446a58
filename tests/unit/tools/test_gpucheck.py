"""make gpu-check's comparison logic, against a fake nvidia-smi that reads the same fake fleet."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

from tests.fakes.fakenvml import FakeNvml
from tests.harness.exporter import REPO

FAKE_SMI = r'''#!{python}
import json, sys
rows = json.load(open({data!r}))
args = sys.argv[1:]
if args[:2] == ["topo", "-m"]:
    print(open({topo!r}).read()); sys.exit(0)
q = [a for a in args if a.startswith("--query-gpu=")][0].split("=", 1)[1].split(",")
unknown = [x for x in q if x not in rows[0]]
if unknown:
    print("Field \"%s\" is not a valid field to query." % unknown[0], file=sys.stderr); sys.exit(2)
for row in rows:
    print(", ".join(str(row[x]) for x in q))
'''


def smi_rows(fleet: FakeNvml) -> list[dict[str, object]]:
    rows = []
    for i, g in enumerate(fleet.gpus):
        mib = 2**20
        rows.append({
            "uuid": g["uuid"], "name": g["name"], "pci.bus_id": g["bus_id"], "serial": g["serial"],
            "driver_version": fleet.globals["driver_version"], "utilization.gpu": g["util_gpu"],
            "utilization.memory": g["util_mem"], "memory.total": g["mem_total"] // mib,
            "memory.used": g["mem_used"] // mib, "memory.free":
                (g["mem_total"] - g["mem_used"] - g["mem_reserved"]) // mib,
            "memory.reserved": g["mem_reserved"] // mib, "temperature.gpu": g["temp_gpu"],
            "temperature.memory": g["temp_mem"], "power.draw": g["power_mw"] / 1000,
            "enforced.power.limit": g["enforced_limit_mw"] / 1000, "clocks.gr": g["clock_graphics"],
            "clocks.sm": g["clock_sm"], "clocks.mem": g["clock_mem"], "clocks.video": g["clock_video"],
            "clocks.max.gr": g["max_clock_graphics"], "clocks.max.sm": g["max_clock_sm"],
            "clocks.max.mem": g["max_clock_mem"], "pcie.link.gen.current": g["pcie_gen"],
            "pcie.link.gen.max": g["pcie_max_gen"], "pcie.link.width.current": g["pcie_width"],
            "pcie.link.width.max": g["pcie_max_width"], "fan.speed": "[N/A]", "pstate": f"P{g['pstate']}",
            "ecc.mode.current": "Enabled", "mig.mode.current": "Disabled",
            "clocks_event_reasons.sw_power_cap": "Active" if g["clocks_event_reasons"] & 4 else "Not Active",
        })
        _ = i
    return rows


def topo_text(n: int) -> str:
    head = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity"
    lines = [head]
    for a in range(n):
        cells = ["X" if a == b else ("NODE" if (a < n / 2) == (b < n / 2) else "SYS") for b in range(n)]
        lines.append(f"GPU{a}\t" + "\t".join(cells) + "\t0-15")
    return "\n".join(lines)


def run_check(tmp_path: Path, fleet: FakeNvml, rows: list[dict[str, object]]) -> subprocess.CompletedProcess[str]:
    data = tmp_path / "smi.json"
    data.write_text(json.dumps(rows))
    topo = tmp_path / "topo.txt"
    topo.write_text(topo_text(len(rows)))
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, data=str(data), topo=str(topo)))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    import os

    env = {**os.environ, **fleet.env()}
    return subprocess.run([sys.executable, "-m", "exporter.tools.gpucheck", "--nvidia-smi", str(smi),
                           "--timing-rounds", "3"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_matching_fleet_passes(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=4)
    res = run_check(tmp_path, fleet, smi_rows(fleet))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all fields match" in res.stdout
    assert "| 0 | power.draw |" in res.stdout and "| 0-1 | topo -m | node |" in res.stdout
    assert "ms per cycle" in res.stdout


def test_a_wrong_value_fails(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2)
    rows = smi_rows(fleet)
    rows[1]["power.draw"] = 400.0  # nvidia-smi sees 400 W, we read ~80 W
    rows[0]["fan.speed"] = 30  # nvidia-smi reads a fan that we call absent
    res = run_check(tmp_path, fleet, rows)
    assert res.returncode == 1
    assert "| 1 | power.draw | 400 |" in res.stdout and "MISMATCH" in res.stdout
    assert "| 0 | fan.speed | 30 % | absent |" in res.stdout


def test_not_active_matches_a_reason_the_gpu_lacks(tmp_path: Path) -> None:
    # nvidia-smi prints "Not Active" for every reason, supported or not; we omit an unsupported one
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2, clocks_event_reasons=0x1,
                     supported_clocks_event_reasons=0x1FF & ~0x4)
    rows = smi_rows(fleet)
    assert {r["clocks_event_reasons.sw_power_cap"] for r in rows} == {"Not Active"}
    res = run_check(tmp_path, fleet, rows)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "| 0 | clocks_event_reasons.sw_power_cap | 0 | absent | exact | ok |" in res.stdout
    rows[1]["clocks_event_reasons.sw_power_cap"] = "Active"  # but an active reason we omit is a mismatch
    res = run_check(tmp_path, fleet, rows)
    assert res.returncode == 1 and "| 1 | clocks_event_reasons.sw_power_cap | 1 | absent | exact | MISMATCH |" \
        in res.stdout
    # the field's note says what such a mismatch may mean, once
    assert res.stdout.count('note on clocks_event_reasons.sw_power_cap: "Not Active" also matches') == 1


def test_the_rest_is_listed_as_not_comparable_with_the_reason(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=1)
    res = run_check(tmp_path, fleet, smi_rows(fleet))
    assert res.returncode == 0, res.stdout + res.stderr
    # the fake nvidia-smi knows only the fields of smi_rows: the others are reported, not silently dropped
    assert "| - | remapped_rows.pending | not comparable: this nvidia-smi rejects the field |" in res.stdout
    assert "| - | gpu_link_errors_total | not comparable: nvidia-smi nvlink -e, not --query-gpu |" in res.stdout
    assert "nvidia-smi rejected: " in res.stdout


def test_every_family_has_a_validation_row() -> None:
    from exporter.core.schema import FAMILIES
    from exporter.tools.gpucheck import FIELDS, VALIDATION, validation_rows

    names = {f.name for f in FAMILIES}
    rows = validation_rows()
    assert [r[0] for r in rows] == [f.name for f in FAMILIES]
    assert {f.family for f in FIELDS} <= names
    for name, row in VALIDATION.items():
        checked = [f for f in FIELDS if f.family == name]
        assert bool(checked) != bool(row.not_comparable), f"{name}: fields and a not-comparable reason, or neither"


def test_each_comparison_is_named_by_its_schema_row() -> None:
    """gpucheck compares only ``--query-gpu`` fields that the family's schema row names in its nvidia-smi column."""
    import fnmatch

    from exporter.core.schema import family
    from exporter.tools.gpucheck import FIELDS, smi_fields

    for f in FIELDS:
        named = smi_fields(family(f.family))
        assert any(fnmatch.fnmatchcase(f.query, p) for p in named), f"{f.query} is not in {f.family}'s row: {named}"


def test_a_family_without_a_validation_row_gets_the_schema_rows() -> None:
    from exporter.core.schema import Family
    from exporter.tools.gpucheck import default_row

    row = default_row(Family("gpu_new_bytes", "gauge", "bytes", "New.", "memory", attr="new",
                             tools={"nvidia-smi": "new.field"}))
    assert row.conversion == "as read, in bytes" and "nvidia-smi: new.field" in row.not_comparable


def test_docs_validation_table_is_current() -> None:
    from exporter.tools.gpucheck import DOCS, render_docs

    text = DOCS.read_text()
    assert render_docs(text) == text, "docs/validation.md is stale: python -m exporter.tools.gpucheck --write-docs"
