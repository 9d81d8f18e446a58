"""Adding a metric family is its schema row and the backends that fill it (the reading's attribute comes from
the row): in a copy of the package, those edits alone (here: the simulated backend fills it, and
exporter/core/readings.py is not touched) make the family served with its
row's help and unit, selectable with ``--fields-*``, listed by the JSON API and in both generated tables of
docs/metrics.md; and, since the row names a field (``views``), shown in ``/stats``, gpu-metrics, the
``snapshot`` table and JSON, compared by ``diff`` (a change of one field, a rise beyond its row's limit of
the other), and an attribute of the Python API's ``GpuStatus`` and ``Recording`` (docs/extending.md, "A new
metric family"). Nothing else is edited."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.harness.exporter import REPO, ExporterProcess, parse_samples
from tests.harness.tree import edit, package_copy

MIB = 2**20
# A dict family (one sample per widget) whose "alpha" entry is a GPU field: a GpuStatus attribute, in the
# record, a snapshot column, fixed for diff, shown in gpu-metrics in MiB. Its unit and doc come from the row.
ROW = '''    _g("gpu_widget_bytes", GAUGE, "bytes", "Bytes in the widget cache, by widget.", "memory", "widget_bytes",
       "nvmlDeviceGetWidgets", {"nvidia-smi": "widgets.used", "amd-smi": "(none)"},
       labels=("widget",),
       views=(Field("widget_alpha_bytes", source="reading.widget_bytes[alpha]", kind="integer", status=True,
                    diff="fixed", column="ALPHA", record=Record("widget_alpha_mb", 1 / MIB),
                    legacy=Legacy("widget.alpha", unit="MiB", per=MIB, digits=None)),
              Field("widget_beta_bytes", source="reading.widget_bytes[beta]", kind="integer", diff="rise",
                    rise=Rise("widget", MIB, "widget beta")))),
'''
ALPHA, BETA = 3 * MIB, 2048.0


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = package_copy(tmp_path_factory.mktemp("tree"))
    for doc in ("api.md", "python-api.md"):  # the JSON views' generated docs
        shutil.copy(REPO / "docs" / doc, root / "docs" / doc)
    pkg = root / "exporter"
    # 1. the row (at the end of the memory group)
    edit(pkg / "core" / "schema.py", "    # --- thermal and power", ROW, before=True)
    # 2. a backend fills it and declares it (the reading's attribute comes from the row)
    sim = pkg / "backends" / "simulated.py"
    edit(sim, "        r.memory_total_bytes = float(MEMORY_TOTAL)\n",
          f'        r.widget_bytes = {{"alpha": {float(ALPHA)}, "beta": {BETA}}}\n')
    edit(sim, "    families: ClassVar[frozenset[str]] = frozenset({\n", '        "gpu_widget_bytes",\n')
    return root


def _run(tree: Path, *args: str, code: int = 0, stdin: str | None = None) -> str:
    done = subprocess.run([sys.executable, *args], cwd=tree, capture_output=True, text=True, timeout=120,
                          input=stdin)
    assert done.returncode == code, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def _schema(tree: Path, name: str) -> dict[str, Any]:
    """The copy's JSON schema of a document (generated from the copy's field table)."""
    schema: dict[str, Any] = json.loads(_run(tree, "-m", "exporter.serve.api_schema", name))
    return schema


def test_the_reading_has_the_rows_attribute(tree: Path) -> None:
    """GpuReading carries the row's ``attr`` though readings.py was not edited: empty on a reading no backend
    filled (a down GPU's, another backend's), so every view reads it there as absent, not AttributeError."""
    out = _run(tree, "-c", "from exporter.core.readings import GpuReading\n"
                           "r = GpuReading(0, 'u')\nprint(r.widget_bytes, r.down('gone').widget_bytes)")
    assert out == "{} {}\n"


TYPED = """
from exporter.core.readings import GpuReading

