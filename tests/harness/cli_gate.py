"""The traceback gate: every run of our own CLI in the suite is checked for a Python traceback.

Bad input must end in one line and an exit status, never a traceback (issue 16). Rather than trust
each test to look, ``install()`` (called once from tests/conftest.py) swaps ``subprocess.Popen`` for
a subclass that, for commands running our code (``python -m exporter...``, ``gpu-exporter``), scans
what the child wrote to stderr: the captured text (``run(capture_output=True)``, ``communicate``)
or the file its stderr went to (the harness' log files), once the child has exited. A hit is
recorded against the running test, which the conftest fixture then fails. Cost: one substring
search per CLI run. A test whose child is *meant* to print a traceback says so with
``@pytest.mark.allow_traceback``.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MARK = "Traceback (most recent call last)"
hits: list[str] = []  # "command: excerpt", since the last take()
_original = subprocess.Popen


def is_cli(args: Any) -> bool:
    argv = [str(a) for a in args] if isinstance(args, Sequence) and not isinstance(args, str | bytes) else [str(args)]
    if any(a.rsplit("/", 1)[-1] in ("gpu-exporter", "gpu-profiler") for a in argv[:1]):
        return True
    return any(a == "-m" and b.split(".")[0] == "exporter" for a, b in itertools.pairwise(argv))


def scan(args: Any, text: str | bytes | None) -> None:
    if not text:
        return
    s = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    at = s.find(MARK)
    if at >= 0:
        cmd = " ".join(map(str, args))[:200] if not isinstance(args, str) else args[:200]
        hits.append(f"{cmd}: {s[at:at + 1500]}")


class GatedPopen(_original):
    """``subprocess.Popen`` that reports tracebacks in the stderr of our CLI (see the module doc)."""

    def __init__(self, args: Any, *a: Any, **kw: Any) -> None:
        super().__init__(args, *a, **kw)
        self._gate = is_cli(args)
        err = kw.get("stderr")
        target = kw.get("stdout") if err == subprocess.STDOUT else err
        self._gate_file = getattr(target, "name", None) if self._gate and not isinstance(target, int) else None
        self._gate_out = err == subprocess.STDOUT
        self._gate_done = False

    def communicate(self, *a: Any, **kw: Any) -> tuple[Any, Any]:
        out, err = super().communicate(*a, **kw)
        if self._gate:
            scan(self.args, err)
            if self._gate_out:
                scan(self.args, out)
        return out, err

    def wait(self, *a: Any, **kw: Any) -> int:
        rc = super().wait(*a, **kw)
        if self._gate_file and not self._gate_done:
            self._gate_done = True
            try:
                scan(self.args, Path(self._gate_file).read_bytes())
            except OSError:
                pass
        return int(rc)


def install() -> None:
    subprocess.Popen = GatedPopen  # type: ignore[misc]


def take() -> list[str]:
    out = hits[:]
    hits.clear()
    return out
