"""Backends that read a vendor's command-line tool (``rocm-smi``, ``xpu-smi`` ...): what they share.

:func:`run` starts the tool in its own session, with a hard timeout after which its whole process
group is killed (a tool that hangs, or a child it started, never outlives the timeout), and kills
whatever is still running when the exporter exits. :data:`COMMAND_TIMEOUT` is the one
``--command-timeout`` of every CLI backend. :class:`CliBackend` is the base of such a backend: it
finds the tool (its own ``--<tool>-path`` setting, then ``PATH``, then the vendor's directories),
runs it once per collection (one run reads every GPU, never one run per GPU), at most every
``min_interval`` seconds, and serves the run that ``init`` made to the first collection; the
vendor's module only says which arguments to pass and how to parse the output (docs/extending.md).
A tool that prints what does not change (UUIDs, memory sizes) only in another command also names
that command (``inventory_arguments``): it runs once, before the first collection and again after
a reset, and ``parse`` reads its output in ``self.inventory``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from exporter.backends.base import DRIVER, Backend, BackendError, BackendUnavailable
from exporter.core.errors import STALLED
from exporter.core.options import BackendOptions, BackendSetting
from exporter.core.readings import Collection, GpuReading

log = logging.getLogger(__name__)

#: the hard timeout of every CLI backend's run (one setting, declared by each CLI backend)
COMMAND_TIMEOUT = BackendSetting("command_timeout", "--command-timeout", "COMMAND_TIMEOUT", "seconds",
                                 "hard timeout for CLI backends such as rocm-smi (default 5)", default=5.0, low=0.1,
                                 high=120)
KILL_WAIT = 2.0  # seconds to wait for the pipes to close after the SIGKILL of a timed-out group


def path_setting(tool: str, backend: str, default: str, example: str = "") -> BackendSetting:
    """The ``--<tool>-path`` setting of a CLI backend: the tool's binary (``default`` says where it is
    looked for without it; ``example``: a path to show, /usr/bin/<tool> if not given)."""
    key = tool.replace("-", "_")
    return BackendSetting(f"{key}_path", f"--{tool}-path", f"{key.upper()}_PATH", "path",
                          f"{tool} binary for the {backend} backend (default: {default})",
                          example=example or f"/usr/bin/{tool}")


@dataclass(frozen=True)
class Result:
    """What one run printed, and its exit status (negative: killed by that signal)."""

    stdout: str
    stderr: str
    code: int

    def failure(self, tool: str) -> str:
        """One line saying why it failed: its first line of stderr (of stdout when stderr is empty), or a
        Python traceback's last line; and the exit status."""
        lines = [ln.strip() for ln in self.stderr.splitlines() if ln.strip()]
        lines = lines or [ln.strip() for ln in self.stdout.splitlines() if ln.strip()] or ["no output"]
        first = lines[-1] if lines[0].startswith("Traceback") else lines[0]
        status = f"signal {-self.code}" if self.code < 0 else f"code {self.code}"
        return f"{tool} exited with {status}: {first[:200]}"


_RUNNING: set[subprocess.Popen[bytes]] = set()


def run(tool: str, argv: Sequence[str], timeout: float) -> Result:
    """Run ``argv`` (``tool`` names it in errors) once, with ``timeout`` seconds for all of it.

    BackendError (kind ``driver``) when it cannot be started, (kind ``stalled``) when it ran out of
    time: its process group was killed then. The child gets its own session, so that the kill reaches
    anything it started.
    """
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        raise BackendError(f"{tool} could not be started ({argv[0]}): {exc.strerror or exc}", kind=DRIVER) from None
    _RUNNING.add(proc)  # its own session does not end with ours: killed at our exit (kill_running)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc, tool)
        # reported as a stalled backend, like a hung in-process call about no GPU (exporter/core/engine.py)
        raise BackendError(f"{tool} did not answer within {timeout:g} s and was killed", kind=STALLED) from None
    finally:
        _RUNNING.discard(proc)
    return Result(out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), proc.returncode)


@atexit.register
def kill_running() -> None:
    """At exit: kill every tool still running, and what it started (a hung one would live on)."""
    for proc in list(_RUNNING):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _kill_group(proc: subprocess.Popen[bytes], tool: str) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=KILL_WAIT)
    except subprocess.TimeoutExpired:  # a grandchild left the group and holds the pipes
        log.warning("%s (pid %d) did not exit after SIGKILL", tool, proc.pid)


