"""Our CLI as a real subprocess: ``python -m exporter ARGS`` (the console script's code), run from the
repository root with this environment plus ``env``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from tests.harness.exporter import REPO


def gx(*args: str, env: Mapping[str, str] | None = None,
       timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `python -m exporter ARGS` (the console script's code) and capture its output; whatever
    the outcome, it must not print a traceback (a failure is one line)."""
    p = subprocess.run([sys.executable, "-m", "exporter", *args], env={**os.environ, **(env or {})},
                       cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def popen(*args: str, env: Mapping[str, str] | None = None, **kw: Any) -> subprocess.Popen[str]:
    """Start `python -m exporter ARGS` in the background (``kw`` goes to :class:`subprocess.Popen`)."""
    return subprocess.Popen([sys.executable, "-m", "exporter", *args], env={**os.environ, **(env or {})},
                            cwd=REPO, text=True, **kw)
