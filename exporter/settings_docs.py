"""``python -m exporter.settings_docs --write-docs`` (``make docs``): the settings tables of docs/cli.md (every
``serve`` setting), docs/profiler.md (every ``profile`` setting) and the README (a few of ``serve``'s), and the
exporter's own settings in docs/exporter.example.yaml, from the rows of both daemons
(``serve``: exporter/serve/config.py, ``profile``: exporter/profiler/main.py), rendered by
:mod:`exporter.platform.settings_docs`. It sits above the folders: it is the one module that reads both
daemons' tables.
"""

from __future__ import annotations

import sys
from pathlib import Path

from exporter.core.options import Setting
from exporter.platform.settings_docs import Rows, render_example, render_tables

ROOT = Path(__file__).resolve().parents[1]
TABLES = (ROOT / "docs" / "cli.md", ROOT / "docs" / "profiler.md", ROOT / "README.md")
EXAMPLE = ROOT / "docs" / "exporter.example.yaml"


def commands() -> dict[str, Rows]:
    """Each command's rows as its ``--help`` shows them: every ``serve`` setting (the backends' own among
    them), and ``profile``'s, whose flags each read ``PROFILER_<NAME>`` too."""
    from exporter.profiler.main import ENV_PREFIX, ROWS
    from exporter.serve.config import described_rows

    return {"serve": (tuple(described_rows()), ""), "profile": (ROWS, ENV_PREFIX)}


def example_rows() -> tuple[Setting, ...]:
    """``serve``'s rows without the backends' own: docs/exporter.example.yaml lists those in the backends'
    block (``python -m exporter.backends --write-docs``)."""
    from exporter import backends

    own = {s.name for s in backends.settings()}
    return tuple(r for r in commands()["serve"][0] if r.name not in own)


def fresh(path: Path) -> str:
    """What ``path`` (one of TABLES or EXAMPLE) holds once regenerated."""
    text = path.read_text()
    return render_example(text, example_rows()) if path == EXAMPLE else render_tables(text, commands())


def write_docs() -> None:
    for path in (p for p in (*TABLES, EXAMPLE) if p.exists()):
        path.write_text(fresh(path))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-docs"]:
        sys.exit("usage: python -m exporter.settings_docs --write-docs")
    write_docs()
