"""The alert and recording rules (dashboards/rules/) in VictoriaMetrics' vmalert (issue 37).

* Every rule file loads in ``vmalert -dryRun`` (Debian's ``victoria-metrics`` package; its
  MetricsQL parser checks every expression).
* The promtool unit tests (dashboards/rules/tests/) replayed there: each test case's input
  series are imported into a real VictoriaMetrics (its own import API, each case in a time
  window of its own, shifted from promtool's 1970 to recent hours: VictoriaMetrics refuses
  samples outside its retention), ``vmalert -replay.*`` evaluates the test's rule files over
  those windows and writes the recording rules' series and ``ALERTS`` back, and each
  ``promql_expr_test`` and ``alert_rule_test`` is asked at its eval time. The answers must be
  promtool's, except the cases listed in :data:`DIFFERENCES` (docs/alerts.md, "VictoriaMetrics"),
  each with why.

vmalert 1.79 has no unit-test runner of its own (``vmalert-tool unittest`` came later), hence
the replay.
"""

from __future__ import annotations

import math
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.platform.units import parse_duration
from tests.harness.victoria import VictoriaMetrics

pytestmark = pytest.mark.prometheus

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "dashboards" / "rules"
RULE_FILES = sorted(RULES_DIR.glob("*.yaml"))
UNIT_TESTS = sorted((RULES_DIR / "tests").glob("*.yaml"))
VMALERT = "/usr/bin/vmalert"

# (test file, case index, eval time, alertname or expr) -> why VictoriaMetrics answers otherwise
# (docs/alerts.md, "VictoriaMetrics and vmalert", lists them for readers)
LOOKBACK = ("a series that stopped is gone for VictoriaMetrics one interval after its last sample, for "
            "Prometheus only after its 5 m lookback: the alert turns pending earlier")
INCREASE = ("MetricsQL's increase() counts a counter that first appears in the window from 0 (Prometheus' "
            "needs two samples in the window): counters born non-zero count as a rise")
SUBQUERY = ("MetricsQL counts the steps of count_over_time(vector(1)[5m:]) otherwise than Prometheus, so the "
            "5-minute averages of the time-sliced shares differ")
DIFFERENCES: dict[tuple[str, int, str, str], str] = {
    ("alerts_test.yaml", 1, "14m", "GPUExporterAbsent"): LOOKBACK,
    ("alerts_test.yaml", 5, "15m", "GPUExporterCollectionStale"): LOOKBACK,
    ("alerts_test.yaml", 5, "16m", "GPUExporterCollectionStale"): LOOKBACK,
    ("alerts_test.yaml", 11, "30m", "GPUPowerCapped"): LOOKBACK.replace("turns pending earlier",
                                                                         "loses its pending state in a gap"),
    ("alerts_test.yaml", 12, "2m", "GPUUncorrectableEccErrors"): INCREASE,
    ("alerts_test.yaml", 12, "5m", "GPUUncorrectableEccErrors"): INCREASE,
    ("alerts_test.yaml", 21, "25m", "GPUProfilerStale"): LOOKBACK,
    ("alerts_test.yaml", 21, "26m", "GPUProfilerStale"): LOOKBACK,
    **{("cost_test.yaml", 0, "10m", expr): SUBQUERY for expr in (
        "pod:gpu_allocated_seconds:rate5m", "namespace:gpu_allocated_seconds:rate5m", "pod:gpu_energy_joules:rate5m",
        "namespace:gpu_energy_joules:rate5m", "namespace:gpu_allocated_idle_seconds:rate5m")},
}
DIFFERENCES[("compat_nvidia_gpu_exporter_test.yaml", 1, "2m", "nvidia_smi_compute_apps_last_collect_success")] = (
    "MetricsQL's `or` keeps the right-hand (gpu_up == 1) * 0 for a GPU whose left-hand gpu_processes series "
    "exists, where Prometheus drops it: 0 instead of 1 for an exporter that read every process list")
