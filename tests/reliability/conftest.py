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


def result_path(item: pytest.Item) -> Path:
    name = item.nodeid.split("::", 1)[1].replace("/", "_").replace("[", "-").rstrip("]")
    return RESULTS_DIR / f"{Path(item.path).stem}.{name}.json"


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: only the tests that will run
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Forget the previous record of every test about to run: a row never outlives its test."""
    for item in items:
        if Path(item.path).parent == Path(__file__).parent:
            result_path(item).unlink(missing_ok=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    setattr(item, f"_rep_{rep.when}", rep)  # the `result` fixture reads the outcome at teardown
    return rep


def _xfail_reason(item: pytest.Item) -> str | None:
    rep = getattr(item, "_rep_call", None)
    return str(rep.wasxfail) if rep is not None and hasattr(rep, "wasxfail") else None


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
        "xfail_reason": _xfail_reason(request.node),
        "long": request.node.get_closest_marker("reliability_long") is not None,
        "started": started,
        "duration_s": round(time.time() - started, 1),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "cpu": _cpu_model(),
                    "kernel": platform.release(), "python": platform.python_version()},
        **res.as_dict(),
    }
    RESULTS_DIR.mkdir(exist_ok=True)
    result_path(request.node).write_text(json.dumps(doc, indent=1) + "\n")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()
