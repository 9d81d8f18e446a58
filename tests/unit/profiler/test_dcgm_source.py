"""Issue 38, item 7: `profile --source dcgm` against what a dcgm-exporter user really has.

* Series without any node label the profiler reads: it said "no GPU series ... looked for
  DCGM_FI_DEV_GPU_UTIL" although they were there; now it names the missing label and the labels
  it tried.
* DCGM 4.7's renamed fields, which dcgm-exporter 4.9.0 publishes by default: NVIDIA/DCGM
  dcgmlib/dcgm_fields.h (tag v4.6.0, the block "Deprecated: renamed per DCGM Field Naming
  Standard") maps DCGM_FI_DEV_GPU_UTIL to DCGM_FI_DEV_GPU_UTIL_RATIO (field 203),
  DCGM_FI_PROF_SM_ACTIVE to DCGM_FI_PROF_SM_UTIL_RATIO (1002), DCGM_FI_DEV_XID_ERRORS to
  DCGM_FI_DEV_XID_ERROR (230), DCGM_FI_DEV_ROW_REMAP_FAILURE to DCGM_FI_DEV_ROW_REMAP_FAILED (395)
  and DCGM_FI_DEV_RETIRED_PENDING to DCGM_FI_DEV_PAGE_RETIRED_PENDING (392); dcgm-exporter 4.9.0's
  release notes say utilisation changes "from a percentage to a 0 to 1 ratio". The same history
  in the legacy and the renamed form must classify the same.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from exporter.profiler.classify import classify_gpu
from exporter.profiler.prom import PromClient, PromError
from exporter.profiler.queries import EMPTY, QueryConfig, Reader
from tests.fakes.profiler_history import MIB, GpuHistory, _points, labelled_set, write_dcgm
from tests.harness.prom import OpenMetricsWriter, Prometheus

pytestmark = pytest.mark.prometheus

END = float(int(time.time()) - 60)


def write_dcgm_47(writer: OpenMetricsWriter, histories: list[GpuHistory]) -> None:
    """The histories as dcgm-exporter 4.9 publishes them with DCGM 4.7's names (module docstring):
    utilisation a 0-1 ratio; the framebuffer fields keep their names and MiB there."""
    for i, h in enumerate(histories):
        labels = {"gpu": h.gpu, "UUID": h.uuid, "device": f"nvidia{h.gpu}", "modelName": "NVIDIA H100 80GB HBM3",
                  "pci_bus_id": f"00000000:{i % 256:02X}:00.0", "Hostname": h.node, "job": "dcgm-exporter",
                  "instance": f"{h.node}:9400"}
        util = _points(h, h.util, 1.0)
        used = _points(h, h.mem_used, 1 / MIB)
        if util:
            writer.add("DCGM_FI_DEV_GPU_UTIL_RATIO", labels, util)
        if used:
            writer.add("DCGM_FI_DEV_FB_USED", labels, used)
            writer.add("DCGM_FI_DEV_FB_FREE", labels, [(t, h.mem_total / MIB - v) for t, v in used])


def _renamed(hist: list[GpuHistory], prefix: str) -> list[GpuHistory]:
    return [replace(h, node=h.node.replace("lab", prefix)) for h in hist]


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("dcgm-prom")
    base = labelled_set(7, END)[:12]
    path = tmp / "history.om"
    with OpenMetricsWriter(path) as w:
        write_dcgm(w, _renamed(base, "legacy"))
        write_dcgm_47(w, _renamed(base, "renamed"))
    with Prometheus(tmp / "server", tsdb_blocks_from=path) as server:
        yield server


@pytest.fixture(scope="module")
def unlabelled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """dcgm-exporter series whose node is in a label the profiler does not read."""
    tmp = tmp_path_factory.mktemp("dcgm-unlabelled")
    path = tmp / "history.om"
    with OpenMetricsWriter(path) as w:
        write_dcgm(w, labelled_set(8, END)[:4], node_label="kubernetes_host")
    with Prometheus(tmp / "server", tsdb_blocks_from=path) as server:
        yield server


def test_renamed_fields_classify_as_the_legacy_ones(prom: Prometheus) -> None:
    snap = Reader(PromClient(prom.url), QueryConfig(source="dcgm")).read(END)
    legacy = {(n.replace("legacy", ""), g): classify_gpu(s).pattern for (n, g), s in snap.gpus.items()
              if n.startswith("legacy")}
    renamed = {(n.replace("renamed", ""), g): classify_gpu(s).pattern for (n, g), s in snap.gpus.items()
               if n.startswith("renamed")}
    assert legacy and renamed == legacy
    # the ratio is not divided by 100 again: a busy GPU's mean utilisation is the same in both forms
    for (n, g), s in snap.gpus.items():
        if n.startswith("renamed"):
            twin = snap.gpus[(n.replace("renamed", "legacy"), g)]
            assert s.util_mean == pytest.approx(twin.util_mean, abs=1e-6)


def test_auto_finds_the_renamed_fields_too(prom: Prometheus) -> None:
    snap = Reader(PromClient(prom.url), QueryConfig(source="auto")).read(END)
    assert {n for n, _ in snap.gpus} >= {n for n, _ in snap.gpus if n.startswith("renamed")} != set()


def test_series_without_a_node_label_name_the_labels_tried(unlabelled: Prometheus) -> None:
    with pytest.raises(PromError) as exc:
        Reader(PromClient(unlabelled.url), QueryConfig(source="dcgm")).read(END)
    assert exc.value.kind == EMPTY
    msg = str(exc.value)
    assert "\n" not in msg
    assert "DCGM_FI_DEV_GPU_UTIL" in msg and "node label" in msg, msg
    for label in ("node", "Hostname", "hostname", "kubernetes_node"):
        assert f"`{label}`" in msg, msg
    assert "no GPU series" not in msg, msg


def test_the_documented_try_without_a_cluster_parses() -> None:
    """docs/profiler.md's command line for trying --source dcgm without a cluster is one the profiler takes."""
    import re
    import shlex

    from exporter.profiler.main import parse_args
    from tests.harness.exporter import REPO

    doc = (REPO / "docs" / "profiler.md").read_text()
    (line,) = [ln for ln in doc.splitlines() if ln.startswith("KUBECONFIG=/dev/null gpu-exporter profile")]
    argv = shlex.split(line)[3:]
    s = parse_args(argv)
    assert s.query.source == "dcgm" and s.dry_run and s.once, s
    assert re.search(r"labels: \{node: ", doc), "the scrape job names the node"
