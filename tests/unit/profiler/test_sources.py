"""One labelled history, three exporters: ours, NVIDIA dcgm-exporter's and AMD device-metrics-exporter's.

The same per-GPU samples are written into one real Prometheus as our series (nodes ``lab-*``),
as dcgm-exporter's (``dcgm-*``, node in ``Hostname``; ``dcgmmain-*`` with main's ``hostname``)
and as AMD's (``amd-*``, with a configured name prefix and without the opt-in ``gpu_uuid``).
Names, labels and units are cited in tests/fakes/profiler_history.py (write_dcgm, write_amd).
The profiler must give every GPU the same pattern (and period) whichever form it read.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from exporter.profiler import sources
from exporter.profiler.classify import classify_gpu
from exporter.profiler.prom import PromClient, PromError
from exporter.profiler.queries import EMPTY, QueryConfig, Reader
from tests.fakes.profiler_history import (
    GpuHistory,
    idle_shape,
    labelled_set,
    make_history,
    mem_constant,
    sample_times,
    steady_shape,
    write_amd,
    write_dcgm,
    write_openmetrics,
    write_up,
)
from tests.harness.prom import OpenMetricsWriter, Prometheus

pytestmark = pytest.mark.prometheus

END = float(int(time.time()) - 60)
FORMS = ("lab", "dcgm", "dcgmmain", "amd")


def _renamed(hist: list[GpuHistory], form: str) -> list[GpuHistory]:
    return [replace(h, node=h.node.replace("lab", form), uuid=h.uuid.replace("GPU-", f"GPU-{form}-"))
            for h in hist]


def _alloc_node() -> list[GpuHistory]:
    """Two idle GPUs on a dcgm node scraped without honouring labels: GPU 0 held by ml/train-1."""
    ts = sample_times(END, 2100, 15)
    held = make_history(4, "dcgm-alloc", "0", "allocated-idle", "held", ts, idle_shape, mem_constant(0.1))
    held.extra_labels = {"pod": "train-1", "namespace": "ml", "container": "main"}
    free = make_history(4, "dcgm-alloc", "1", "idle", "free", ts, idle_shape, mem_constant(0.0))
    return [held, free]


def _both(form_ours: bool) -> list[GpuHistory]:
    """A node running both exporters: ours says steady, dcgm's says idle."""
    ts = sample_times(END, 2100, 15)
    shape = steady_shape(0.7, 0.02) if form_ours else idle_shape
    return [make_history(5, "both-0", "0", "steady", "both", ts, shape, mem_constant(0.5))]


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("sources-prom")
    base = labelled_set(31, END)
    path = tmp / "history.om"
    with OpenMetricsWriter(path) as w:
        write_openmetrics(w, base + _both(True))
        write_dcgm(w, _renamed(base, "dcgm") + _both(False))
        write_dcgm(w, _renamed(base, "dcgmmain"), node_label="hostname")
        write_amd(w, _renamed(base, "amd"), prefix="amd_")
        write_dcgm(w, _alloc_node(), scrape_pod="dcgm-exporter")
        write_up(w, {"dcgm-alloc:9400": ("dcgm-exporter", "gpu-operator", "dcgm-exporter-dcgm-alloc")},
                 sample_times(END, 2100, 15))
    with Prometheus(tmp / "server", tsdb_blocks_from=path) as server:
        yield server


def _patterns(gpus: dict, form: str) -> dict[tuple[str, str], tuple[str, float | None]]:
    out = {}
    for (node, gpu), st in gpus.items():
        if node.startswith(form + "-") and node[len(form) + 1:].isdigit():
            p = classify_gpu(st)
            out[(node[len(form) + 1:], gpu)] = (p.pattern, p.period_seconds)
    return out


def test_three_forms_of_one_history_give_identical_patterns(prom: Prometheus) -> None:
    reader = Reader(PromClient(prom.url), QueryConfig(source="auto"))
    snap = reader.read(END)
    assert reader.picked == {"gpu-exporter": 16, "dcgm": 31, "amd": 15}
    want = _patterns(snap.gpus, "lab")
    assert len(want) == 120
    truth = {(h.node[4:], h.gpu): h.label for h in labelled_set(31, END)}
    assert sum(want[k][0] == truth[k] for k in truth) >= 0.95 * len(truth)  # the history is classified well
    for form in FORMS[1:]:
        got = _patterns(snap.gpus, form)
        diffs = [f"{k}: {got.get(k)} != {v}" for k, v in sorted(want.items())
                 if got.get(k) is None or got[k][0] != v[0]
                 or (v[1] is not None and abs((got[k][1] or 0) - v[1]) > 1e-6 * v[1])]
        assert diffs == [], form
        # memory in MiB and utilisation in percent come out in bytes and ratios
        a, b = snap.gpus[("lab-000", "1")], snap.gpus[(f"{form}-000", "1")]
        assert b.mem_total == pytest.approx(a.mem_total) and b.util_mean == pytest.approx(a.util_mean)


