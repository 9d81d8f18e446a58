"""The shipped alert rules against every simulated scenario, and the first run's papercuts.

Each scenario of ``--simulated-scenario`` runs for 37 simulated minutes in the real backend,
engine and renderer (tests/unit/backends/test_simulated.py steps their clock), and its
exposition every 30 s becomes the input series of a ``promtool test rules`` unit test,
labelled as Prometheus would store a scrape (``job``, ``instance``, ``node``; a series that
disappears gets a stale marker, as after a real scrape). ``promtool`` then evaluates
``dashboards/rules/gpu-exporter-alerts.yaml`` unchanged, ``for:`` durations included, every
15 s, and the test compares the set of (alert, GPU) firing at 6 and 36 minutes with what a
real fleet in that state must raise: no more, no less.

Every alert about a GPU state fires on at least one scenario (``driver``: the collection
fails). Alerts about the processes around the GPUs fire on a *stack* scenario (``STACK``):
the healthy scenario's exposition as Prometheus records it when the exporter is killed,
never deployed, or serving a hung collection, and the real profiler's own /metrics
(``ProfilerMetrics``) when its cycles fail, never finish, or it is killed. The pod-allocation
alerts fire when a pod holds the healthy scenario's idle GPU (``ALLOCATED``): a fake kubelet
behind serve's own attribution wiring, and the real profiler's verdict from a real Prometheus.
An alert that no scenario can raise would go into ``NOT_SIMULATED``, saying why (none does).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.backends.simulated import SCENARIOS, STATES
from exporter.core.readings import GpuReading
from tests.e2e.test_rules import RULES_DIR, alerts
from tests.harness.exporter import ExporterProcess, parse_samples
from tests.harness.poll import wait_until
from tests.harness.prom import Prometheus, promtool
from tests.unit.backends.test_simulated import expositions

ALERTS_FILE = RULES_DIR / "gpu-exporter-alerts.yaml"
STEP = 30.0
STEPS = 37 * 2  # 37 minutes
TARGET = {"job": "gpu-exporter", "instance": "127.0.0.1:9400", "node": "sim-node"}
GPUS = {"mixed": 9}  # every other scenario: the default 4 GPUs

# scenario -> eval time -> the (alertname, gpu) pairs firing then; gpu "" for a node-level alert.
LOST = {("GPULost", "0"), ("GPUFellOffTheBus", "")}
ECC = {("GPUUncorrectableEccErrors", "0"), ("GPURowRemapPending", "0"), ("GPURowRemapFailed", "0"),
       ("GPUCriticalXid", "0")}  # XID 64: row remapping failure
EXPECTED: dict[str, dict[str, set[tuple[str, str]]]] = {
    "healthy": {"6m": set(), "36m": set()},
    "lost": {"6m": LOST | {("GPUCriticalXid", "0")}, "36m": LOST},  # XID 79 once: critical for 10 minutes
    "mig": {"6m": set(), "36m": set()},
    "ecc": {"6m": ECC, "36m": ECC},
    "xid": {"6m": {("GPUCriticalXid", "0")}, "36m": {("GPUCriticalXid", "0")}},  # XID 119 every 10 minutes
    "throttle": {"6m": {("GPUHardwareSlowdown", "0")},  # for: 5m
                 "36m": {("GPUHardwareSlowdown", "0"), ("GPUTemperatureHigh", "0"), ("GPUThermalThrottling", "0"),
                         ("GPUPowerCapped", "1")}},  # 10m, 10m, 30m
    "leak": {"6m": set(), "36m": {("GPUMemoryNearlyFull", "0")}},  # under 5 % free after ~5 min, for: 15m
    "mixed": {  # mig, ecc, thermal, lost, xid, leak, power_cap, starved, healthy
        "6m": {(a, "1") for a, _ in ECC} | {("GPUHardwareSlowdown", "2"), ("GPULost", "3"), ("GPUFellOffTheBus", ""),
                                             ("GPUCriticalXid", "3"), ("GPUCriticalXid", "4")},
        "36m": {(a, "1") for a, _ in ECC} | {("GPUHardwareSlowdown", "2"), ("GPUTemperatureHigh", "2"),
                                              ("GPUThermalThrottling", "2"), ("GPULost", "3"),
                                              ("GPUFellOffTheBus", ""), ("GPUCriticalXid", "4"),
                                              ("GPUMemoryNearlyFull", "5"), ("GPUPowerCapped", "6"),
                                              ("GPUBusyButStarved", "7")}},  # for: 30m
    # the driver stops answering at 2 s: the collection fails (for: 5m) and every GPU it knew is down (for: 1m)
    "driver": {t: {("GPUExporterCollectionFailing", "")} | {("GPULost", str(g)) for g in range(4)}
               for t in ("6m", "36m")},
}
PROFILER_TARGET = {"job": "gpu-exporter-profiler", "instance": "127.0.0.1:9401"}
FAULT_AT = 6  # steps: the process fault of a stack scenario starts at minute 3
# stack scenario -> eval time -> (alertname, gpu) firing; the exporter underneath is "healthy"
STACK: dict[str, dict[str, set[tuple[str, str]]]] = {
    "exporter-killed": {"6m": set(), "36m": {("GPUExporterDown", "")}},  # up 0 from 3m, for: 5m
    "exporter-absent": {"6m": set(), "36m": {("GPUExporterAbsent", "")}},  # no target at all, for: 15m
    # background collection (COLLECTION_INTERVAL > 0) hung at 3m: scrapes serve the last bytes
    "collection-hung": {"6m": set(), "36m": {("GPUExporterCollectionStale", "")}},
    "profiler-killed": {"6m": set(), "36m": {("GPUProfilerDown", "")}},  # for: 10m
    "profiler-failing": {"6m": set(), "36m": {("GPUProfilerFailing", "")}},  # every cycle fails, for: 10m
    "profiler-hung": {"6m": set(), "36m": {("GPUProfilerStale", "")}},  # its first cycle never ends
}
# A pod holds healthy GPU 0 (the idle one) from the start, through the kubelet's pod-resources
# and serve's own attribution wiring; the profiler, run on that history in a real Prometheus,
# calls it allocated-idle. GPUAllocatedButIdle is for: 1h, GPUAllocatedIdlePattern for: 10m.
ALLOC_STEPS = 72 * 2
ALLOCATED: dict[str, set[tuple[str, str]]] = {
    "36m": set(), "72m": {("GPUAllocatedButIdle", "0"), ("GPUAllocatedIdlePattern", "0")}}
VERDICT_FROM = 40 * 2  # steps: the profiler's verdict is published from minute 40 (its window is 30)
# GPU alerts no scenario raises, with why and the GpuReading field whose arrival ends the excuse
NOT_SIMULATED: dict[str, tuple[str, str | None]] = {}


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples_of(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text -> {(name, labels): value}; label values stay escaped, as promtool reads them back.

    (prometheus_client's parser takes ten times as long; the output is checked by promtool in the
    unit tests of the backend.)"""
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[(m.group(1), frozenset(_PAIR.findall(m.group(2) or "")))] = float(m.group(3))
    return out


