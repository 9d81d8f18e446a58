"""``python -m exporter.settings_docs --write-docs`` (``make docs``): the settings tables of docs/cli.md and
docs/profiler.md and the exporter's own settings in docs/exporter.example.yaml, from the rows of both daemons
(``serve``: exporter/serve/config.py, ``profile``: exporter/profiler/main.py), rendered by
:mod:`exporter.platform.settings_docs`. It sits above the folders: it is the one module that reads both
daemons' tables.
"""

from __future__ import annotations

import sys
from pathlib import Path

from exporter.platform.settings_docs import Rows, render_example, render_tables

ROOT = Path(__file__).resolve().parents[1]
TABLES = tuple(ROOT / "docs" / name for name in ("cli.md", "profiler.md"))
EXAMPLE = ROOT / "docs" / "exporter.example.yaml"


def commands() -> dict[str, Rows]:
    """Each command's rows: ``serve``'s without the backends' own (the backends' generator lists those), and
    ``profile``'s, whose flags each read ``PROFILER_<NAME>`` too."""
    from exporter import backends
    from exporter.profiler.main import ENV_PREFIX, ROWS
    from exporter.serve.config import SPECS

    own = {s.name for s in backends.settings()}
    return {"serve": (tuple(r for r in SPECS if r.name not in own), ""), "profile": (ROWS, ENV_PREFIX)}


def fresh(path: Path) -> str:
    """What ``path`` (one of TABLES or EXAMPLE) holds once regenerated."""
    given = commands()
    text = path.read_text()
    return render_example(text, given["serve"][0]) if path == EXAMPLE else render_tables(text, given)


def write_docs() -> None:
    for path in (p for p in (*TABLES, EXAMPLE) if p.exists()):
        path.write_text(fresh(path))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-docs"]:
        sys.exit("usage: python -m exporter.settings_docs --write-docs")
    write_docs()
