"""The GPUHealthy Node condition: the real profiler, a real Prometheus, the fake API server.

Three hours of history: every fault is present until 90 minutes before the end (counters rise
two hours before it) and gone after. Cycles evaluated 100 minutes before the end see each
fault; cycles at the end see the recovery. Every cycle is a new Profiler, as ``--once`` runs
are: the hysteresis state lives on the Node.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from exporter.profiler import health
from exporter.profiler.classify import GpuStats
from exporter.profiler.loop import Profiler
from tests.fakes.profiler_history import (
    make_history,
    mem_constant,
    sample_times,
    steady_shape,
    write_dcgm,
    write_openmetrics,
)
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.prom import OpenMetricsWriter, Prometheus

if TYPE_CHECKING:
    pass

pytestmark = pytest.mark.prometheus

END = float(int(time.time()) - 60)
SPAN = 3 * 3600.0
STEP = 30.0
FAULT_END = END - 90 * 60  # state faults end here
RISE = END - 120 * 60  # counters rise here
AT_FAULT = END - 100 * 60
AT_OK = END

# node -> (reason while faulty, reason after)
WANT = {
    "h-xid": (health.XID, health.HEALTHY),
    "h-xid13": (health.HEALTHY, health.HEALTHY),  # not a critical XID
    "h-ecc": (health.ECC, health.HEALTHY),
    "h-remap": (health.REMAP, health.HEALTHY),
    "h-retire": (health.REMAP, health.HEALTHY),
    "h-pcie": (health.PCIE, health.HEALTHY),
    "h-gen": (health.HEALTHY, health.HEALTHY),  # a lower PCIe generation is not a fault
    "h-lost": (health.LOST, health.HEALTHY),
    "d-xid": (health.XID, health.HEALTHY),  # dcgm: the gauge keeps 79 after, unchanged: not in the window
    "d-remap": (health.REMAP, health.HEALTHY),
    "h-stale": (health.HEALTHY, health.NOT_SCRAPED),  # its exporter stops being scraped
}


def _gpus(node: str, until: float = END) -> list[Any]:
    ts = [t for t in sample_times(END, SPAN, STEP) if t <= until]
    out = [make_history(9, node, g, "steady", "steady", ts, steady_shape(0.6, 0.02), mem_constant(0.5))
           for g in ("0", "1")]
    if node == "h-lost":  # GPU 1 fell off the bus: only gpu_up 0 until it came back
        lost = out[1]
        lost.util = [u if t >= FAULT_END else None for t, u in zip(lost.times, lost.util, strict=True)]
        lost.mem_used = [m if t >= FAULT_END else None for t, m in zip(lost.times, lost.mem_used, strict=True)]
    return out


def _labels(node: str, gpu: str) -> dict[str, str]:
    """Our series' labels for a GPU of :func:`_gpus` (its UUID included)."""
    uuid = next(h.uuid for h in _gpus(node) if h.gpu == gpu)
    return {"node": node, "gpu": gpu, "uuid": uuid, "instance": f"{node}:9400", "job": "gpu-exporter"}


def _history(path: Path) -> Path:
    ts = sample_times(END, SPAN, STEP)

    def state(bad: float, good: float) -> list[tuple[float, float]]:
        return [(t, bad if t < FAULT_END else good) for t in ts]

    def born(value: float) -> list[tuple[float, float]]:
        return [(t, value) for t in ts if t >= RISE]

    with OpenMetricsWriter(path) as w:
        for node in (*WANT, "h-hung", "h-failed", "h-degraded"):
            if node.startswith("d-"):
                write_dcgm(w, _gpus(node))
            else:
                write_openmetrics(w, _gpus(node, until=END - 3600 if node == "h-stale" else END))
        w.add("gpu_xid_errors_total", _labels("h-xid", "1") | {"xid": "79"}, born(1.0), type="counter")
        w.add("gpu_xid_errors_total", _labels("h-xid13", "1") | {"xid": "13"}, born(3.0), type="counter")
        w.add("gpu_ecc_errors_total", _labels("h-ecc", "1") | {"error_type": "uncorrected", "counter": "volatile"},
              [(t, 0.0 if t < RISE else 2.0) for t in ts], type="counter")
        w.add("gpu_ecc_errors_total", _labels("h-ecc", "0") | {"error_type": "corrected", "counter": "volatile"},
              [(t, 0.0 if t < RISE else 50.0) for t in ts], type="counter")  # corrected: not a fault
        w.add("gpu_remapped_rows_failed", _labels("h-remap", "1"), state(1.0, 0.0))
        w.add("gpu_retired_pages_pending", _labels("h-retire", "0"), state(1.0, 0.0))
        for g in ("0", "1"):
            w.add("gpu_pcie_link_width_max", _labels("h-pcie", g), state(16.0, 16.0))
            w.add("gpu_pcie_link_width", _labels("h-pcie", g), state(8.0 if g == "1" else 16.0, 16.0))
            w.add("gpu_pcie_link_width_max", _labels("h-gen", g), state(16.0, 16.0))
            w.add("gpu_pcie_link_width", _labels("h-gen", g), state(16.0, 16.0))
            w.add("gpu_pcie_link_generation", _labels("h-gen", g), state(1.0, 1.0))
            w.add("gpu_pcie_link_generation_max", _labels("h-gen", g), state(4.0, 4.0))
        # the exporter's own verdict (gpu_health_state: 1 on the GPU's state, 0 on the others)
        for node, gpu, bad in (("h-hung", "1", "hung"), ("h-failed", "0", "failed"), ("h-degraded", "0", "degraded")):
            cause = {"hung": "hung: nvmlDeviceGetPowerUsage did not return within 1 s",
                     "failed": "the driver asks for a GPU reset",
                     "degraded": "the driver asks to drain peer-to-peer traffic"}[bad]
            for name in ("ok", "degraded", "failed", "hung", "lost"):
                w.add("gpu_health_state", _labels(node, gpu) | {"state": name, "cause": cause},
                      state(1.0 if name == bad else 0.0, 1.0 if name == "ok" else 0.0))
        lost = _labels("h-lost", "1")
        w.add("gpu_up", lost | {"state": "lost"}, [(t, 0.0) for t in ts if t < FAULT_END])
        for node in ("d-xid", "d-remap"):
            dcgm = {"gpu": "1", "UUID": _labels(node, "1")["uuid"], "Hostname": node, "job": "dcgm-exporter",
                    "instance": f"{node}:9400"}
            if node == "d-xid":  # DCGM_FI_DEV_XID_ERRORS: a gauge holding the last XID code
                w.add("DCGM_FI_DEV_XID_ERRORS", dcgm, [(t, 0.0 if t < RISE else 79.0) for t in ts])
            else:
                w.add("DCGM_FI_DEV_ROW_REMAP_FAILURE", dcgm, state(1.0, 0.0))
    return path


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("health-prom")
    with Prometheus(tmp / "server", tsdb_blocks_from=_history(tmp / "h.om")) as server:
        yield server