def _num(v: float) -> str:
    return "stale" if math.isnan(v) else repr(float(v))


Frame = dict[tuple[str, frozenset[tuple[str, str]]], float]


def frames(scenario: str, steps: int = STEPS, start: float = 0.0, step: float = STEP) -> list[Frame]:
    """The scenario's samples every ``step`` seconds from ``start`` (unix time of its first collection)."""
    out: list[Frame] = []
    for k, text in enumerate(expositions(scenario, GPUS.get(scenario, 4), [k * step for k in range(steps + 1)],
                                         start=start)):
        samples = samples_of(text)
        assert samples, text
        for key in [k_ for k_ in samples if k_[0] == "gpu_exporter_last_success_timestamp_seconds"]:
            samples[key] = start + k * step  # the engine stamps its wall clock; the run's clock is simulated
        out.append(samples)
    return out


def _keys(fs: list[Frame]) -> list[tuple[str, frozenset[tuple[str, str]]]]:
    return sorted({key for f in fs for key in f}, key=lambda k: (k[0], sorted(k[1])))


def input_series(scenario: str, steps: int = STEPS) -> list[dict[str, str]]:
    """The scenario's expositions every STEP seconds, as promtool input series."""
    fs = frames(scenario, steps)
    return [{"series": "up" + _labels(TARGET), "values": " ".join(["1"] * len(fs))}, *series_of(fs, TARGET)]


