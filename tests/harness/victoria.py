"""A real VictoriaMetrics (Debian's ``victoria-metrics``, single-node) driven from tests.

:class:`VictoriaMetrics` runs a private server on 127.0.0.1 with its own data directory and
otherwise its default flags (``-search.latencyOffset=30s``, ``-search.maxQueryLen=16384``, ...),
as an operator would start it; extra flags only where a test says so. History goes in
through its own import API (:meth:`VictoriaMetrics.import_openmetrics`: the OpenMetrics file
that :class:`~tests.harness.prom.OpenMetricsWriter` writes for Prometheus' backfill, its
timestamps turned to milliseconds for ``/api/v1/import/prometheus``), so both stores hold the
same labelled history.

Facts these helpers rely on (1.79 as packaged by Debian): imported samples become searchable
within about a second (``/internal/force_flush`` makes it sooner; we poll a count, never
sleep); the Debian package enables a systemd service, which we never use; the query API is
served under ``/`` and ``/prometheus`` (vmselect's ``/select/<tenant>/prometheus`` is the
cluster's, not this binary's).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tests.harness.poll import wait_until
from tests.harness.server import ServerProcess

VICTORIA_BIN = os.environ.get("VICTORIA_METRICS_BIN", "/usr/bin/victoria-metrics")
_HINT = "install the Debian package 'victoria-metrics' (make test does: apt-get install victoria-metrics)"
_CHUNK = 8 << 20  # bytes per import request


class VictoriaMetrics(ServerProcess):
    """A private single-node VictoriaMetrics on 127.0.0.1 for one test module (a context manager)."""

    name = "victoria-metrics"
    ready_path = "/health"

    def __init__(self, tmp_dir: Path, extra_args: tuple[str, ...] = (), start_timeout: float = 60.0) -> None:
        super().__init__(tmp_dir, start_timeout)
        self.extra_args = extra_args

    def prepare(self) -> None:
        if not (os.path.isfile(VICTORIA_BIN) and os.access(VICTORIA_BIN, os.X_OK)):
            raise RuntimeError(f"{VICTORIA_BIN} not found or not executable: {_HINT}")

    def command(self, port: int) -> list[str]:
        return [VICTORIA_BIN, f"-storageDataPath={self.tmp_dir / 'data'}", f"-httpListenAddr=127.0.0.1:{port}",
                *self.extra_args]

    def _post(self, path: str, body: bytes, content_type: str = "text/plain") -> bytes:
        req = urllib.request.Request(self.url + path, data=body, method="POST",
                                     headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return bytes(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"POST {path}: HTTP {e.code}: {e.read()[:300]!r}\n{self.log_tail(10)}") from None

    def import_openmetrics(self, path: Path) -> int:
        """Import an OpenMetrics file (seconds) through ``/api/v1/import/prometheus`` (milliseconds);
        returns the finite samples sent, once all of them are searchable."""
        sent = 0
        names: set[str] = set()
        buf: list[str] = []
        size = 0
        with open(path) as f:
            for line in f:
                if not line.strip() or line.startswith("#"):
                    continue
                head, _, ts = line.rstrip("\n").rpartition(" ")
                names.add(head.partition("{")[0])
                buf.append(f"{head} {round(float(ts) * 1000)}\n")
                size += len(buf[-1])
                sent += math.isfinite(float(head.rpartition(" ")[2]))  # its count_over_time skips NaN
                if size >= _CHUNK:
                    self._post("/api/v1/import/prometheus", "".join(buf).encode())
                    buf, size = [], 0
        if buf:
            self._post("/api/v1/import/prometheus", "".join(buf).encode())
        self._post("/internal/force_flush", b"")
        wait_until(lambda: self.samples(names) >= sent, timeout=600, interval=0.5, what=f"{sent} samples searchable")
        return sent

    def samples(self, names: set[str]) -> int:
        """Samples stored under these metric names, counted name by name: one query over every
        series would pass the default -search.maxUniqueTimeseries (300,000) at 10,000 nodes."""
        total = 0
        for name in sorted(names):
            query = urllib.parse.urlencode({"query": f'sum(count_over_time({{__name__="{name}"}}[3650d]))',
                                            "nocache": "1"})
            body = self._post("/api/v1/query", query.encode(), "application/x-www-form-urlencoded")
            result = json.loads(body)["data"]["result"]
            total += int(float(result[0]["value"][1])) if result else 0
        return total


def available() -> bool:
    return shutil.which(VICTORIA_BIN) is not None or os.access(VICTORIA_BIN, os.X_OK)