def _cycle(prom: Prometheus, make_profiler: Any, at: float) -> Any:
    """One ``--once`` run: a new profiler (the condition and Events on, as by default), nothing carried over
    in memory."""
    prof = make_profiler(prom.url, "--window", "30m")
    res = prof.run_cycle(at=at)
    assert res.ok, res.errors
    return res


def _conditions(api: FakeKubeAPI) -> dict[str, dict[str, str]]:
    out = {}
    for n in api.nodes():
        for c in api.node(n).get("status", {}).get("conditions", []):
            if c["type"] == "GPUHealthy":
                out[n] = c
    return out


def _status_patches(api: FakeKubeAPI) -> list[Any]:
    return [r for r in api.requests if r.resource == "nodes/status"]


def _events(api: FakeKubeAPI) -> list[Any]:
    return [r for r in api.requests if r.resource == "events"]


def test_every_cause_sets_its_reason_and_recovery_sets_it_back(prom: Prometheus, kubeapi: FakeKubeAPI,
                                                               make_profiler: Any) -> None:
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready",
             "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}
    for n in WANT:
        kubeapi.add_node(n, capacity={"nvidia.com/gpu": "2"}, conditions=[ready])

    r1 = _cycle(prom, make_profiler, AT_FAULT)
    got = _conditions(kubeapi)
    assert {n: c["reason"] for n, c in got.items()} == {n: w[0] for n, w in WANT.items()}
    for n, c in got.items():
        assert c["status"] == ("True" if c["reason"] == health.HEALTHY else "False"), n
    # [code] text - RecommendedAction: X, with the GPU's index and uuid (docs/health.md)
    xid_uuid, lost_uuid = _labels("h-xid", "1")["uuid"], _labels("h-lost", "1")["uuid"]
    assert got["h-xid"]["message"] == (
        f"[XID79] GPU 1 {xid_uuid}: XID 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS) in the window - "
        "RecommendedAction: RESTART_BM")  # NVIDIA's catalogue: 79 is RESTART_BM
    # 13 is warn in the catalogue (RESTART_APP): the node stays True and lists it
    assert got["h-xid13"]["message"].startswith("2 GPUs healthy; [XID13] GPU 1 ")
    assert got["h-xid13"]["message"].endswith(" - RecommendedAction: RESTART_APP")
    assert got["d-xid"]["message"].startswith("[XID79] GPU 1 GPU-")  # dcgm: the gauge's value is the code
    assert got["h-retire"]["message"] == (f"[PAGE_RETIREMENT_PENDING] GPU 0 {_labels('h-retire', '0')['uuid']}: "
                                          "a page retirement is pending - RecommendedAction: COMPONENT_RESET")
    assert got["h-lost"]["message"].startswith(f"[GPU_LOST] GPU 1 {lost_uuid}: lost or not answering")
    assert got["h-pcie"]["message"].endswith(": PCIe link x8 of x16 - RecommendedAction: RUN_FIELDDIAG")
    assert r1.status_writes == len(WANT)
    reqs = _status_patches(kubeapi)
    assert {r.content_type for r in reqs} == {"application/strategic-merge-patch+json"}
    assert all(r.status == 200 for r in reqs)
    # the other conditions and the status fields are untouched
    for n in WANT:
        st = kubeapi.node(n)["status"]
        assert st["conditions"][0] == ready and st["capacity"] == {"nvidia.com/gpu": "2"}, n
    # the first setting records no Event: the condition's lastTransitionTime says when it was set
    assert _events(kubeapi) == []

    kubeapi.clear_requests()
    r2 = _cycle(prom, make_profiler, AT_FAULT)  # unchanged: nothing written at all
    assert r2.status_writes == 0 and _status_patches(kubeapi) == [] and _events(kubeapi) == []
    assert [r for r in kubeapi.patches() if r.resource == "nodes"] == []

    kubeapi.clear_requests()
    before = _conditions(kubeapi)
    r3 = _cycle(prom, make_profiler, AT_OK)  # changed once: waits (hysteresis 2), the candidate kept on the node
    # only h-xid13's message changed (its warn XID left the window; still True): written at once
    assert r3.status_writes == 1
    now = _conditions(kubeapi)
    assert now["h-xid13"]["message"] == "2 GPUs healthy" and now["h-xid13"]["lastTransitionTime"] == \
        before["h-xid13"]["lastTransitionTime"]
    assert {n: c for n, c in now.items() if n != "h-xid13"} == {n: c for n, c in before.items() if n != "h-xid13"}
    before = now
    changed = {n for n, (a, b) in WANT.items() if a != b}
    pend = {n: kubeapi.node(n)["metadata"]["annotations"].get("gpu-exporter.io/pending", "") for n in changed}
    assert all("gpu-healthy=" in p for p in pend.values()), pend

    kubeapi.clear_requests()
    r4 = _cycle(prom, make_profiler, AT_OK)  # seen twice: written
    got = _conditions(kubeapi)
    assert {n: c["reason"] for n, c in got.items()} == {n: w[1] for n, w in WANT.items()}
    assert got["h-stale"]["status"] == "Unknown"
    assert r4.status_writes == len(changed)
    for n in WANT:
        moved = before[n]["lastTransitionTime"] != got[n]["lastTransitionTime"]
        assert moved == (before[n]["status"] != got[n]["status"]), n
    assert {r.body["involvedObject"]["name"] for r in _events(kubeapi)} == changed  # one per real transition
    assert len(_events(kubeapi)) == len(changed)
    lost = next(r.body for r in _events(kubeapi) if r.body["involvedObject"]["name"] == "h-lost")
    assert (lost["reason"], lost["type"]) == ("GPUHealthyTrue", "Normal")
    assert all("gpu-healthy" not in kubeapi.node(n)["metadata"]["annotations"].get("gpu-exporter.io/pending", "")
               for n in WANT)

    kubeapi.clear_requests()
    r5 = _cycle(prom, make_profiler, AT_OK)
    assert r5.status_writes == 0 and _status_patches(kubeapi) == [] and _events(kubeapi) == []