def series_of(fs: list[Frame | None], target: dict[str, str]) -> list[dict[str, str]]:
    """Frames (None: the scrape failed) as promtool input series labelled with ``target``; a
    series that disappears, or whose scrape fails, gets a stale marker as Prometheus writes one."""
    out = []
    for name, labels in _keys([f for f in fs if f is not None]):
        values, seen = [], False
        for f in fs:
            v = None if f is None else f.get((name, labels))
            values.append("_" if v is None and not seen else "stale" if v is None else _num(v))
            seen = v is not None
        out.append({"series": name + _labels({**dict(labels), **target}), "values": " ".join(values)})
    return out


def profiler_frames(kind: str, steps: int = STEPS) -> list[Frame]:
    """The real profiler's /metrics every STEP seconds: ``failing``, a cycle a minute (its default
    interval) against a Prometheus that refuses connections; ``hung``, a first cycle that never
    ends (nothing counted, nothing succeeded)."""
    from tests.harness.profiler import build_profiler, closed_port_url

    clock = [0.0]
    # a dry run without a cluster, as the profiler's flags build it; its clock stepped by this function
    prof = build_profiler(closed_port_url(), "--prometheus-timeout", "1", "--prometheus-retries", "0",
                          "--health-condition", "off", "--events", "off", clock=lambda: clock[0],
                          tune={"reader.client.backoff": 0.0, "_writers": None})
    out = []
    for k in range(steps + 1):
        clock[0] = k * STEP
        if kind == "failing" and k % 2 == 0:
            assert prof.run_cycle().errors == ["prometheus_unreachable"]
        out.append(samples_of(prof.metrics.exposition().decode()))
    return out


def stack_series(kind: str, steps: int = STEPS) -> list[dict[str, str]]:
    """What Prometheus holds in stack scenario ``kind`` (see ``STACK``)."""
    healthy = frames("healthy", steps)
    ones = " ".join(["1"] * (steps + 1))
    down_at_fault = " ".join("1" if k < FAULT_AT else "0" for k in range(steps + 1))
    if kind == "exporter-absent":  # Prometheus scrapes other things, never the exporter
        return [{"series": "up" + _labels({"job": "node-exporter", "instance": "127.0.0.1:9100"}), "values": ones}]
    if kind == "exporter-killed":
        killed: list[Frame | None] = [f if k < FAULT_AT else None for k, f in enumerate(healthy)]
        return [{"series": "up" + _labels(TARGET), "values": down_at_fault}, *series_of(killed, TARGET)]
    exporter = [{"series": "up" + _labels(TARGET), "values": ones}]
    if kind == "collection-hung":
        frozen: list[Frame | None] = [f if k < FAULT_AT else healthy[FAULT_AT - 1] for k, f in enumerate(healthy)]
        return exporter + series_of(frozen, TARGET)
    exporter += series_of(list(healthy), TARGET)
    if kind == "profiler-killed":
        prof: list[Frame | None] = [f if k < FAULT_AT else None for k, f in enumerate(profiler_frames("hung", steps))]
        # alive but between cycles until killed: its first cycle is still running (minute 3 < 15 min stale)
        return [*exporter, {"series": "up" + _labels(PROFILER_TARGET), "values": down_at_fault},
                *series_of(prof, PROFILER_TARGET)]
    fs = profiler_frames(kind.removeprefix("profiler-"), steps)
    return [*exporter, {"series": "up" + _labels(PROFILER_TARGET), "values": ones},
            *series_of(list(fs), PROFILER_TARGET)]