# vmalert adds the group's name to every alert (``alertgroup``); Prometheus does not
VMALERT_LABELS = ("alertgroup",)


@pytest.mark.parametrize("rule_file", RULE_FILES, ids=lambda p: p.name)
def test_rules_load_in_vmalert(rule_file: Path) -> None:
    proc = subprocess.run([VMALERT, "-dryRun", f"-rule={rule_file}"], capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and " error " not in out.lower(), out[-2000:]


# ---- promtool's input series notation ---------------------------------------------------------

_NUM = r"(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_ITEM = re.compile(rf"(?P<a>[-+]?{_NUM}|_|stale)(?:(?P<op>[-+])(?P<b>{_NUM}))?(?:x(?P<n>\d+))?\Z")


def expand(values: str) -> list[float | None]:
    """promtool's ``values`` (``0+10x3 _ 5 _x2 stale``): one entry per interval, None for a
    missing sample; ``stale`` (a staleness marker) is None too: VictoriaMetrics has none."""
    out: list[float | None] = []
    for item in values.split():
        m = _ITEM.match(item)
        if m is None:
            raise ValueError(f"promtool values item {item!r} not understood")
        a, n = m["a"], int(m["n"]) if m["n"] else None
        if a in ("_", "stale"):
            out += [None] * (n if n is not None else 1)
            continue
        start, step = float(a), float(m["b"] or 0) * (-1 if m["op"] == "-" else 1)
        out += [start + i * step for i in range((n if n is not None else 0) + 1)]
    return out


_SERIES = re.compile(r'\s*([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(?:\{(.*)\})?\s*\Z', re.S)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def labels_of(series: str) -> dict[str, str]:
    """``name{a="b"}`` -> {"__name__": name, "a": "b"} (promtool's series and exp_samples labels)."""
    m = _SERIES.match(series)
    if m is None:
        raise ValueError(f"series {series!r} not understood")
    out = {"__name__": m[1]} if m[1] else {}
    body = m[2] or ""
    pos = 0
    while pos < len(body.strip()):
        lm = _LABEL.match(body, pos)
        if lm is None:
            raise ValueError(f"labels {body!r} not understood at {pos}")
        out[lm[1]] = bytes(lm[2], "utf-8").decode("unicode_escape")
        pos = lm.end()
    return out


def test_promtool_notation() -> None:
    assert expand("0+10x3 _ 5 _x2 stale 1-1x2 3x1") == [0, 10, 20, 30, None, 5, None, None, None, 1, 0, -1, 3, 3]
    assert labels_of('up{job="a", instance="b:1"}') == {"__name__": "up", "job": "a", "instance": "b:1"}
    assert labels_of('{__name__="x", a="q\\"t"}') == {"__name__": "x", "a": 'q"t'}


# ---- the replay ---------------------------------------------------------------------------------


def _line(labels: dict[str, str], value: float, ts_ms: int) -> str:
    name = labels["__name__"]
    rest = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                    for k, v in labels.items() if k != "__name__")
    return f"{name}{{{rest}}} {value!r} {ts_ms}\n"


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _query(vm: VictoriaMetrics, expr: str, at: float) -> list[dict[str, Any]]:
    body = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}", "nocache": "1"}).encode()
    with urllib.request.urlopen(urllib.request.Request(vm.url + "/api/v1/query", data=body), timeout=60) as r:
        import json

        return list(json.loads(r.read())["data"]["result"])


def _reads(expr: str, name: str) -> bool:
    return re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", expr) is not None


