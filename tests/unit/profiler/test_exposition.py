"""The profiler's /metrics is written by the exporter's writer from schema rows (issue 39): every
family it publishes is a row of ``schema.PROFILER_FAMILIES`` and every row is published, with the
same negotiation as ``serve`` (OpenMetrics, gzip) and no ``*_created`` samples."""

from __future__ import annotations

import gzip
import threading
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.schema import PROFILER_FAMILIES, PROFILER_FAMILY_BY_NAME
from exporter.platform.exposition import OPENMETRICS_TYPE, TEXT_TYPE
from exporter.profiler.loop import ProfilerMetrics, make_server
from tests.harness.profiler_http import AlwaysHealthy
from tests.harness.prom import check_metrics


def _metrics() -> ProfilerMetrics:
    """Metrics with every family present: a leader with Events, a cycle timed, a pattern published."""
    m = ProfilerMetrics()
    leading = threading.Event()
    leading.set()
    m.attach(SimpleNamespace(elector=SimpleNamespace(leading=leading),  # type: ignore[arg-type]
                             events=SimpleNamespace(counts={"created": 2, "dropped": 1}),
                             reader=SimpleNamespace(client=SimpleNamespace(largest_response_bytes=1234),
                                                    refusals={"prometheus_too_many_series": 2})))
    m.cycles.labels("ok").inc()
    m.duration.observe(0.3)
    m.queries.inc(7)
    m.requests.inc(8)
    m.patched.inc()
    m.last_success.set(1767225600)
    m.gpus.labels("idle").set(3)
    m.pattern_collector.patterns[("node-1", "0")] = "idle"
    return m


@pytest.mark.slow  # promtool
def test_every_family_is_a_row_and_every_row_is_published() -> None:
    text = _metrics().exposition().decode()
    names = {f.name + ("_total" if f.type == "counter" else "") for f in text_string_to_metric_families(text)}
    assert names == set(PROFILER_FAMILY_BY_NAME)
    for f in text_string_to_metric_families(text):
        row = PROFILER_FAMILY_BY_NAME[f.name + ("_total" if f.type == "counter" else "")]
        assert (f.type, f.documentation) == (row.kind, row.help)
        for s in f.samples:
            extra = {"le"} if row.kind == "histogram" else set()
            assert set(s.labels) - extra == set(row.labels), s
    assert "_created" not in text
    assert check_metrics(text) == []


def test_openmetrics_has_units_and_ends_in_eof() -> None:
    om = _metrics().exposition(openmetrics=True).decode()
    assert om.endswith("# EOF\n") and "_created" not in om
    assert "# TYPE gpu_profiler_cycles counter\n" in om  # OpenMetrics names a counter family without _total
    assert "# UNIT gpu_profiler_cycle_duration_seconds seconds\n" in om
    assert "gpu_profiler_cycles_total{result=\"ok\"} 1\n" in om
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families

    assert sum(1 for _ in om_families(om)) == len(PROFILER_FAMILIES)  # the OpenMetrics parser accepts it whole


@pytest.fixture
def port() -> Iterator[int]:
    srv = make_server("127.0.0.1", 0, _metrics(), AlwaysHealthy())  # type: ignore[arg-type]
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _get(port: int, headers: dict[str, str]) -> tuple[bytes, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read(), r.headers


@pytest.mark.parametrize(("accept", "encoding", "ctype"), [
    ("", "", TEXT_TYPE),
    ("application/openmetrics-text; version=1.0.0", "", OPENMETRICS_TYPE),
    ("", "gzip", TEXT_TYPE),
    ("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5", "gzip, deflate", OPENMETRICS_TYPE),
])
def test_the_endpoint_negotiates_as_serve_does(port: int, accept: str, encoding: str, ctype: str) -> None:
    body, headers = _get(port, {k: v for k, v in (("Accept", accept), ("Accept-Encoding", encoding)) if v})
    assert headers["Content-Type"] == ctype and headers["Vary"] == "Accept, Accept-Encoding"
    if encoding:
        assert headers["Content-Encoding"] == "gzip"
        body = gzip.decompress(body)
    else:
        assert headers.get("Content-Encoding") is None
    text = body.decode()
    assert text.endswith("# EOF\n") == (ctype == OPENMETRICS_TYPE)
    assert "gpu_profiler_cycles_total" in text and "_created" not in text
    # the other format, asked right after, is not the cached first one
    other, h2 = _get(port, {} if ctype == OPENMETRICS_TYPE else {"Accept": "application/openmetrics-text"})
    assert h2["Content-Type"] != ctype and other.endswith(b"# EOF\n") != text.endswith("# EOF\n")
