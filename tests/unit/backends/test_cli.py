"""The CLI backends' common part (exporter/backends/cli.py) for a tool that answers in two commands: the
live values in one run per collection, what does not change (identity, memory size) in another, run once
(``CliBackend.inventory_arguments``), as xpu-smi's ``dump`` and ``discovery`` (docs/extending.md)."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import ClassVar

import pytest

from exporter.backends.base import BackendError, BackendUnavailable
from exporter.backends.cli import COMMAND_TIMEOUT, CliBackend, Result, path_setting
from exporter.core.options import BackendOptions, BackendSetting
from exporter.core.readings import Collection, GpuReading

pytestmark = pytest.mark.slow  # runs a fake tool (a process): make test, not make check


class TwoCommands(CliBackend):
    """``duo list`` prints ``index uuid`` lines (once), ``duo watts`` ``index watts`` lines (each collection)."""

    name: ClassVar[str] = "duo"
    vendor: ClassVar[str] = "duo"
    tool: ClassVar[str] = "duo"
    arguments: ClassVar[tuple[str, ...]] = ("watts",)
    inventory_arguments: ClassVar[tuple[str, ...]] = ("list",)
    min_interval: ClassVar[float] = 60.0  # the first collection is served from init's run
    families: ClassVar[frozenset[str]] = frozenset({"gpu_power_watts"})
    settings: ClassVar[tuple[BackendSetting, ...]] = (path_setting("duo", "duo", "PATH"), COMMAND_TIMEOUT)

    def parse(self, result: Result) -> list[GpuReading]:
        assert self.inventory is not None  # the inventory run's output, while parse runs
        uuids = dict(line.split() for line in self.inventory.stdout.splitlines())
        return [GpuReading(index=int(i), uuid=uuids[i], vendor=self.vendor, power_watts=float(w))
                for i, w in (line.split() for line in result.stdout.splitlines())]


class Duo:
    """The ``duo`` tool in a temp dir: each run appends its command to ``calls``."""

    def __init__(self, root: Path) -> None:
        self.path = root / "duo"
        self.calls = root / "calls.log"
        self.calls.touch()
        self.answers(list_code=0)

    def answers(self, list_code: int) -> None:
        self.path.write_text(f'#!/bin/sh\necho "$1" >> "{self.calls}"\n'
                             f'case "$1" in list) echo "0 DUO-0"; echo "1 DUO-1"; echo "list broke" >&2; '
                             f'exit {list_code};; watts) echo "0 100.5"; echo "1 90";; esac\n')
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)

    def runs(self) -> list[str]:
        return self.calls.read_text().split()


@pytest.fixture
def duo(tmp_path: Path) -> Duo:
    return Duo(tmp_path)


def _backend(duo: Duo) -> TwoCommands:
    return TwoCommands(BackendOptions(backend_settings={"duo_path": str(duo.path)}))


def _collect(backend: TwoCommands) -> list[GpuReading]:
    out = Collection("duo")
    backend.collect(out)
    return out.gpus


def test_the_inventory_runs_once_and_parse_reads_it(duo: Duo) -> None:
    backend = _backend(duo)
    backend.init()
    gpus = _collect(backend)  # init's run, served
    assert [(g.uuid, g.power_watts) for g in gpus] == [("DUO-0", 100.5), ("DUO-1", 90.0)]
    _collect(backend)
    _collect(backend)
    assert duo.runs() == ["list", "watts", "watts", "watts"]


def test_a_reset_takes_the_inventory_again(duo: Duo) -> None:
    """After a failed collection (the engine resets the backend) the GPUs may be others: asked again."""
    backend = _backend(duo)
    backend.init()
    backend.reset()
    assert [g.uuid for g in _collect(backend)] == ["DUO-0", "DUO-1"]
    assert duo.runs() == ["list", "watts", "list", "watts"]


def test_a_failed_inventory_run_is_one_line_naming_the_tool(duo: Duo) -> None:
    duo.answers(list_code=3)
    with pytest.raises(BackendUnavailable, match=r"^duo not available: duo exited with code 3: list broke$"):
        _backend(duo).init()
    backend = _backend(duo)
    duo.answers(list_code=0)
    backend.init()
    duo.answers(list_code=3)
    backend.reset()
    with pytest.raises(BackendError, match=r"^duo exited with code 3: list broke$"):
        _collect(backend)