def layers(rule_files: list[str]) -> list[list[dict[str, Any]]]:
    """The rules of ``rule_files`` in dependency layers: a rule is in the layer after the last one
    holding a recording rule its expression reads (in any group or file). Each layer is a list of
    groups (the original group's settings, the layer's rules), in the original order."""
    groups = [g for f in rule_files for g in yaml.safe_load(Path(f).read_text())["groups"]]
    rules = [(gi, r) for gi, g in enumerate(groups) for r in g["rules"]]
    depth: dict[int, int] = {}
    while len(depth) < len(rules):
        before = len(depth)
        for i, (_, r) in enumerate(rules):
            if i in depth:
                continue
            deps = [j for j, (_, o) in enumerate(rules) if j != i and "record" in o and _reads(r["expr"], o["record"])]
            if all(j in depth for j in deps):
                depth[i] = 1 + max((depth[j] for j in deps), default=-1)
        assert len(depth) > before, f"recording rules read each other in a cycle: {rule_files}"
    out: list[list[dict[str, Any]]] = []
    for d in range(max(depth.values()) + 1):
        layer = []
        for gi, g in enumerate(groups):
            mine = [r for i, (gj, r) in enumerate(rules) if gj == gi and depth[i] == d]
            if mine:
                layer.append({**g, "rules": mine})
        out.append(layer)
    return out


