"""Long-term stores (Mimir, Cortex, Thanos behind a tenancy proxy): extra request headers and
a bearer-token file, proven against a header-checking proxy in front of a real Prometheus."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.profiler.main import run
from tests.fakes.profiler_history import scenario_node
from tests.harness.profiler import FaultProxy, history_file
from tests.harness.prom import Prometheus

pytestmark = pytest.mark.prometheus

END = float(int(time.time()) - 60)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultProxy]:
    """A tenancy proxy in front of a real Prometheus: it forwards only requests carrying ``X-Scope-OrgID:
    team-a`` and the bearer token, and answers 401 ``no org id`` otherwise, as Mimir does without an org id."""
    tmp = tmp_path_factory.mktemp("longterm")
    hist = scenario_node(21, "lt-a", END)
    with Prometheus(tmp / "p", tsdb_blocks_from=history_file(tmp / "h.om", hist)) as prom, \
            FaultProxy(prom.url, tenant="team-a", token="s3cret") as p:
        yield p


def test_header_and_token_reach_prometheus_through_the_proxy(proxy: FaultProxy, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    out = io.StringIO()
    rc = run(["--prometheus-url", proxy.url, "--prometheus-header", "X-Scope-OrgID: team-a",
              "--prometheus-token-file", str(token), "--once", "--dry-run", "--at", str(END)],
             out=out, install_signals=False)
    assert rc == 0
    docs = [json.loads(line) for line in out.getvalue().splitlines()]
    ann = next(d for d in docs if d["node"] == "lt-a")["patch"]["metadata"]["annotations"]
    assert ann["gpu-exporter.io/gpu-2.pattern"] == "periodic"  # real data came back through the proxy
    assert proxy.headers and all(h.get("x-scope-orgid") == "team-a" for h in proxy.headers)


def test_without_the_tenant_the_cycle_fails_in_one_line(proxy: FaultProxy, tmp_path: Path,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret")
    rc = run(["--prometheus-url", proxy.url, "--prometheus-token-file", str(token), "--once", "--dry-run",
              "--at", str(END)], out=io.StringIO(), install_signals=False)
    assert rc == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "HTTP 401" in errors[0] and "no org id" in errors[0], errors