def test_condition_writes_need_the_lease(prom: Prometheus, kubeapi: FakeKubeAPI, make_profiler: Any) -> None:
    import threading

    class NotLeader:
        leading = threading.Event()  # never set: another replica holds the lease

        @staticmethod
        def is_leader() -> bool:
            return False

    kubeapi.add_node("h-lost")
    prof = make_profiler(prom.url, "--events", "off", elector=NotLeader())
    prof.run_cycle(at=AT_FAULT)
    assert _status_patches(kubeapi) == [] and _conditions(kubeapi) == {}


def test_causes_from_fields() -> None:
    def st(**h: float) -> GpuStats:
        return GpuStats(node="n", gpu="0", health=h)

    assert health.gpu_causes(st()) == []
    assert health.gpu_causes(GpuStats(node="n", gpu="0", up=0.0)) == [health.LOST]
    # dcgm's last-XID gauge: 79 held since before the window is not new; a change into it is
    assert health.gpu_causes(st(xid_min=79, xid_max=79, xid_last=79, xid_changes=0, xid_before=79)) == []
    assert health.gpu_causes(st(xid_min=13, xid_max=79, xid_last=13, xid_changes=2, xid_before=13)) == [health.XID]
    assert health.gpu_causes(st(xid_min=79, xid_max=79, xid_last=79, xid_changes=0)) == [health.XID]  # born in it
    assert health.gpu_causes(st(xid_min=13, xid_max=31, xid_last=31, xid_changes=1, xid_before=0)) == []
    assert health.gpu_causes(st(width=8, width_max=16, ecc=1)) == [health.ECC, health.PCIE]
    obs = health.observe({"0": st(width=8, width_max=16), "1": GpuStats(node="n", gpu="1", up=0.0, uuid="GPU-b")})
    assert (obs.status, obs.reason) == ("False", health.LOST)
    assert obs.message == ("[GPU_LOST] GPU 1 GPU-b: lost or not answering - RecommendedAction: RESTART_BM; "
                           "[PCIE_LINK_NARROWED] GPU 0 -: PCIe link x8 of x16 - RecommendedAction: RUN_FIELDDIAG")
    # ours per code: every critical code that rose, in order; a non-critical one is not a cause
    codes = health.gpu_findings(st(xid_79=1, xid_48=2, xid_13=5), health.CRITICAL_XIDS)
    assert [f.code for f in codes] == ["XID48", "XID79"]
    assert health.gpu_causes(st(xid_13=5)) == []
    assert health.observe({"0": GpuStats(node="n", gpu="0", fresh=False)}).status == "Unknown"
    # hysteresis: first setting at once, a change after k observations
    assert health.decide(None, "False.GPULost", None, 2) == (True, None)
    assert health.decide("True.AllGPUsHealthy", "False.GPULost", None, 2) == (False, ("False.GPULost", 1))
    assert health.decide("True.AllGPUsHealthy", "False.GPULost", ("False.GPULost", 1), 2) == (True, None)
    assert health.decide("True.AllGPUsHealthy", "False.GPULost", ("False.CriticalXID", 1), 2) == (
        False, ("False.GPULost", 1))