r = GpuReading(index=0, uuid="u", widget_bytes={"alpha": 1.0}, power_watts=2.0)  # a backend's constructor call
r.widget_bytes = {"beta": 2.0}
watts: float | None = r.power_watts
wrong: str = r.power_watts  # a declared field keeps its type
"""


def test_mypy_takes_the_rows_attribute(tree: Path) -> None:
    """A backend may pass the row's value to GpuReading's constructor or set it, and mypy (the CI's type check)
    accepts it with readings.py untouched; a declared field is still checked."""
    (tree / "typed_probe.py").write_text(TYPED)
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--ignore-missing-imports",
                           "--follow-imports", "silent", "typed_probe.py"], cwd=tree, capture_output=True,
                          text=True, timeout=300)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and errors[0].startswith("typed_probe.py:7: error: Incompatible types"), done.stdout


def test_served_with_its_rows_help(tree: Path) -> None:
    with ExporterProcess(["--backend", "simulated", "--simulated-gpus", "2"], cwd=tree) as ex:
        text = ex.scrape_text()
        om = ex.get("/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})[1].decode()
        families = json.loads(ex.get("/api/v1/families")[1])["families"]
    samples = parse_samples(text)
    key = ("gpu_widget_bytes", frozenset({("gpu", "1"), ("uuid", "GPU-5140a7ed-0000-4000-8000-000000000001"),
                                          ("widget", "beta")}))
    assert samples[key] == BETA
    assert "# HELP gpu_widget_bytes Bytes in the widget cache, by widget.\n# TYPE gpu_widget_bytes gauge\n" in text
    assert "# UNIT gpu_widget_bytes bytes\n" in om
    row = next(f for f in families if f["name"] == "gpu_widget_bytes")
    assert row["backends"] == ["simulated"] and row["labels"] == ["gpu", "uuid", "widget"]


def test_shown_in_stats_gpu_metrics_and_the_live_page(tree: Path) -> None:
    with ExporterProcess(["--backend", "simulated", "--simulated-gpus", "2"], cwd=tree) as ex:
        stats = json.loads(ex.get("/stats")[1])
        legacy = json.loads(ex.get("/api/v1/monitoring/gpu-metrics")[1])
        page = ex.get("/")[1].decode()
    assert [g["widget_alpha_bytes"] for g in stats["gpus"]] == [ALPHA, ALPHA]  # SI, a JSON integer
    assert all(type(g["widget_alpha_bytes"]) is int for g in stats["gpus"])
    assert [g["widget"] for g in legacy["gpus"]] == [{"alpha": 3}, {"alpha": 3}]  # MiB
    # the live page shows it on each card, from /stats, titled as its snapshot column
    shown = json.loads(re.search(r"const FIELDS = (\[.*?\]);", page).group(1))  # type: ignore[union-attr]
    assert {"key": "widget_alpha_bytes", "title": "ALPHA", "unit": "bytes"} in shown
    jsonschema.validate(stats, _schema(tree, "stats"))
    jsonschema.validate(legacy, _schema(tree, "gpu-metrics"))
    gpu = _schema(tree, "stats")["properties"]["gpus"]["items"]
    assert gpu["properties"]["widget_alpha_bytes"] == {  # the doc is the row's help and nvidia-smi equivalent
        "type": ["integer", "null"], "minimum": 0,
        "description": "Bytes in the widget cache, by widget. (nvidia-smi widgets.used)"}


def test_on_each_card_of_the_live_page(tree: Path, tmp_path: Path) -> None:
    """In real headless Chromium: each card shows the field, titled and in its unit, as the snapshot table."""
    from tests.e2e.test_live_page import Cards, chromium

    with ExporterProcess(["--backend", "simulated", "--simulated-gpus", "2"], cwd=tree) as ex:
        dom = chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", ex.url + "/")
    page = Cards()
    page.feed(dom.stdout)
    assert [c.get("widget_alpha_bytes") for c in page.cards.values()] == ["3.0 MiB", "3.0 MiB"], page.cards
    assert "ALPHA 3.0 MiB" in " ".join(dom.stdout.split()).replace("<span data-field=\"widget_alpha_bytes\">", "")


def test_in_snapshot_and_compared_by_diff(tree: Path) -> None:
    table = _run(tree, "-m", "exporter", "snapshot", "--backend", "simulated", "--simulated-gpus", "2",
                 "--window", "0")
    header, first = table.splitlines()[5:7]
    assert header.split()[-1] == "ALPHA" and first.endswith("3.0 MiB")
    before = json.loads(_run(tree, "-m", "exporter", "snapshot", "--json", "--backend", "simulated", "--window", "0"))
    assert before["gpus"][0]["widget_alpha_bytes"] == ALPHA
    after = json.loads(json.dumps(before))
    after["gpus"][1]["widget_alpha_bytes"] = ALPHA + 1
    (tree / "before.json").write_text(json.dumps(before))
    (tree / "after.json").write_text(json.dumps(after))
    out = _run(tree, "-m", "exporter", "diff", "before.json", "after.json", code=1)
    assert "gpu 1: widget_alpha_bytes changed: 3145728 -> 3145729 (must not change)" in out
    _run(tree, "-m", "exporter", "diff", "before.json", "after.json", "--ignore", "widget_alpha_bytes")
    usage = _run(tree, "-m", "exporter", "diff", "--help")
    assert "widget_alpha_bytes" in usage
    # the "rise" field: its row's limit (1 MiB), its own flag and --ignore name
    assert "--max-widget-rise SIZE" in usage and "widget beta may rise this much per GPU (default 1MiB" in usage
    after = json.loads(json.dumps(before))
    after["gpus"][0]["widget_beta_bytes"] = before["gpus"][0]["widget_beta_bytes"] + MIB
    (tree / "after.json").write_text(json.dumps(after))
    _run(tree, "-m", "exporter", "diff", "before.json", "after.json")  # at the limit: unchanged
    after["gpus"][0]["widget_beta_bytes"] += 1
    (tree / "after.json").write_text(json.dumps(after))
    out = _run(tree, "-m", "exporter", "diff", "before.json", "after.json", code=1)
    assert "gpu 0: widget beta rose by 1.0 MiB (2.0 KiB -> 1.0 MiB; limit 1.0 MiB): a foreign load?" in out
    _run(tree, "-m", "exporter", "diff", "before.json", "after.json", "--max-widget-rise", "2MiB")
    _run(tree, "-m", "exporter", "diff", "before.json", "after.json", "--ignore", "widget")


PYTHON_API = """
import json
import exporter

s = exporter.query_gpus(backend="simulated")[0]
with exporter.Monitor(interval=0.05, gpus=[0], backend="simulated") as m:
    pass
rec = m.recording
print(json.dumps({"status": s.widget_alpha_bytes, "series": rec.gpus[0].widget_alpha_bytes.max,
                  "record": rec.to_dict()}))
"""


def test_an_attribute_of_the_python_api(tree: Path) -> None:
    out = json.loads(_run(tree, "-c", PYTHON_API))
    assert out["status"] == ALPHA and out["series"] == ALPHA
    assert out["record"]["gpu_stats"]["0"]["widget_alpha_mb"] == {"min": 3.0, "max": 3.0, "mean": 3.0}
    jsonschema.validate(out["record"], _schema(tree, "record"))


def test_field_selection_knows_it(tree: Path) -> None:
    with ExporterProcess(["--backend", "simulated", "--fields-exclude", "gpu_widget_*"], cwd=tree) as ex:
        assert "gpu_widget_bytes" not in ex.scrape_text()
    done = subprocess.run([sys.executable, "-m", "exporter", "serve", "--check-config", "--backend", "simulated",
                           "--fields-include", "gpu_widget_byte"], cwd=tree, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "did you mean gpu_widget_bytes?" in done.stderr


def test_generated_docs_list_it(tree: Path) -> None:
    subprocess.run([sys.executable, "-m", "exporter.backends", "--write-docs"], cwd=tree, check=True, timeout=60)
    docs = (tree / "docs" / "metrics.md").read_text()
    assert re.search(r"^\| `gpu_widget_bytes` \| gauge \| bytes \| `gpu`, `uuid`, `widget` \| nvmlDeviceGetWidgets "
                     r"\| widgets.used \|", docs, re.M)
    support = docs.split("<!-- support-table:begin -->")[1]
    header = [c.strip() for c in support.strip().splitlines()[0].strip("|").split("|")]
    cells = next(line for line in support.splitlines() if line.startswith("| `gpu_widget_bytes`"))
    cells_ = [c.strip() for c in cells.strip("|").split("|")]
    assert {h: c for h, c in zip(header, cells_, strict=True)}["simulated"] == "yes"
    assert {h: c for h, c in zip(header, cells_, strict=True)}["nvml"] == "no"
    subprocess.run([sys.executable, "-m", "exporter.serve.api_schema", "--write-docs"], cwd=tree, check=True,
                   timeout=60)
    api = (tree / "docs" / "api.md").read_text()
    assert ("| `widget_alpha_bytes` | bytes | `reading.widget_bytes[alpha]` | `widget_alpha_bytes` | "
            "`widget.alpha` (MiB) | yes | `widget_alpha_mb` | ALPHA | fixed |") in api
    assert "- `memory_free_bytes`;\n- `widget_alpha_bytes`;" in (tree / "docs" / "python-api.md").read_text()
