"""The package's folders are its architecture: no import cycles, and core imports nothing above it.

Both rules are checked on the source (every ``import`` and ``from`` statement, lazy ones inside
functions included), so a cycle hidden behind a function-level import still fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "exporter"
# Which top-level folders of exporter/ each folder may import (besides itself).
ALLOWED = {
    "core": set(),
    "platform": {"core"},
    "backends": {"core"},
    "k8s": {"core"},
    "serve": {"core", "platform", "backends", "k8s"},
    # k8s: --device-taints finds a GPU's DRA devices with the exporter's own ResourceSlice reader
    # (k8s/resourceslices.py: one parser of the slices' shapes, not two); k8s imports only core;
    # backends: by the attributes each vendor declares (KubernetesNames.dra_attributes), read from the registry
    "profiler": {"core", "platform", "k8s", "backends"},
    "python_api": {"core", "backends"},
    "tools": {"core", "platform", "backends", "serve", "python_api"},
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "proto" not in p.parts}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Modules of the package that ``path`` imports (a ``from pkg import mod`` counts as pkg.mod)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("exporter"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            if not base.startswith("exporter"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
    return {m for m in out if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(path, name, known) for name, path in mods.items()}


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else None


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for dep in sorted(graph[m]):
            if state.get(dep) == 1:
                cycle = [*stack[stack.index(dep):], dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_cycle_detector_sees_a_lazy_import(tmp_path: Path) -> None:
    """The checker itself: an import inside a function body is an edge."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from exporter.serve import api\n")
    assert _imports(f, "exporter.tools.x", {"exporter.serve.api", "exporter.serve"}) == {"exporter.serve.api"}


def test_folders_import_only_downwards() -> None:
    bad = []
    for m, deps in _graph().items():
        src = _folder(m)
        if src is None:
            continue
        for d in deps:
            dst = _folder(d)
            if dst is not None and dst != src and dst not in ALLOWED[src]:
                bad.append(f"{m} imports {d}")
    assert not bad, "; ".join(sorted(bad))


def test_the_test_schedules_modules_name_files_that_exist() -> None:
    """tests/conftest.py's HEAVIEST, SERIAL and SLOW name test modules by path: a renamed one would drop
    out of its schedule (SERIAL: timing tests run under parallel load) without a word."""
    from tests import conftest

    root = Path(__file__).resolve().parents[3]
    missing = [p for p in (*conftest.HEAVIEST, *conftest.SERIAL, *conftest.SLOW) if not (root / p).is_file()]
    assert missing == []