def _errors(prof: Profiler, kind: str) -> float:
    for line in prof.metrics.exposition().decode().splitlines():
        if line.startswith(f'gpu_profiler_errors_total{{kind="{kind}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_a_conflict_on_nodes_status_reads_again_and_retries_once(prom: Prometheus, kubeapi: FakeKubeAPI,
                                                                 make_profiler: Any) -> None:
    """Issue 36 item 7: a 409 on nodes/status reads the node again and retries once, in the branch that
    patched the annotations and in the one where they were unchanged; a second 409 is counted as
    kube_conflict for that node only, and the other nodes' results are tallied: never ``internal``."""
    for n in ("h-ecc", "h-remap"):
        kubeapi.add_node(n)

    def status_patches(node: str) -> list[Any]:
        return [r for r in _status_patches(kubeapi) if r.path.endswith(f"/nodes/{node}/status")]

    # twice in a row (after the annotations' patch): counted, the other node written
    kubeapi.inject("PATCH", r"/nodes/h-ecc/status$", 409, times=2)
    prof = make_profiler(prom.url, "--window", "30m", "--events", "off")
    res = prof.run_cycle(at=AT_FAULT)
    assert res.errors == ["kube_conflict"], res.errors
    assert _errors(prof, "kube_conflict") == 1 and _errors(prof, "internal") == 0
    assert len(status_patches("h-ecc")) == 2
    assert any(r.method == "GET" and r.path == "/api/v1/nodes/h-ecc" for r in kubeapi.requests)  # read again
    assert res.status_writes == 1 and set(_conditions(kubeapi)) == {"h-remap"}

    # once, with the annotations already in place (the unchanged branch): the retry writes it
    kubeapi.clear_requests()
    kubeapi.inject("PATCH", r"/nodes/h-ecc/status$", 409, times=1)
    prof = make_profiler(prom.url, "--window", "30m", "--events", "off")
    res = prof.run_cycle(at=AT_FAULT)
    assert res.ok and res.errors == [], res.errors
    assert res.unchanged == 2 and res.status_writes == 1
    assert [r.status for r in status_patches("h-ecc")] == [409, 200]
    assert _conditions(kubeapi)["h-ecc"]["reason"] == health.ECC


def test_message_is_parseable_and_bounded() -> None:
    """Whole entries, never a ';' inside one (NVSentinel splits there), a hostile uuid left out,
    and past MAX_MESSAGE a last entry saying how many more."""
    import re

    entry = re.compile(r"\[([A-Z0-9_]+)\] GPU (\S+) (\S+): ([^;]*) - RecommendedAction: ([A-Z_]+)\Z")
    gpus = {str(g): GpuStats(node="n", gpu=str(g), up=0.0, uuid=f"GPU-{g:08d}-aaaa-bbbb-cccc-dddddddddddd")
            for g in range(64)}
    gpus["2"] = GpuStats(node="n", gpu="2", up=0.0, uuid="GPU-1; [XID79] forged\nline")
    msg = health.observe(gpus).message
    assert len(msg) <= health.MAX_MESSAGE
    parts = msg.split("; ")
    assert all(entry.match(p) for p in parts[:-1]), parts
    more = re.fullmatch(r"\[MORE\] (\d+) more entries", parts[-1])
    assert more and int(more[1]) + len(parts) - 1 == 64
    assert [entry.match(p)[2] for p in parts[:-1]] == [str(g) for g in range(len(parts) - 1)]  # type: ignore[index]
    assert entry.match(parts[2])[3] == "-"  # type: ignore[index]
    assert "forged" not in msg and "\n" not in msg


def test_device_taints_follow_the_gpus(prom: Prometheus, kubeapi: FakeKubeAPI, make_profiler: Any) -> None:
    """--device-taints through whole cycles: the lost GPU and the one with a critical XID get a
    DeviceTaintRule for their DRA device, the narrowed link none; after recovery the rules go
    once the GPUs have been healthy for the hysteresis (every cycle a new profiler, as --once)."""
    from tests.fakes.dra_slices import NVIDIA, nvidia_gpu, resource_slice

    for n in ("h-lost", "h-xid", "h-pcie"):
        kubeapi.add_node(n)
        kubeapi.put_resource_slice(resource_slice(f"{n}-gpus", n, NVIDIA, [
            nvidia_gpu(g, _labels(n, str(g))["uuid"], f"0000:0{g}:00.0") for g in (0, 1)]))

    def cycle(at: float) -> set[tuple[str, str, str]]:
        prof = make_profiler(prom.url, "--window", "30m", "--hysteresis", "2", "--device-taints", "on",
                             "--events", "off")
        assert prof.run_cycle(at=at).ok
        return {(r["spec"]["deviceSelector"]["pool"], r["spec"]["deviceSelector"]["device"],
                 r["spec"]["taint"]["value"]) for r in kubeapi.taint_rules()}

    want = {("h-lost", "gpu-1", health.LOST), ("h-xid", "gpu-1", health.XID)}
    assert cycle(AT_FAULT) == want
    assert cycle(AT_OK) == want  # healthy once: kept
    assert cycle(AT_OK) == set()  # healthy for the hysteresis: removed