def _replay(test_file: Path, tmp: Path) -> Iterator[tuple[int, dict[str, Any], VictoriaMetrics, float, float]]:
    doc = yaml.safe_load(test_file.read_text())
    rules = [str((test_file.parent / r).resolve()) for r in doc["rule_files"]]
    interval = parse_duration(str(doc.get("evaluation_interval", "1m")))
    # each case in a window of its own, an hour longer than its longest series or eval time (no
    # lookback reaches the case before), ending two hours ago: inside the 1-month retention
    spans = [max([parse_duration(str(t["eval_time"])) for t in
                  case.get("alert_rule_test", []) + case.get("promql_expr_test", [])]
                 + [len(expand(str(s["values"]))) * parse_duration(str(case.get("interval", "1m")))
                    for s in case.get("input_series", [])]) for case in doc["tests"]]
    gap = (int(max(spans)) // 3600 + 2) * 3600
    base = (int(time.time()) // 3600 - 2) * 3600 - gap * len(doc["tests"])
    lines: list[str] = []
    last = base
    windows = []
    for k, case in enumerate(doc["tests"]):
        t0 = base + k * gap
        step = parse_duration(str(case.get("interval", "1m")))
        for s in case.get("input_series", []):
            labels = labels_of(s["series"])
            for i, v in enumerate(expand(str(s["values"]))):
                if v is not None and math.isfinite(v):
                    lines.append(_line(labels, v, round((t0 + i * step) * 1000)))
        evals = [parse_duration(str(t["eval_time"])) for t in
                 case.get("alert_rule_test", []) + case.get("promql_expr_test", [])]
        last = max(last, t0 + max(evals, default=0))
        windows.append(t0)
    with VictoriaMetrics(tmp / "vm") as vm:
        vm._post("/api/v1/import/prometheus", "".join(lines).encode())
        vm._post("/internal/force_flush", b"")
        # vmalert's replay evaluates one rule after another and relies on -replay.rulesDelay for a
        # rule to see an earlier one's output (3 s per rule: minutes per file, and still a race).
        # Instead the rules run in dependency layers, one vmalert per layer with no delay, the store
        # flushed between layers: a rule runs only after everything it reads is written.
        for k_layer, layer in enumerate(layers(rules)):
            layer_file = tmp / f"layer{k_layer}.yaml"
            layer_file.write_text(yaml.safe_dump({"groups": layer}, sort_keys=False))
            proc = subprocess.run(
                [VMALERT, f"-rule={layer_file}", f"-datasource.url={vm.url}", f"-remoteWrite.url={vm.url}",
                 f"-replay.timeFrom={_rfc3339(base)}", f"-replay.timeTo={_rfc3339(last + interval)}",
                 f"-evaluationInterval={int(interval)}s", f"-datasource.queryStep={int(interval)}s",
                 "-replay.disableProgressBar", "-replay.rulesDelay=0s",
                 "-remoteWrite.flushInterval=1s", "-httpListenAddr=127.0.0.1:0"],
                capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
            vm._post("/internal/force_flush", b"")
        for k, case in enumerate(doc["tests"]):
            yield k, case, vm, windows[k], interval


def test_layers_put_each_rule_after_what_it_reads() -> None:
    recording = str(RULES_DIR / "gpu-exporter-recording.yaml")
    alerts = str(RULES_DIR / "gpu-exporter-alerts.yaml")
    found = layers([recording, alerts])
    where: dict[str, int] = {}
    for d, layer in enumerate(found):
        for g in layer:
            for r in g["rules"]:
                where.setdefault(r.get("record") or r["alert"], d)
    every = [r for f in (recording, alerts) for g in yaml.safe_load(Path(f).read_text())["groups"] for r in g["rules"]]
    assert sum(len(g["rules"]) for layer in found for g in layer) == len(every)
    for r in every:
        for o in every:
            if "record" in o and o is not r and _reads(r["expr"], o["record"]):
                assert where[r.get("record") or r["alert"]] > where[o["record"]], (r, o["record"])
    # the namespace rules read the cost group's share, a later group: a later layer, not a second pass
    assert where["namespace:gpu_allocated:sum"] > where["gpu:allocation_share:ratio"]
    assert len(found) >= 3


def _value_close(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1.0)


def _samples(result: list[dict[str, Any]]) -> list[tuple[dict[str, str], float]]:
    return sorted(((r["metric"], float(r["value"][1])) for r in result), key=lambda x: sorted(x[0].items()))


@pytest.mark.timeout(900)  # one vmalert replay per dependency layer
@pytest.mark.parametrize("test_file", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_tests_give_the_same_answers_in_vmalert(test_file: Path, tmp_path: Path) -> None:
    wrong: list[str] = []
    seen_differ: set[tuple[str, int, str, str]] = set()
    checked = 0
    for k, case, vm, t0, interval in _replay(test_file, tmp_path):
        for t in case.get("promql_expr_test", []):
            at = t0 + parse_duration(str(t["eval_time"]))
            want = sorted(((labels_of(s.get("labels", "{}")), float(s["value"])) for s in t.get("exp_samples", [])),
                          key=lambda x: sorted(x[0].items()))
            got = _samples(_query(vm, t["expr"], at))
            ok = len(got) == len(want) and all(g[0] == w[0] and _value_close(g[1], w[1])
                                               for g, w in zip(got, want, strict=True))
            checked += 1
            key = (test_file.name, k, str(t["eval_time"]), t["expr"])
            if not ok:
                seen_differ.add(key)
                if key not in DIFFERENCES:
                    wrong.append(f"{key}: want {want}, got {got}")
        for t in case.get("alert_rule_test", []):
            at = t0 + parse_duration(str(t["eval_time"]))
            name = t["alertname"]
            # the state of the last evaluation at or before the eval time (vmalert's replay steps
            # need not fall on promtool's grid)
            skip = ("alertstate", "__name__", *VMALERT_LABELS)
            got_alerts = sorted(sorted((k2, v) for k2, v in r["metric"].items() if k2 not in skip)
                                for r in _query(vm, f'last_over_time(ALERTS{{alertname="{name}", '
                                                    f'alertstate="firing"}}[{int(interval)}s])', at))
            want_alerts = sorted(sorted({**{k2: str(v) for k2, v in a.get("exp_labels", {}).items()},
                                         "alertname": name}.items()) for a in t.get("exp_alerts", []))
            checked += 1
            key = (test_file.name, k, str(t["eval_time"]), name)
            if got_alerts != want_alerts:
                seen_differ.add(key)
                if key not in DIFFERENCES:
                    wrong.append(f"{key}: want {want_alerts}, got {got_alerts}")
    assert checked > 0
    assert wrong == [], "\n".join(wrong)
    listed = {k for k in DIFFERENCES if k[0] == test_file.name}
    assert listed <= seen_differ, f"listed differences that no longer differ: {sorted(listed - seen_differ)}"
