"""Issue 38, item 18: every path of this repository that the README and docs/ name exists.

A doc that names a moved or removed file (tests/profiler_history.py, exporter/serve/webconfig.py,
exporter/serve/engine.py were) sends its reader nowhere. Paths are read wherever they appear, in
backticks or not; those with a glob or a placeholder are patterns, not files. A few name files of
other projects, in the sentence that names that project: they are listed with it."""

from __future__ import annotations

import re

from tests.harness.exporter import REPO

PATH = re.compile(r"(?<![\w./-])((?:exporter|tests|deploy|docs|dashboards|scripts|bench|demo|\.github|\.ci)/"
                  r"[A-Za-z0-9_./-]*[A-Za-z0-9_/-])")
# other projects' files, named with their project
ELSEWHERE = {
    "docs/monitoring-critical-operators.md": "NVIDIA/NVSentinel",
    "docs/metrics/cluster/node-metrics.md": "NVIDIA/NVSentinel",
    "docs/grafana/dashboard.json": "utkuozdemir/nvidia_gpu_exporter",
    "docs/METRICS.md": "utkuozdemir/nvidia_gpu_exporter",
}
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "exporter" / "README.md"]


def named_paths() -> list[tuple[str, int, str]]:
    out = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for m in PATH.finditer(line):
                path = m.group(1).rstrip("/.")
                if not any(c in path for c in "*<>{}$") and "..." not in path:
                    out.append((str(doc.relative_to(REPO)), n, path))
    return out


def test_every_path_the_docs_name_exists() -> None:
    found = named_paths()
    assert len(found) > 100, "the pattern finds the docs' paths"
    missing = [f"{doc}:{n}: {path}" for doc, n, path in found if path not in ELSEWHERE and not (REPO / path).exists()]
    assert not missing, "docs name paths that do not exist:\n" + "\n".join(missing)


def test_the_check_finds_a_stale_path() -> None:
    m = PATH.search("see `tests/profiler_history.py`, seeded")
    assert m is not None and m.group(1) == "tests/profiler_history.py"
    assert not (REPO / "tests" / "profiler_history.py").exists()


def test_no_internal_references_in_user_docs() -> None:
    """Words only the project's history explains (issue 38, item 18)."""
    text = {d.name: d.read_text() for d in DOCS}
    assert "(issue: Kubernetes)" not in text["metrics.md"]
    assert "fleet manager this exporter replaces" not in text["api.md"]