def test_xid_severity_overrides() -> None:
    """--xid-severity over the catalogue: fatal makes the node False, warn lists the code on a True
    node, ignore hides it; a plain set of codes is the old critical list (the rest ignored)."""
    def st(**h: float) -> GpuStats:
        return GpuStats(node="n", gpu="0", uuid="GPU-a", health=h)

    gpus = {"0": st(xid_13=2.0), "1": GpuStats(node="n", gpu="1", up=1.0)}
    obs = health.observe(gpus)  # the catalogue: 13 is warn
    assert (obs.status, obs.reason) == ("True", health.HEALTHY) and "[XID13] GPU 0 GPU-a" in obs.message
    obs = health.observe(gpus, health.XidRules({13: "fatal"}))
    assert (obs.status, obs.reason) == ("False", health.XID)
    assert obs.message.startswith("[XID13] GPU 0 GPU-a: XID 13 (ROBUST_CHANNEL_GR_EXCEPTION) in the window")
    assert health.observe(gpus, health.XidRules({"13": "ignore"})).message == "2 GPUs healthy"
    lost_bus = {"0": st(xid_79=1.0)}
    assert health.observe(lost_bus).status == "False"
    assert health.observe(lost_bus, health.XidRules({79: "warn"})).status == "True"
    assert health.observe(lost_bus, health.XidRules({79: "ignore"})).message == "1 GPUs healthy"
    # a code NVIDIA's catalogue does not list is warn, unless overridden
    assert health.XidRules().severity(999) == "warn" and health.XidRules({999: "fatal"}).severity(999) == "fatal"
    assert 999 in health.XidRules({999: "fatal"}).fatal() and 63 in health.XidRules().ignored()
    assert 63 not in health.XidRules({63: "fatal"}).ignored()
    # the old form: these codes fatal, every other ignored
    assert [f.code for f in health.gpu_findings(st(xid_13=1.0, xid_48=1.0), [13])] == ["XID13"]
    with pytest.raises(ValueError, match="--xid-severity: 13: severity 'deadly' is not one of fatal, warn, ignore"):
        health.XidRules({13: "deadly"})


def test_xid_severity_through_prometheus(prom: Prometheus, kubeapi: FakeKubeAPI, make_profiler: Any) -> None:
    """The override reaches the query (an ignored code is not read) and the condition."""
    for n in ("h-xid", "h-xid13"):
        kubeapi.add_node(n)
    prof = make_profiler(prom.url, "--window", "30m", "--xid-severity", "13=fatal,79=ignore", "--events", "off")
    query = prof.reader.builder.mem_stats()
    assert 'xid!~"14|37|38|43|44|63|66|67|79|92|' in query and '"stat", "xid_$1", "xid"' in query  # 79 not read
    res = prof.run_cycle(at=AT_FAULT)
    assert res.ok, res.errors
    got = _conditions(kubeapi)
    assert (got["h-xid13"]["status"], got["h-xid13"]["reason"]) == ("False", health.XID)
    assert (got["h-xid"]["status"], got["h-xid"]["message"]) == ("True", "2 GPUs healthy")


def test_xid_severity_flag(tmp_path: Path) -> None:
    from exporter.platform.errors import ConfigError
    from exporter.profiler.main import parse_args

    base = ["--prometheus-url", "http://127.0.0.1:9"]
    assert parse_args(base).query.xid_severity == ()
    s = parse_args([*base, "--xid-severity", "13=fatal, 79=warn", "--xid-severity", "ecc_corrected=WARN"])
    assert dict(s.query.xid_severity) == {13: "fatal", 79: "warn", "ecc_corrected": "warn"}
    cfg = tmp_path / "p.yaml"
    cfg.write_text("xid-severity: ['43=fatal']\n")
    assert dict(parse_args([*base, "--config", str(cfg)]).query.xid_severity) == {43: "fatal"}
    for bad, words in ((["13"], "expected CODE=SEVERITY"), (["13=deadly"], "severity 'deadly' is not one of"),
                       (["0=fatal"], "out of range"), (["xid79=fatal"], "is not an XID code"),
                       (["13=fatal,13=warn"], "13 is given twice")):
        with pytest.raises(ConfigError, match=words):
            parse_args([*base, *[a for b in bad for a in ("--xid-severity", b)]])


def test_the_exporters_health_state(prom: Prometheus, kubeapi: FakeKubeAPI, make_profiler: Any) -> None:
    """gpu_health_state (exporter/core/gpu_health.py): hung is GPUHung, failed with nothing else in the
    window is GPUFailed, degraded alone is listed on a True node; the recovery clears each."""
    for n in ("h-hung", "h-failed", "h-degraded"):
        kubeapi.add_node(n)
    _cycle(prom, make_profiler, AT_FAULT)
    got = _conditions(kubeapi)
    assert (got["h-hung"]["status"], got["h-hung"]["reason"]) == ("False", health.HUNG)
    # each entry carries the exporter's cause (its gpu_health_state's cause label), not the state alone
    assert got["h-hung"]["message"] == (
        f"[GPU_HUNG] GPU 1 {_labels('h-hung', '1')['uuid']}: a driver call about it did not return "
        "(gpu_health_state: hung: nvmlDeviceGetPowerUsage did not return within 1 s) - RecommendedAction: RESTART_BM")
    assert (got["h-failed"]["status"], got["h-failed"]["reason"]) == ("False", health.FAILED)
    assert got["h-failed"]["message"] == (
        f"[GPU_FAILED] GPU 0 {_labels('h-failed', '0')['uuid']}: the exporter reports it failed (gpu_health_state: "
        "the driver asks for a GPU reset) - RecommendedAction: COMPONENT_RESET")
    assert (got["h-degraded"]["status"], got["h-degraded"]["reason"]) == ("True", health.HEALTHY)
    assert got["h-degraded"]["message"] == (
        f"2 GPUs healthy; [GPU_DEGRADED] GPU 0 {_labels('h-degraded', '0')['uuid']}: the exporter reports it "
        "degraded (gpu_health_state: the driver asks to drain peer-to-peer traffic) - RecommendedAction: "
        "CONTACT_SUPPORT")
    for _ in range(2):
        _cycle(prom, make_profiler, AT_OK)
    assert {n: (c["status"], c["message"]) for n, c in _conditions(kubeapi).items()} == {
        n: ("True", "2 GPUs healthy") for n in ("h-hung", "h-failed", "h-degraded")}


