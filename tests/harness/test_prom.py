"""Self-tests for tests/harness/prom.py against the real Debian prometheus/promtool binaries."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness import prom as prom_mod
from tests.harness.prom import (
    ExpositionServer,
    OpenMetricsWriter,
    Prometheus,
    PrometheusError,
    backfill_openmetrics,
    check_metrics,
    free_port,
)

pytestmark = pytest.mark.prometheus

MakeProm = Callable[..., Prometheus]


def _exposition(celsius: float) -> str:
    return (
        "# HELP demo_temperature_celsius Die temperature.\n"
        "# TYPE demo_temperature_celsius gauge\n"
        f'demo_temperature_celsius{{gpu="0"}} {celsius}\n'
    )


def test_scrape_query_alert_and_reload(make_prometheus: MakeProm, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(
        "groups:\n- name: demo\n  rules:\n"
        "  - alert: DemoHot\n    expr: demo_temperature_celsius > 40\n    labels: {severity: warning}\n"
    )
    dead = f"127.0.0.1:{free_port()}"
    with ExpositionServer(_exposition(42.5)) as target:
        prom = make_prometheus(scrape_targets=[target.target, dead], rule_files=[rules], job_name="demo")
        up = prom.wait_for_up(target.target)
        assert up["metric"]["job"] == "demo"
        # Once the dead target has been tried, its scrape error is in wait_for_up's failure message.
        prom.wait_for(f'up{{instance="{dead}"}} == 0', timeout=10)
        with pytest.raises(AssertionError, match=f"{dead}/metrics: health=down lastError=.*refused"):
            prom.wait_for_up(dead, timeout=1)
        assert prom.value('demo_temperature_celsius{gpu="0"}') == 42.5
        assert target.scrapes >= 1

        hot = prom.wait_for('ALERTS{alertname="DemoHot",alertstate="firing"}', timeout=10)
        assert hot[0]["metric"]["severity"] == "warning"

        # The value follows the target: nothing is cached between harness and server.
        target.body = _exposition(17.0)
        prom.wait_for('demo_temperature_celsius{gpu="0"}', lambda r: float(r[0]["value"][1]) == 17.0)

        # The alert resolves once the new value is evaluated.
        groups = prom.rules()
        assert [g["name"] for g in groups] == ["demo"]
        assert groups[0]["rules"][0]["health"] == "ok"
        prom.wait_for('ALERTS{alertname="DemoHot"}', lambda r: r == [], timeout=10)
        assert prom.alerts() == []

        rules.write_text(
            "groups:\n- name: demo\n  rules:\n  - alert: DemoCold\n    expr: demo_temperature_celsius < 20\n"
        )
        prom.reload()
        firing = prom.wait_for('ALERTS{alertname="DemoCold",alertstate="firing"}', timeout=10)
        assert firing[0]["metric"]["gpu"] == "0"
        assert [a["labels"]["alertname"] for a in prom.alerts()] == ["DemoCold"]


def test_query_errors_carry_prometheus_message(make_prometheus: MakeProm) -> None:
    prom = make_prometheus()
    with pytest.raises(PrometheusError, match="parse error"):
        prom.query("sum(")
    assert prom.query("vector(3)")[0]["value"][1] == "3"
    assert prom.value("scalar(vector(2)) * 2") == 4.0
    assert prom.query("absent_metric_xyz") == []


def test_reload_with_bad_config_raises(make_prometheus: MakeProm) -> None:
    prom = make_prometheus()
    prom.extra_scrape_configs = [{"job_name": "broken", "scrape_interval": "not-a-duration"}]
    with pytest.raises(PrometheusError, match="HTTP 500"):
        prom.reload()
    assert prom.running


def test_backfill_and_query_the_past(make_prometheus: MakeProm, tmp_path: Path) -> None:
    # Five hours ending two days ago: crosses 2 h block boundaries and is older than anything "now".
    end = math.floor(time.time() / 60) * 60 - 2 * 86400
    start = end - 5 * 3600
    step = 60

    def temp(node: int, t: float) -> float:
        return 30 + node + (t - start) / 3600

    weird = 'a"b\\c\nd'
    with OpenMetricsWriter(tmp_path / "hist.om") as w:
        for node in range(3):
            # Given out of order on purpose: the writer must sort.
            pts = [(start + i * step, temp(node, start + i * step)) for i in range(5 * 60 + 1)]
            w.add("hist_temperature_celsius", {"node": f"n{node}"}, reversed(pts))
            w.add("hist_energy_joules_total", {"node": f"n{node}"},
                  [(t, 100.0 * (t - start)) for t, _ in pts], type="counter")  # fmt: skip
        w.add("hist_info", {"node": "n0", "desc": weird}, [(start, 1.0), (end, 1.0)])
    assert (w.series_count, w.sample_count) == (7, 6 * 301 + 2)
    assert (w.min_ts, w.max_ts) == (start, end)
    text = (tmp_path / "hist.om").read_text()
    assert text.endswith("# EOF\n")
    assert text.count("# TYPE hist_energy_joules counter") == 1  # one family block, not interleaved

    prom = make_prometheus(tsdb_blocks_from=tmp_path / "hist.om")
    at = start + 3 * 3600
    res = prom.query("hist_temperature_celsius", time=at)
    assert {r["metric"]["node"]: float(r["value"][1]) for r in res} == {
        f"n{n}": pytest.approx(temp(n, at)) for n in range(3)
    }
    assert prom.value('rate(hist_energy_joules_total{node="n1"}[5m])', time=at) == pytest.approx(100.0)
    assert prom.query("hist_temperature_celsius") == []  # nothing near "now"
    info = prom.query("hist_info", time=end)
    assert info[0]["metric"]["desc"] == weird

    series = prom.query_range('hist_temperature_celsius{node="n2"}', start, end, step)
    values = series[0]["values"]
    assert len(values) == 5 * 60 + 1
    assert float(values[-1][1]) == pytest.approx(temp(2, end))


def test_backfill_text_and_block_dir(make_prometheus: MakeProm, tmp_path: Path) -> None:
    t = math.floor(time.time()) - 3 * 86400
    backfill_openmetrics(f"# TYPE x gauge\nx 7 {t}\n# EOF\n", tmp_path / "blocks")
    assert any((b / "meta.json").exists() for b in (tmp_path / "blocks").iterdir())
    prom = make_prometheus(tsdb_blocks_from=tmp_path / "blocks")
    assert prom.value("x", time=t + 30) == 7.0
    with pytest.raises(ValueError, match="EOF"):
        backfill_openmetrics("x 1 1\n", tmp_path / "other")


def test_writer_rejects_bad_series(tmp_path: Path) -> None:
    with OpenMetricsWriter(tmp_path / "bad.om") as w:
        with pytest.raises(ValueError, match="must end in _total"):
            w.add("energy_joules", {}, [(1, 1)], type="counter")
        with pytest.raises(ValueError, match="invalid label name '0bad'"):
            w.add("g", {"0bad": "x"}, [(1, 1)])
        with pytest.raises(ValueError, match="duplicate or non-finite timestamp 5"):
            w.add("g", {"a": "1"}, [(5, 1), (5, 2)])
        w.add("g", {"a": "2"}, [(1, 1)])
        with pytest.raises(ValueError, match="added twice"):
            w.add("g", {"a": "2"}, [(2, 1)])
        with pytest.raises(ValueError, match="added as gauge and as counter"):
            w.add("g_total", {}, [(1, 1)], type="counter")


def test_check_metrics() -> None:
    bad = "# HELP demo_errors Errors.\n# TYPE demo_errors counter\ndemo_errors 3\n"
    findings = check_metrics(bad)
    assert len(findings) == 1 and '"_total" suffix' in findings[0], findings
    good = "# HELP demo_errors_total Errors.\n# TYPE demo_errors_total counter\ndemo_errors_total 3\n"
    assert check_metrics(good) == []
    assert check_metrics("broken{ 1\n")[0].startswith("error while linting")


def test_missing_binary_is_a_loud_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(prom_mod, "PROMETHEUS_BIN", str(tmp_path / "no-prometheus"))
    with pytest.raises(RuntimeError, match=r"no-prometheus.*Debian package 'prometheus'"):
        Prometheus(tmp_path).start()
