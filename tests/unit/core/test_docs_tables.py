"""Every Markdown table of the docs has as many cells in each row as in its header (docs/benchmarks.md once had
11 header cells and 12 row cells: a renderer drops the extra cell, so a measured number silently vanished)."""

from __future__ import annotations

import re

from tests.harness.exporter import REPO

_PIPE = re.compile(r"(?<!\\)\|")  # a cell border; "\|" inside a cell is text


def table_errors(text: str) -> list[str]:
    """'line N: K cells, header has H' for every row whose cell count differs from its table's header."""
    out: list[str] = []
    header: int | None = None
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("|"):
            header = None
            continue
        cells = len(_PIPE.split(line.strip().strip("|")))
        if header is None:
            header = cells
        elif cells != header:
            out.append(f"line {n}: {cells} cells, header has {header}")
    return out


def test_docs_tables_are_rectangular() -> None:
    files = [REPO / "README.md", REPO / "exporter" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    errors = [f"{f.relative_to(REPO)} {e}" for f in files if f.exists() for e in table_errors(f.read_text())]
    assert not errors, "\n".join(errors)


def test_the_check_sees_a_ragged_row() -> None:
    text = "| a | b |\n|---|---|\n| 1 | 2 |\n| 1 | 2 | 3 |\n\n| x \\| y |\n|---|\n| `a\\|b` |\n"
    assert table_errors(text) == ["line 4: 3 cells, header has 2"]
