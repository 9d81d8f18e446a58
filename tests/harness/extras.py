"""Run a subprocess as if some optional packages (pyproject extras) were not installed.

A ``sitecustomize.py`` on ``PYTHONPATH`` sets ``sys.modules[name] = None`` before anything runs,
so that ``import name`` raises ImportError exactly as on a machine without the package.
"""

from __future__ import annotations

import os
from pathlib import Path


def env_without(folder: Path, *packages: str) -> dict[str, str]:
    """Environment (to merge into os.environ) whose Python cannot import ``packages``."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["import sys"] + [f"sys.modules[{name!r}] = None" for name in packages]
    (folder / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}
