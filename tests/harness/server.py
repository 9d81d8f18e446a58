"""One way to run a store's real binary in a test: :class:`ServerProcess`.

A subclass names its command (:meth:`ServerProcess.command`, given the free port) and the URL
that answers 200 once it is ready (:attr:`ServerProcess.ready_path`); this class starts it on
127.0.0.1 with its output in ``log_path``, retries on another port when the one it picked was
taken meanwhile, waits until ready (polling, never sleeping), and stops it (SIGTERM, then
SIGKILL). Used by :class:`tests.harness.prom.Prometheus` and
:class:`tests.harness.victoria.VictoriaMetrics`.
"""

from __future__ import annotations

import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from tests.harness.net import free_port
from tests.harness.poll import wait_until


class ServerProcess:
    """A server binary on 127.0.0.1 for one test (a context manager); see the module doc."""

    name = "server"
    ready_path = "/"

    def __init__(self, tmp_dir: Path, start_timeout: float = 30.0) -> None:
        self.tmp_dir = Path(tmp_dir)
        self.start_timeout = start_timeout
        self.log_path = self.tmp_dir / f"{self.name}.log"
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:41234`` (valid once started)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def prepare(self) -> None:
        """What must exist before the binary starts (its config, its data)."""

    def start(self) -> Self:
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.prepare()
        for attempt in range(3):  # another process may take the free port before the binary binds it
            self.port = free_port()
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            self._proc = subprocess.Popen(self.command(self.port), stdout=self._log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, cwd=self.tmp_dir)
            try:
                wait_until(self._ready, timeout=self.start_timeout, interval=0.05,
                           what=f"{self.name} {self.ready_path}")
                return self
            except AssertionError as exc:
                self.stop()
                tail = self.log_tail()
                if attempt < 2 and "address already in use" in tail:
                    continue
                raise RuntimeError(f"{self.name} did not become ready: {exc}\n{tail}") from None
        raise AssertionError("unreachable")

    def _ready(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with status {self._proc.returncode}")
        try:
            with urllib.request.urlopen(f"{self.url}{self.ready_path}", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the server (SIGTERM), kill it if it has not exited after ``timeout`` s."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's log, for failure messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return f"(no {self.name} log)"
        return f"--- {self.name} log tail ---\n" + "\n".join(text.splitlines()[-lines:])