def test_health_state_fields() -> None:
    def st(up: float = 1.0, **h: float) -> GpuStats:
        return GpuStats(node="n", gpu="0", uuid="GPU-a", up=up, health=h)

    assert [f.cause for f in health.gpu_findings(st(0.0, state_hung=1.0))] == [health.HUNG]
    assert [f.cause for f in health.gpu_findings(st(state_hung=1.0))] == [health.HUNG]  # whatever gpu_up says
    assert [f.cause for f in health.gpu_findings(st(0.0, state_failed=1.0))] == [health.LOST]
    assert [f.cause for f in health.gpu_findings(st(state_failed=1.0, xid_79=1.0))] == [health.XID]  # said once
    assert [f.cause for f in health.gpu_findings(st(state_failed=1.0, width=8, width_max=16))] == [
        health.PCIE, health.FAILED]
    assert [f.cause for f in health.gpu_findings(st(state_degraded=1.0))] == [health.WARN]
    assert health.gpu_findings(st(state_degraded=1.0, xid_13=1.0))[0].code == "XID13"  # the XID says more
    assert health.gpu_findings(st(state_ok=1.0)) == [] and health.gpu_findings(st(state_hung=0.0)) == []
    assert health.observe({"0": st(up=1.0, state_hung=1.0)}).reason == health.HUNG