def test_one_source_asked_for_reads_only_it(prom: Prometheus) -> None:
    for name, nodes in (("dcgm", 32), ("amd", 15), ("gpu-exporter", 16)):  # both-0 has dcgm series too
        reader = Reader(PromClient(prom.url), QueryConfig(source=name))
        snap = reader.read(END)
        assert len({n for n, _ in snap.gpus}) == nodes, name


def test_a_node_with_both_exporters_is_read_from_ours(prom: Prometheus) -> None:
    snap = Reader(PromClient(prom.url), QueryConfig(source="auto")).read(END)
    assert classify_gpu(snap.gpus[("both-0", "0")]).pattern == "steady"  # dcgm's copy says idle
    snap = Reader(PromClient(prom.url), QueryConfig(source="dcgm")).read(END)
    assert classify_gpu(snap.gpus[("both-0", "0")]).pattern == "idle"


def test_exporters_own_pod_is_never_the_workload(prom: Prometheus) -> None:
    snap = Reader(PromClient(prom.url), QueryConfig(source="dcgm")).read(END)
    held, free = snap.gpus[("dcgm-alloc", "0")], snap.gpus[("dcgm-alloc", "1")]
    assert held.holders is not None and set(held.holders) == {"ml/train-1"}
    p = classify_gpu(held)
    assert p.pattern == "allocated-idle" and p.holder == "ml/train-1"
    # GPU 1 carries only the exporter's own pod (the scrape target's): idle, not allocated-idle
    assert free.holders is None and classify_gpu(free).pattern == "idle"


def test_empty_prometheus_names_what_was_looked_for(prom: Prometheus) -> None:
    reader = Reader(PromClient(prom.url), QueryConfig(source="auto"))
    with pytest.raises(PromError) as exc:
        reader.read(END - 30 * 86400)  # a month before any sample
    assert exc.value.kind == EMPTY
    msg = str(exc.value)
    assert "\n" not in msg
    for name in ("gpu_up", "DCGM_FI_DEV_GPU_UTIL", "gpu_gfx_activity"):
        assert name in msg


def test_mappings_name_real_fields() -> None:
    # the published names (see the citations in tests/fakes/profiler_history.py)
    d, a = sources.dcgm(), sources.amd()
    assert (d.util, d.mem_used, d.mem_free, d.sm) == ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED",
                                                      "DCGM_FI_DEV_FB_FREE", "DCGM_FI_PROF_SM_ACTIVE")
    # the scrape's node label first: a target's own Hostname/hostname never outranks it (issue 36)
    assert d.node_labels == ("node", "Hostname", "hostname", "kubernetes_node")
    assert a.node_labels == ("node", "hostname", "kubernetes_node")
    assert d.key({"Hostname": "victim", "node": "tenant", "gpu": "7"}) == ("tenant", "7", "")
    assert a.key({"hostname": "n1", "gpu_id": "3", "serial_number": "S1"}) == ("n1", "3", "S1")
    assert a.selector("gpu_gfx_activity", 'hostname="n1"') == '{__name__=~".*gpu_gfx_activity", hostname="n1"}'
    assert d.mem_scale == a.mem_scale == 1024 * 1024 and d.util_scale == a.util_scale == 0.01


def test_amd_prefers_gpu_uuid_over_the_serial_number() -> None:
    """Survivor of issue 36: with both present, the opt-in gpu_uuid identifies the GPU, else the serial."""
    a = sources.amd()
    both = {"hostname": "n1", "gpu_id": "3", "serial_number": "S1", "gpu_uuid": "U1"}
    assert a.key(both) == ("n1", "3", "U1") and a.uuid_label(both) == "gpu_uuid"
    assert a.key({**both, "gpu_uuid": ""}) == ("n1", "3", "S1")
    assert a.uuid_label({**both, "gpu_uuid": ""}) == "serial_number"


def test_source_flag(tmp_path: Path) -> None:
    from exporter.platform.errors import ConfigError
    from exporter.profiler.main import parse_args

    s = parse_args(["--prometheus-url", "http://p:9090", "--source", "dcgm"])
    assert s.query.source == "dcgm"
    assert parse_args(["--prometheus-url", "http://p:9090"]).query.source == "auto"
    with pytest.raises(ConfigError, match=r"\(--source\) = 'nvidia'"):
        parse_args(["--prometheus-url", "http://p:9090", "--source", "nvidia"])
