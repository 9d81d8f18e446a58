"""Test helpers for the profiler: a fault-injecting proxy in front of a real Prometheus,
and small builders shared by the profiler test modules."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tests.fakes.profiler_history import GpuHistory, write_openmetrics
from tests.harness.prom import OpenMetricsWriter

MODES = (None, "500", "garbage", "slow", "nan", "empty", "hang")


class FaultProxy:
    """HTTP proxy on 127.0.0.1 forwarding to ``target`` (a Prometheus base URL).

    ``mode``: None passes through; ``"500"`` answers HTTP 500; ``"garbage"`` 200 with a body
    that is not JSON; ``"slow"`` waits ``delay`` s before passing through; ``"nan"`` passes
    through with every sample value replaced by NaN; ``"empty"`` passes through with empty
    results; ``"hang"`` holds the request until :meth:`release` (or stop). ``requests``
    counts what arrived.
    """

    def __init__(self, target: str, mode: str | None = None, delay: float = 2.0) -> None:
        assert mode in MODES
        self.target = target.rstrip("/")
        self.mode = mode
        self.delay = delay
        self.requests = 0
        self._release = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                outer.requests += 1
                mode = outer.mode
                if mode == "hang":
                    outer._release.wait(120)
                    mode = None
                if mode == "slow":
                    outer._release.wait(outer.delay)
                if mode == "500":
                    return self._send(500, b'{"status":"error","errorType":"internal","error":"injected"}')
                if mode == "garbage":
                    return self._send(200, b'{"status":"success","data":{"resultType":"vector","result":[{"met')
                code, data = forward_post(outer.target + self.path, body, self.headers.get("Content-Type", ""))
                if code == 200 and mode in ("nan", "empty"):
                    doc = json.loads(data)
                    if mode == "empty":
                        doc["data"]["result"] = []
                    else:
                        for s in doc["data"]["result"]:
                            if "value" in s:
                                s["value"][1] = "NaN"
                            for pt in s.get("values", []):
                                pt[1] = "NaN"
                    data = json.dumps(doc).encode()
                return self._send(code, data)

            def _send(self, code: int, data: bytes) -> None:
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    self.close_connection = True  # the client gave up (timeout)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    def release(self) -> None:
        """Let held ("hang") requests through."""
        self._release.set()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()


def forward_post(url: str, body: bytes, content_type: str) -> tuple[int, bytes]:
    """POST ``body`` to ``url`` (a proxy passing a query on to Prometheus): (status, answer body)."""
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def history_file(path: Path, histories: list[GpuHistory], node_label: bool = True) -> Path:
    """Write ``histories`` as OpenMetrics for backfilling; returns the path."""
    with OpenMetricsWriter(path) as w:
        write_openmetrics(w, histories, node_label=node_label)
    return path


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (the port was free a moment ago)."""
    from tests.harness.net import free_port

    return f"http://127.0.0.1:{free_port()}"