def allocated_series(tmp: Path, steps: int = ALLOC_STEPS) -> list[dict[str, str]]:
    """The healthy scenario with a pod holding GPU 0 (see ``ALLOCATED``), and the profiler's verdict."""
    from exporter.serve import config
    from exporter.serve.main import start_attribution
    from tests.fakes import kubelet as fake_kubelet
    from tests.harness.profiler import build_profiler
    from tests.harness.prom import OpenMetricsWriter

    end = float(int(time.time()) - 60)
    start = end - steps * STEP
    uuid = next(dict(ls)["uuid"] for (n, ls) in frames("healthy", 0)[0] if n == "gpu_info" and ("gpu", "0") in ls)
    with fake_kubelet.FakeKubelet() as kubelet:
        kubelet.set_response(fake_kubelet.response([fake_kubelet.pod("ml", "notebook-0",
                                                                     {"jupyter": [("nvidia.com/gpu", [uuid])]})]))
        settings = config.load(["--backend", "simulated", "--pod-attribution", "on", "--pod-resources-socket",
                                kubelet.path, "--pod-resources-interval", "1"])
        started: list[Any] = []

        def wire(engine: Any) -> None:
            started.append(start_attribution(settings, engine))
            wait_until(lambda: started[0].labels_for(_gpu0(uuid)), timeout=20, what="the first List")

        try:
            texts = list(expositions("healthy", 4, [k * STEP for k in range(steps + 1)], start=start, wire=wire))
        finally:
            for a in started:
                a.stop()
    fs = [samples_of(t) for t in texts]
    for k, f in enumerate(fs):
        for key in [k_ for k_ in f if k_[0] == "gpu_exporter_last_success_timestamp_seconds"]:
            f[key] = start + k * STEP
    assert any(n == "gpu_allocation_info" and ("pod", "notebook-0") in ls for (n, ls) in fs[-1]), "not attributed"
    # the profiler's verdict on that history, from a real Prometheus, at minute 40 and at the end
    with OpenMetricsWriter(tmp / "alloc.om") as w:
        for name, labels in _keys(fs):
            w.add(name, {**dict(labels), **TARGET},
                  [(start + k * STEP, f[(name, labels)]) for k, f in enumerate(fs) if (name, labels) in f])
    verdicts = []
    with Prometheus(tmp / "alloc-prom", tsdb_blocks_from=tmp / "alloc.om") as prom:
        prof = build_profiler(prom.url, "--health-condition", "off", "--events", "off", tune={"_writers": None})
        for k in (VERDICT_FROM, steps):
            assert prof.run_cycle(at=start + k * STEP).ok
            verdicts.append(samples_of(prof.metrics.exposition().decode()))
    key = ("gpu_profile_pattern", frozenset({("node", "sim-node"), ("gpu", "0"), ("pattern", "allocated-idle")}))
    assert all(v.get(key) == 1.0 for v in verdicts), [sorted(k for k in v if k[0] == "gpu_profile_pattern")
                                                     for v in verdicts]
    pattern = {k_: v for k_, v in verdicts[-1].items() if k_[0] == "gpu_profile_pattern"}
    prof_frames: list[Frame | None] = [None if k < VERDICT_FROM else pattern for k in range(steps + 1)]
    ones = " ".join(["1"] * (steps + 1))
    return [{"series": "up" + _labels(TARGET), "values": ones}, *series_of(list(fs), TARGET),
            {"series": "up" + _labels(PROFILER_TARGET), "values": ones}, *series_of(prof_frames, PROFILER_TARGET)]


def _gpu0(uuid: str) -> GpuReading:  # GPU 0, to ask the mapper
    return GpuReading(index=0, uuid=uuid, vendor="simulated")