def test_every_entry_exactly() -> None:
    """Each cause's entry, word for word, and the condition's fields (pure: no Prometheus)."""
    def one(**h: float) -> str:
        return health.observe({"0": GpuStats(node="n", gpu="0", uuid="GPU-a", up=1.0, health=h)}).message

    tail = " - RecommendedAction: "
    assert one(ecc=1.0) == "[ECC_UNCORRECTABLE] GPU 0 GPU-a: uncorrectable ECC errors in the window" + tail + \
        "COMPONENT_RESET"
    assert one(remap=1.0) == "[ROW_REMAP_FAILURE] GPU 0 GPU-a: a row remap failed" + tail + "CONTACT_SUPPORT"
    assert one(remap=0.5) == "1 GPUs healthy"  # a fraction is not a failed remap
    assert one(retire=1.0) == "[PAGE_RETIREMENT_PENDING] GPU 0 GPU-a: a page retirement is pending" + tail + \
        "COMPONENT_RESET"
    assert one(width=4.0, width_max=16.0) == "[PCIE_LINK_NARROWED] GPU 0 GPU-a: PCIe link x4 of x16" + tail + \
        "RUN_FIELDDIAG"
    assert one(width=16.0, width_max=16.0) == "1 GPUs healthy"
    assert one(xid=2.0) == "[XID] GPU 0 GPU-a: a critical XID in the window" + tail + "COMPONENT_RESET"
    assert one(xid=0.0, ecc=0.0) == "1 GPUs healthy"
    assert one(state_failed=1.0) == "[GPU_FAILED] GPU 0 GPU-a: the exporter reports it failed (gpu_health_state)" + \
        tail + "COMPONENT_RESET"
    assert one(state_degraded=1.0) == ("1 GPUs healthy; [GPU_DEGRADED] GPU 0 GPU-a: the exporter reports it degraded "
                                       "(gpu_health_state)" + tail + "CONTACT_SUPPORT")
    assert one(xid_64=1.0) == ("[XID64] GPU 0 GPU-a: XID 64 (INFOROM_DRAM_RETIREMENT_FAILURE) in the window" + tail +
                               "COMPONENT_RESET")
    assert one(xid_13=1.0, xid_31=1.0).startswith("1 GPUs healthy; [XID13] GPU 0 GPU-a: XID 13 (ROBUST_CHANNEL_GR_"
                                                  "EXCEPTION) in the window" + tail + "RESTART_APP; [XID31] ")
    assert one(xid_999=1.0).endswith("XID 999 (not in NVIDIA's catalogue) in the window" + tail + "CONTACT_SUPPORT")
    assert one(xid_74=1.0).endswith(tail + "CONTACT_SUPPORT")  # a workflow bucket
    assert one(xid_43=1.0) == "1 GPUs healthy"  # ignore
    # dcgm's last-XID gauge: a code that came in the window, a code held since before it
    assert one(xid_min=0.0, xid_max=79.0, xid_last=79.0, xid_changes=1.0, xid_before=0.0).startswith("[XID79] ")
    assert one(xid_min=79.0, xid_max=79.0, xid_last=79.0, xid_changes=0.0, xid_before=79.0) == "1 GPUs healthy"
    assert one(xid_min=79.5, xid_max=79.5, xid_last=79.5, xid_changes=1.0) == "1 GPUs healthy"  # not a code
    assert one(xid_79=float("nan")) == "1 GPUs healthy" and one(xid_79=0.0) == "1 GPUs healthy"
    # several causes: the most severe first, GPUs in index order within one, warn entries last
    gpus = {"10": GpuStats(node="n", gpu="10", uuid="GPU-c", up=1.0, health={"ecc": 1.0}),
            "2": GpuStats(node="n", gpu="2", uuid="GPU-b", up=1.0, health={"ecc": 1.0, "xid_13": 1.0}),
            "x": GpuStats(node="n", gpu="x", uuid="GPU-d", up=1.0, health={"remap": 1.0}),
            "1": GpuStats(node="n", gpu="1", uuid="GPU-e", up=0.0)}
    obs = health.observe(gpus)
    assert (obs.status, obs.reason) == ("False", health.LOST)
    assert [e.split("]")[0] + "]" + e.split(":")[0].split("]")[1] for e in obs.message.split("; ")] == [
        "[GPU_LOST] GPU 1 GPU-e", "[ECC_UNCORRECTABLE] GPU 2 GPU-b", "[ECC_UNCORRECTABLE] GPU 10 GPU-c",
        "[ROW_REMAP_FAILURE] GPU x GPU-d", "[XID13] GPU 2 GPU-b"]
    assert health.observe({"0": GpuStats(node="n", gpu="0", fresh=False)}) == health.Observed(
        "Unknown", "ExporterNotScraped", "no recent sample from the node's GPU exporter")
    assert health.observe({"0": GpuStats(node="n", gpu="0", up=1.0),
                           "1": GpuStats(node="n", gpu="1", uuid="GPU-z", fresh=False)}).message == (
        "[GPU_LOST] GPU 1 GPU-z: lost or not answering" + tail + "RESTART_BM")
    assert health.observe({}).status == "Unknown"
    # the condition written, and what counts as the same
    o = health.Observed("False", health.ECC, "m")
    assert o.value == "False.UncorrectableECC"
    first = health.condition(o, None, "T1")
    assert first == {"type": "GPUHealthy", "status": "False", "reason": health.ECC, "message": "m",
                     "lastTransitionTime": "T1", "lastHeartbeatTime": "T1"}
    assert health.condition(health.Observed("False", health.XID, "m2"), first, "T2")["lastTransitionTime"] == "T1"
    assert health.condition(health.Observed("True", health.HEALTHY, "ok"), first, "T3")["lastTransitionTime"] == "T3"
    assert health.condition(o, {"status": "False"}, "T4")["lastTransitionTime"] == "T4"  # none before: now
    assert health.same(first, o) and not health.same(None, o)
    assert not health.same(dict(first, message="other"), o) and not health.same(dict(first, reason="x"), o)
    assert not health.same(dict(first, status="True"), o)
    assert health.published_value(first) == "False.UncorrectableECC" and health.published_value(None) is None
    assert health.published_value({}) is None and health.published_value({"status": "True"}) == "True."
    assert health.decide("True.AllGPUsHealthy", "True.AllGPUsHealthy", ("x", 1), 2) == (False, None)
    assert health.decide(None, "True.AllGPUsHealthy", None, 5) == (True, None)
    assert health.decide("True.A", "False.B", ("False.B", 2), 3) == (True, None)
    assert health.decide("True.A", "False.B", ("False.B", 1), 3) == (False, ("False.B", 2))
    rules = health.XidRules({79: "warn"})
    assert rules.severity(79) == "warn" and rules.severity(79) == "warn"  # cached alike
    assert health.XidRules.of(None) is health.DEFAULT_RULES and health.XidRules.of(rules) is rules
    assert health.XidRules.action(48) == "COMPONENT_RESET" and health.XidRules.action(45) == "RESTART_APP"
    assert health.XidRules.action(8) == "RESTART_APP" and health.XidRules.action(14) == "NONE"
    assert health.XidRules.mnemonic(13) == "ROBUST_CHANNEL_GR_EXCEPTION"


def test_which_xid_codes_count_exactly() -> None:
    """Each source's XID fields at their boundaries (from the mutation run's survivors): ours per code
    (one digit too), ours without the code (a rise of exactly 1), dcgm's last-XID gauge (min, max and last
    each a code of its own; the gauge changed in the window counts a code held before it; 0 is no code)."""
    def codes(rules: Any = None, **h: float) -> list[str]:
        return [f.code for f in health.gpu_findings(GpuStats(node="n", gpu="0", up=1.0, health=h), rules)]

    assert codes([8], xid_8=1.0) == ["XID8"]  # a one-digit code
    assert codes(xid=1.0) == ["XID"]  # our counter rose by exactly one, which code not read
    assert codes(xid=0.5) == ["XID"] and codes(xid=0.0) == []
    every = [1, 13, 48, 79, 94]
    assert codes(every, xid_min=1.0, xid_max=1.0, xid_last=1.0, xid_changes=1.0) == ["XID1"]
    # the gauge went 94 -> 48 -> 94 in the window: both codes came in it (only the minimum says 48)
    assert codes(every, xid_min=48.0, xid_max=94.0, xid_last=94.0, xid_changes=2.0, xid_before=94.0) == [
        "XID48", "XID94"]
    # 13, then 48 (only the last value says 48), then 79
    assert codes(every, xid_min=13.0, xid_max=79.0, xid_last=48.0, xid_changes=3.0, xid_before=0.0) == [
        "XID13", "XID48", "XID79"]
    # 79 held before the window, then one change to 13: the gauge changed, so 79 (the maximum) counts too
    assert codes(every, xid_min=13.0, xid_max=79.0, xid_last=13.0, xid_changes=1.0, xid_before=79.0) == [
        "XID13", "XID79"]
    # rewritten to the same code in the window: still a change, still counts
    assert codes(every, xid_min=79.0, xid_max=79.0, xid_last=79.0, xid_changes=2.0, xid_before=79.0) == ["XID79"]
    # 0 is the gauge's "no XID", never a code (not even a warn entry)
    assert codes(None, xid_min=0.0, xid_max=79.0, xid_last=79.0, xid_changes=1.0, xid_before=0.0) == ["XID79"]
    # a reading that is not finite is absent, never a cause
    for bad in (float("inf"), float("nan")):
        assert codes(every, ecc=bad, remap=bad, retire=bad, xid=bad) == []


