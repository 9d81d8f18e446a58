"""Run the real ``gpu-exporter serve`` or ``profile`` as a subprocess on 127.0.0.1 and scrape it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from prometheus_client.parser import text_string_to_metric_families

from tests.harness.net import free_port
from tests.harness.poll import wait_until

REPO = Path(__file__).resolve().parents[2]


def http_get(url: str, headers: Mapping[str, str] | None = None, timeout: float = 10.0) -> tuple[int, bytes, dict]:
    req = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def raw_request(port: int, data: bytes) -> bytes:
    """Send ``data`` as is to 127.0.0.1:``port``, half-close, and return everything the server answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def peer_closed(s: socket.socket) -> bool:
    """Whether the server has closed ``s`` by now (no waiting: EOF or an error, not "no data yet")."""
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def parse_samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Exposition text -> {(sample name, frozenset(labels)): value}."""
    out: dict[tuple[str, frozenset], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def sample(samples: dict[tuple[str, frozenset], float], metric: str, /, **labels: str) -> float | None:
    """The value of the one sample of ``metric`` whose labels include ``labels`` (None if absent)."""
    hits = [v for (n, ls), v in samples.items() if n == metric and set(labels.items()) <= set(ls)]
    assert len(hits) <= 1, f"{metric}{labels} matches {len(hits)} samples"
    return hits[0] if hits else None


class DaemonProcess:
    """The real ``gpu-exporter serve`` or ``gpu-exporter profile`` as a subprocess listening on 127.0.0.1.

    The one way a test starts a daemon: ``DaemonProcess("serve", [...])`` or ``DaemonProcess("profile",
    [...])`` (listen flags added here), waited for until ``/healthz`` answers 200 unless ``wait=False``;
    the log is stdout and stderr together; ``stop()`` sends SIGTERM and returns the exit status.
    ``cwd``: where ``python -m exporter`` finds the package (default: this checkout).
    """

    LISTEN = {"serve": ("--address", "--port"), "profile": ("--listen-address", "--listen-port")}

    def __init__(self, command: str, args: Sequence[str], env: Mapping[str, str] | None = None,
                 port: int | None = None, wait: bool = True, cwd: Path | None = None) -> None:
        self.command = command
        self.port = port or free_port()
        self.log_file = tempfile.NamedTemporaryFile(prefix=f"{command}-", suffix=".log", delete=False)  # noqa: SIM115
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        address, port_flag = self.LISTEN[command]
        cmd = [sys.executable, "-m", "exporter", command, address, "127.0.0.1", port_flag, str(self.port), *args]
        self.proc = subprocess.Popen(cmd, env=full_env, cwd=cwd or REPO, stdout=self.log_file, stderr=subprocess.STDOUT)
        if wait:
            self.wait_healthy()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return Path(self.log_file.name).read_text(errors="replace")

    def wait_healthy(self, timeout: float = 30.0) -> None:
        # 30 s: a start that imports the kubernetes client (--per-process, DRA, the profiler) took over
        # 15 s on a loaded 2-core machine; the poll returns as soon as /healthz answers.
        def ok() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.command} exited with {self.proc.returncode}:\n{self.log()}")
            return http_get(self.url + "/healthz", timeout=1)[0] == 200

        wait_until(ok, timeout, what=f"{self.command} /healthz")

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes, dict]:
        return http_get(self.url + path, headers)

    def scrape_text(self, path: str = "/metrics") -> str:
        status, body, _ = self.get(path)
        assert status == 200, body
        return body.decode()

    def scrape(self, path: str = "/metrics") -> dict[tuple[str, frozenset], float]:
        return parse_samples(self.scrape_text(path))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log_file.close()
        return self.proc.returncode

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        os.unlink(self.log_file.name)


class ExporterProcess(DaemonProcess):
    """``DaemonProcess("serve", args)``."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str] | None = None, port: int | None = None,
                 wait: bool = True, cwd: Path | None = None) -> None:
        super().__init__("serve", args, env=env, port=port, wait=wait, cwd=cwd)
