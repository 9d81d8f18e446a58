"""Reliability suite set-up: the ``reliability_long`` marker and the per-test result record.

``make test`` runs this package with ``-m "not reliability_long"`` (the CI-sized part);
``make reliability`` runs everything, then ``python -m tests.reliability.report`` renders
docs/reliability.md from the JSON records the tests leave in ``tests/reliability/.results/``.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.support import RESULTS_DIR, Result


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "reliability_long: long reliability scenarios (minutes); only `make reliability` runs them")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    setattr(item, f"_rep_{rep.when}", rep)  # the `result` fixture reads the outcome at teardown
    return rep


def _outcome(item: pytest.Item) -> str:
    rep = getattr(item, "_rep_call", None) or getattr(item, "_rep_setup", None)
    if rep is None:
        return "error"
    if hasattr(rep, "wasxfail"):
        return "xfailed" if rep.skipped else "xpassed"
    return str(rep.outcome)


@pytest.fixture
def result(request: pytest.FixtureRequest) -> Iterator[Result]:
    """The test's row of docs/reliability.md; written to .results/ with the outcome at teardown."""
    res = Result()
    started = time.time()
    yield res
    if not res.scenario:
        return
    doc: dict[str, Any] = {
        "test": request.node.nodeid,
        "outcome": _outcome(request.node),
        "long": request.node.get_closest_marker("reliability_long") is not None,
        "started": started,
        "duration_s": round(time.time() - started, 1),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "cpu": _cpu_model(),
                    "kernel": platform.release(), "python": platform.python_version()},
        **res.as_dict(),
    }
    RESULTS_DIR.mkdir(exist_ok=True)
    name = request.node.nodeid.split("::", 1)[1].replace("/", "_").replace("[", "-").rstrip("]")
    (RESULTS_DIR / f"{Path(request.node.path).stem}.{name}.json").write_text(json.dumps(doc, indent=1) + "\n")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()
