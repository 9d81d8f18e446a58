"""The profiler's HTTP server alone, in a process of its own: ``python -m tests.harness.profiler_http --port P``.

It is the real ``make_server`` of ``gpu-exporter profile`` with its real metrics registry; only the
health check is a stand-in that always says ok, so that tests measure the server, not a cycle.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from exporter.profiler.loop import ProfilerMetrics, make_server


class AlwaysHealthy:
    """A health check that always says ok: the server is measured, not a profiler cycle."""

    def check(self) -> tuple[bool, str]:
        return True, "ok"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--web-config-file")
    a = p.parse_args()
    kw: dict[str, Any] = {}
    if a.web_config_file:
        from exporter.platform.webconfig import load

        kw["web"] = load(a.web_config_file)
    metrics = ProfilerMetrics()
    srv = make_server("127.0.0.1", a.port, metrics, AlwaysHealthy(), **kw)  # type: ignore[arg-type]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        srv.serve_forever()
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