def _labels(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def firing_test(scenario: str, expected: dict[str, set[tuple[str, str]]], steps: int = STEPS,
                series: list[dict[str, str]] | None = None) -> dict[str, Any]:
    cases = []
    for eval_time, pairs in expected.items():
        cases.append({
            "expr": 'group by (alertname, gpu) (ALERTS{alertstate="firing"})',
            "eval_time": eval_time,
            "exp_samples": [{"labels": _labels({"alertname": a, **({"gpu": g} if g else {})}), "value": 1}
                            for a, g in sorted(pairs)],
        })
    return {"name": f"scenario {scenario}", "interval": f"{STEP:g}s",
            "input_series": input_series(scenario, steps) if series is None else series, "promql_expr_test": cases}


def run_promtool(tmp: Path, tests: list[dict[str, Any]]) -> tuple[int, str]:
    doc = {"rule_files": [str(ALERTS_FILE)], "evaluation_interval": f"{STEP:g}s", "tests": tests}
    path = tmp / "scenarios_test.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML, and written a hundred times faster than PyYAML emits
    proc = promtool("test", "rules", str(path), timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def test_expectations_cover_every_alert() -> None:
    shipped = {r["alert"] for g in yaml.safe_load(ALERTS_FILE.read_text())["groups"] for r in g["rules"]
               if "alert" in r}
    assert shipped <= {a["alert"] for a in alerts()}
    fired = {a for per_time in (*EXPECTED.values(), *STACK.values(), ALLOCATED) for pairs in per_time.values()
             for a, _ in pairs}
    assert set(EXPECTED) == set(SCENARIOS)
    missing = shipped - fired - set(NOT_SIMULATED)
    assert not missing, f"alerts no scenario raises (add a scenario state or say why below): {missing}"
    assert not set(NOT_SIMULATED) & fired, "an alert a scenario raises is still excused in NOT_SIMULATED"
    for name, (_, reading) in NOT_SIMULATED.items():
        assert reading is None or reading not in {f.name for f in fields(GpuReading)}, (
            f"{name}: GpuReading.{reading} exists now: a simulated state must raise {name}")
    stack_only = {a for per_time in STACK.values() for pairs in per_time.values() for a, _ in pairs}
    for rule in (r for g in yaml.safe_load(ALERTS_FILE.read_text())["groups"] for r in g["rules"] if "alert" in r):
        if rule["alert"] in stack_only:  # raised by a process fault: it must not read GPU state
            gpu_reads = {m for m in re.findall(r"\bgpu_\w+", re.sub(r'"[^"]*"', "", str(rule["expr"])))
                         if not m.startswith(("gpu_exporter_", "gpu_profiler_"))}
            assert not gpu_reads, f"{rule['alert']} reads GPU state ({gpu_reads}): a GPU scenario must raise it"


@pytest.mark.prometheus
def test_every_scenario_raises_exactly_its_alerts(tmp_path: Path) -> None:
    code, out = run_promtool(tmp_path, [firing_test(s, EXPECTED[s]) for s in SCENARIOS])
    assert code == 0, out[-6000:]
    assert out.count("SUCCESS") == 1, out


@pytest.mark.prometheus
def test_every_stack_scenario_raises_exactly_its_alerts(tmp_path: Path) -> None:
    code, out = run_promtool(tmp_path, [firing_test(k, STACK[k], series=stack_series(k)) for k in STACK])
    assert code == 0, out[-6000:]
    assert out.count("SUCCESS") == 1, out


@pytest.mark.prometheus
def test_a_pod_holding_an_idle_gpu_raises_both_allocation_alerts(tmp_path: Path) -> None:
    series = allocated_series(tmp_path)
    code, out = run_promtool(tmp_path, [firing_test("allocated-idle", ALLOCATED, series=series)])
    assert code == 0, out[-6000:]
    assert out.count("SUCCESS") == 1, out


def test_the_profiler_frames_are_the_real_profilers() -> None:
    """Guards the stack scenarios' input: the failing profiler counts a failed cycle a minute and
    never a success; the hung one counts nothing."""
    failing, hung = profiler_frames("failing", 8), profiler_frames("hung", 8)
    failed = frozenset({("result", "failed")})
    assert [f.get(("gpu_profiler_cycles_total", failed)) for f in failing] == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0,
                                                                              4.0, 5.0]
    assert all(f[("gpu_profiler_last_success_timestamp_seconds", frozenset())] == 0.0 for f in failing + hung)
    assert all(f.get(("gpu_profiler_cycles_total", failed)) == 0.0 for f in hung)  # pre-set, never counted


@pytest.mark.prometheus
def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """Guards the test above: an alert that does not fire, or one that fires unexpectedly, fails it."""
    code, out = run_promtool(tmp_path, [firing_test("healthy", {"2m": {("GPULost", "0")}}, steps=8)])
    assert code != 0 and "GPULost" in out, out[-2000:]
    code, out = run_promtool(tmp_path, [firing_test("lost", {"2m": set()}, steps=8)])
    assert code != 0 and "GPULost" in out, out[-2000:]
    code, out = run_promtool(tmp_path, [firing_test("exporter-killed", {"36m": set()},
                                                    series=stack_series("exporter-killed"))])
    assert code != 0 and "GPUExporterDown" in out, out[-2000:]


# What the scenarios add to a healthy fleet: every dashboard target reading one of these must have data.
DRIVEN = ("gpu_up", "gpu_mig_", "gpu_ecc_", "gpu_remapped_rows", "gpu_throttle_reason_active",
          "gpu_violation_seconds_total", "gpu_xid_", "gpu_pci_devices", "gpu_visible_devices", "gpu_sm_active_ratio")


@pytest.mark.prometheus
def test_the_dashboards_show_the_mixed_scenario(tmp_path: Path) -> None:
    """The real exporter on the mixed scenario, scraped every second by a real Prometheus that
    evaluates the recording rules: every dashboard target that reads a family the scenarios drive
    (MIG, ECC, row remapping, throttling, violation time, XIDs, the bus, SM activity, gpu_up)
    returns data. (Panels of readings a simulated GPU never has, such as fans or encoders, are
    tests/e2e/test_dashboards.py's business, on the NVML fake.)"""
    from tests.e2e.test_dashboards import RULE_FILES as ALL_RULES
    from tests.e2e.test_dashboards import all_dashboards, empty_panels, panels

    exercised = [t["expr"] for _, d in all_dashboards() for p in panels(d) for t in p["targets"]
                 if any(f in t["expr"] for f in DRIVEN)]
    assert len(exercised) >= 10, exercised
    args = ["--backend", "simulated", "--simulated-scenario", "mixed", "--simulated-gpus", "9"]
    with ExporterProcess(args, env={"NODE_NAME": "sim-node"}) as ex, Prometheus(
            tmp_path / "prom", rule_files=ALL_RULES, extra_scrape_configs=[{
                "job_name": "gpu-exporter", "honor_labels": True,  # node: the label a ServiceMonitor relabels in
                "static_configs": [{"targets": [f"127.0.0.1:{ex.port}"], "labels": {"node": "sim-node"}}]}]) as prom:
        prom.wait_for('gpu_xid_errors_total{xid="94"}', timeout=30)  # the ECC GPU's first error, at 2 s
        prom.wait_for('gpu_sm_active_ratio{gpu="7"}', timeout=30)
        # recording rules start at the first evaluation: give range queries over them ten samples
        prom.wait_for("min(count_over_time(node:gpu_utilization:avg[1m])) >= 10", timeout=30)
        problems = [p for p in empty_panels(prom, pinned={}) if any(f in p for f in DRIVEN)]
    assert not problems, "\n".join(problems)


def test_the_fast_parser_reads_what_prometheus_client_reads() -> None:
    text = next(expositions("mixed", 9, [30.0]))
    assert samples_of(text) == parse_samples(text)  # no escapes in simulated labels: equal as they are


def test_the_scenario_states_are_what_the_expectations_assume() -> None:
    assert STATES["throttle"] == ("thermal", "power_cap")
    assert STATES["mixed"] == ("mig", "ecc", "thermal", "lost", "xid", "leak", "power_cap", "starved", "healthy")


# ---- the real process ------------------------------------------------------------------------------


def test_explicit_simulated_backend_warns_without_claiming_no_gpu_was_found() -> None:
    with ExporterProcess(["--backend", "simulated", "--simulated-scenario", "lost"]) as ex:
        ex.scrape()
        log = ex.log()
    assert "SIMULATED" in log and "scenario lost" in log and "not real" in log
    assert "NO GPU FOUND" not in log
    with ExporterProcess(["--allow-simulated"], env={"LD_LIBRARY_PATH": "/nonexistent", "PATH": "/nonexistent"}) as ex:
        log = ex.log()
    assert "NO GPU FOUND" in log, log  # auto found none and fell back: that is what it says


def test_demo_does_not_warn_about_its_own_kubeconfig() -> None:
    from demo.run import without_own_kubeconfig_warning

    log = ("2026-01-01 WARNING exporter.profiler: dry run without a cluster (no Kubernetes configuration found "
           "(kubeconfig: Invalid kube-config. /dev/null file is empty)): planning from Prometheus alone\n"
           "2026-01-01 WARNING exporter.profiler: something else\n")
    out = without_own_kubeconfig_warning(log)
    assert "dry run without a cluster" not in out and "/dev/null file is empty" not in out
    assert "something else" in out and "on purpose" in out
    assert without_own_kubeconfig_warning("fine\n") == "fine\n"
