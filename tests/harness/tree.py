"""A copy of the package in a temporary directory, to prove what adding a family or a backend touches."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.harness.exporter import REPO


def package_copy(root: Path) -> Path:
    """``root`` with a copy of ``exporter/`` and ``docs/metrics.md`` (what the docs generator rewrites);
    ``python -m exporter`` run with ``cwd=root`` imports the copy."""
    shutil.copytree(REPO / "exporter", root / "exporter", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "docs").mkdir()
    shutil.copy(REPO / "docs" / "metrics.md", root / "docs" / "metrics.md")
    return root


def edit(path: Path, anchor: str, text: str, before: bool = False) -> None:
    """Insert ``text`` after (``before``: before) ``anchor`` in the copy's ``path``, which has it exactly once:
    the one edit a developer makes there (a schema row, a backend's declaration)."""
    source = path.read_text()
    assert source.count(anchor) == 1, f"{path.name}: anchor {anchor!r} not found once"
    path.write_text(source.replace(anchor, text + anchor if before else anchor + text))