def test_rules_and_states_reach_every_path() -> None:
    """The XID rules passed on by gpu_causes and the old list form; a ``lost`` state whatever gpu_up says;
    a warn XID never hides the exporter's ``failed`` verdict."""
    def st(**h: float) -> GpuStats:
        return GpuStats(node="n", gpu="0", uuid="GPU-a", up=1.0, health=h)

    assert health.gpu_causes(st(xid_13=1.0)) == [] and health.gpu_causes(st(xid_13=1.0), [13]) == [health.XID]
    assert health.gpu_causes(st(xid_13=1.0), health.XidRules({13: "fatal"})) == [health.XID]
    assert [f.cause for f in health.gpu_findings(st(state_lost=1.0))] == [health.LOST]
    obs = health.observe({"0": st(state_lost=1.0)})
    assert (obs.status, obs.reason) == ("False", health.LOST)
    assert health.gpu_causes(st(state_failed=1.0, xid_13=1.0)) == [health.FAILED]
    assert [f.code for f in health.gpu_findings(st(state_failed=1.0, xid_13=1.0))] == ["GPU_FAILED", "XID13"]
    assert health.gpu_findings(st(state_degraded=1.0, xid_13=1.0))[0].cause == health.WARN
    assert health.published_value({"reason": "X"}) == ".X"


def test_gpus_in_index_order_within_a_cause() -> None:
    """Numbered GPUs by number, then named ones by name, within each cause."""
    gpus = {g: GpuStats(node="n", gpu=g, up=0.0) for g in ("x", "10", "b", "2")}
    assert [e.split(" ")[2] for e in health.observe(gpus).message.split("; ")] == ["2", "10", "b", "x"]


def test_an_entry_cleans_its_labels() -> None:
    """The GPU label cut at 40 characters, spaces as ``_``, and no ``;`` anywhere in an entry."""
    def entry(gpu: str) -> str:
        return health.Finding(gpu, "GPU-a", health.LOST, "GPU_LOST", "w", "RESTART_BM").entry()

    assert entry("g" * 50) == f"[GPU_LOST] GPU {'g' * 40}... GPU-a: w - RecommendedAction: RESTART_BM"
    assert entry("a b") == "[GPU_LOST] GPU a_b GPU-a: w - RecommendedAction: RESTART_BM"
    assert entry("0;1") == "[GPU_LOST] GPU 0,1 GPU-a: w - RecommendedAction: RESTART_BM"


def test_the_message_bound_exactly() -> None:
    """MAX_MESSAGE at its exact boundaries: a lone entry of exactly 1,024 characters fits, with a head the
    ``; `` counts, and every entry but the last keeps room for the ``[MORE]`` entry."""
    def finding(n: int) -> health.Finding:
        base = len(health.Finding("0", "-", health.LOST, "C", "", "A").entry())
        return health.Finding("0", "-", health.LOST, "C", "w" * (n - base), "A")

    assert len(finding(1024).entry()) == 1024
    assert health.message([finding(1024)]) == finding(1024).entry()
    assert health.message([finding(1025)]) == "[MORE] 1 more entries"
    assert health.message([finding(1021)], "h") == "h; " + finding(1021).entry()  # 1 + 2 + 1,021
    assert health.message([finding(1022)], "h") == "h; [MORE] 1 more entries"
    # two entries: the first keeps 32 characters for "; [MORE] N more entries", the last does not
    assert health.message([finding(992), finding(40)]) == finding(992).entry() + "; [MORE] 1 more entries"
    assert health.message([finding(993), finding(40)]) == "[MORE] 2 more entries"
    assert health.message([finding(982), finding(40)]) == finding(982).entry() + "; " + finding(40).entry()
    assert health.message([finding(982), finding(41)]) == finding(982).entry() + "; [MORE] 1 more entries"


def test_a_healthy_node_shares_one_condition_per_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """``N GPUs healthy`` is one shared object per N (the fast path of 10,000 nodes a cycle), for at most
    256 sizes; a GPU that reads up is no reason to leave the fast path."""
    monkeypatch.setattr(health, "_ALL_HEALTHY", {})

    def node(n: int) -> dict[str, GpuStats]:
        return {str(g): GpuStats(node="n", gpu=str(g), up=1.0) for g in range(n)}

    first = health.observe(node(3))
    assert first == health.Observed("True", "AllGPUsHealthy", "3 GPUs healthy")
    assert health.observe(node(3)) is first and {3: first} == health._ALL_HEALTHY
    for n in range(1, 301):
        assert health.observe(node(n)).message == f"{n} GPUs healthy"
    assert len(health._ALL_HEALTHY) == 256 and 300 not in health._ALL_HEALTHY
    assert health.observe(node(300)) == health.Observed("True", "AllGPUsHealthy", "300 GPUs healthy")