def find(tool: str, explicit: str | None = None, directories: Sequence[str] = ()) -> str | None:
    """``explicit`` (when executable), else ``tool`` on PATH, else in the first of ``directories`` that has it
    (``$VAR`` expanded; an unset variable skips its directory)."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which(tool)
    if found:
        return found
    for d in directories:
        root = os.path.expandvars(d)
        if "$" in root:
            continue
        if os.access(candidate := os.path.join(root, tool), os.X_OK):
            return candidate
    return None


class CliBackend(Backend):
    """A backend that reads one vendor tool's output: one run per collection reads every GPU.

    Subclasses set ``tool`` (the binary's name), ``directories`` (where it is installed besides
    PATH; ``$VAR`` expanded), ``arguments`` (one run reads everything), optionally
    ``inventory_arguments`` (a second command, run once: see the module's docstring), and ``settings``
    (its :func:`path_setting` and :data:`COMMAND_TIMEOUT`), and implement :meth:`parse`. A run that exits
    non-zero fails the collection with its first line of output, unless :meth:`usable` says its output
    is complete (some tools exit with the status of the last unsupported field).
    """

    tool: ClassVar[str]  # the binary's name (Backend.tool)
    directories: ClassVar[tuple[str, ...]] = ()
    arguments: ClassVar[tuple[str, ...]] = ()
    #: a second command for what does not change, run once (then after each reset); () for none
    inventory_arguments: ClassVar[tuple[str, ...]] = ()
    min_interval: ClassVar[float] = 10.0  # a run costs a process start (often a Python start-up: ~1 s)

    def __init__(self, options: BackendOptions | None = None, binary: str | None = None) -> None:
        super().__init__(options)
        # explicit path: constructor, then the backend's --<tool>-path setting
        self._explicit: str | None = binary or self.setting(f"{self.tool.replace('-', '_')}_path")
        self._binary: str | None = None
        self._first: tuple[float, list[GpuReading]] | None = None
        #: the output of the ``inventory_arguments`` run, for :meth:`parse` (None until it has run)
        self.inventory: Result | None = None

    def parse(self, result: Result) -> list[GpuReading]:
        """The GPUs in one run's output; BackendError (kind ``bad_value``) when it is unusable."""
        raise NotImplementedError

    def usable(self, result: Result) -> bool:
        """Whether the output of a run that exited non-zero can be used all the same (default: no)."""
        return False

    def init(self) -> None:
        binary = find(self.tool, self._explicit, self.directories)
        if binary is None:
            where = self._explicit or ", ".join(("PATH", *self.directories))
            raise BackendUnavailable(f"{self.tool} not available: not found in {where}")
        self._binary = binary
        try:
            readings = self.read()
        except BackendError as exc:
            raise BackendUnavailable(f"{self.tool} not available: {exc}") from None
        if not readings:
            raise BackendUnavailable(f"{self.tool} not available: it reports no {self.vendor.upper()} GPU")
        self._first = (time.monotonic(), readings)  # served by the first collect: no second run

    def reset(self) -> None:
        self._first = None
        self.inventory = None  # the GPUs may be others after a failure: asked again

    def collect(self, out: Collection) -> None:
        first, self._first = self._first, None
        if first is not None and time.monotonic() - first[0] < self.min_interval:
            readings = first[1]
        else:
            readings = self.read()
        out.gpus.extend(readings)

    def read(self) -> list[GpuReading]:
        """One run of the tool, parsed."""
        if self._binary is None:
            self._binary = find(self.tool, self._explicit, self.directories)
            if self._binary is None:
                raise BackendError(f"{self.tool} not found", kind=DRIVER)
        timeout = self.setting(COMMAND_TIMEOUT.name)
        if self.inventory_arguments and self.inventory is None:
            found = run(self.tool, [self._binary, *self.inventory_arguments], timeout)
            if found.code != 0:
                raise BackendError(found.failure(self.tool), kind=DRIVER)
            self.inventory = found
        result = run(self.tool, [self._binary, *self.arguments], timeout)
        if result.code != 0:
            if not self.usable(result):
                raise BackendError(result.failure(self.tool), kind=DRIVER)
            self.log_once(f"exit:{result.code}", "%s exits with code %d (a field it was asked for is unsupported "
                          "on some GPU); its output is used", self.tool, result.code)
        return self.parse(result)
