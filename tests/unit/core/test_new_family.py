"""Adding a metric family is its schema row, the reading's field and the backends that fill it: in a copy
of the package, those three edits alone (here: the simulated backend fills it) make the family served with
its row's help and unit, selectable with ``--fields-*``, listed by the JSON API, and in both generated
tables of docs/metrics.md (docs/extending.md, "A new metric family")."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.exporter import ExporterProcess, parse_samples
from tests.harness.tree import package_copy

ROW = '''    _g("gpu_widget_bytes", GAUGE, "bytes", "Bytes in the widget cache, by widget.", "memory", "widget_bytes",
       "nvmlDeviceGetWidgets", "widgets.used", "(none)", labels=("widget",)),
'''


def _edit(path: Path, anchor: str, text: str, before: bool = False) -> None:
    source = path.read_text()
    assert source.count(anchor) == 1, f"{path.name}: anchor {anchor!r} not found once"
    path.write_text(source.replace(anchor, text + anchor if before else anchor + text))


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = package_copy(tmp_path_factory.mktemp("tree"))
    pkg = root / "exporter"
    # 1. the row (at the end of the memory group)
    _edit(pkg / "core" / "schema.py", "    # --- thermal and power", ROW, before=True)
    # 2. the reading's field
    _edit(pkg / "core" / "readings.py", "    memory_reserved_bytes: float | None = None\n",
          "    widget_bytes: dict[str, float] = field(default_factory=dict)\n")
    # 3. a backend fills it and declares it
    sim = pkg / "backends" / "simulated.py"
    _edit(sim, "        r.memory_total_bytes = float(MEMORY_TOTAL)\n",
          '        r.widget_bytes = {"alpha": 1024.0, "beta": 2048.0}\n')
    _edit(sim, "    families: ClassVar[frozenset[str]] = frozenset({\n", '        "gpu_widget_bytes",\n')
    return root


def test_served_with_its_rows_help(tree: Path) -> None:
    with ExporterProcess(["--backend", "simulated", "--simulated-gpus", "2"], cwd=tree) as ex:
        text = ex.scrape_text()
        om = ex.get("/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})[1].decode()
        families = json.loads(ex.get("/api/v1/families")[1])["families"]
    samples = parse_samples(text)
    key = ("gpu_widget_bytes", frozenset({("gpu", "1"), ("uuid", "GPU-5140a7ed-0000-4000-8000-000000000001"),
                                          ("widget", "beta")}))
    assert samples[key] == 2048
    assert "# HELP gpu_widget_bytes Bytes in the widget cache, by widget.\n# TYPE gpu_widget_bytes gauge\n" in text
    assert "# UNIT gpu_widget_bytes bytes\n" in om
    row = next(f for f in families if f["name"] == "gpu_widget_bytes")
    assert row["backends"] == ["simulated"] and row["labels"] == ["gpu", "uuid", "widget"]


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
