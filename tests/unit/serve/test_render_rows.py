"""The renderer writes every family from its schema row (issue 27): it names none itself, and a row
added to any scope is rendered with no change to exporter/serve/render.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from exporter.core.schema import FAMILIES, SCOPE_LABELS
from tests.harness.exporter import REPO

RENDER = REPO / "exporter" / "serve" / "render.py"


def test_render_names_no_family() -> None:
    source = RENDER.read_text()
    named = sorted(f.name for f in FAMILIES if re.search(rf"\b{re.escape(f.name)}\b", source))
    assert not named, f"render.py names families itself instead of reading their rows: {named}"


# New rows of every scope, each reading an existing attribute, added to the schema before the
# renderer is imported; the snapshot below gives each a value. Printed: the exposition.
NEW_ROWS = r"""
import json, sys
from exporter.core import schema
from exporter.core.schema import COUNTER, GAUGE, Family

MIG = ("gpu_instance", "compute_instance", "mig_profile", "mig_uuid")
rows = (
    Family("gpu_test_watts", GAUGE, "watts", "Test: a GPU scalar.", "power", "gpu", (), "power_watts"),
    Family("gpu_test_hertz", GAUGE, "hertz", "Test: a GPU dict.", "clocks", "gpu", ("clock",), "clock_hertz"),
    Family("gpu_test_lost", GAUGE, "1", "Test: on a GPU that is down too.", "identity", "gpu", (), "up",
           every_backend=True),
    Family("gpu_test_missing", GAUGE, "1", "Test: a set.", "identity", "gpu", ("what",), "unsupported"),
    Family("gpu_test_mig_bytes", GAUGE, "bytes", "Test: MIG.", "mig", "mig", MIG, "memory_total_bytes"),
    Family("gpu_test_peer", GAUGE, "1", "Test: a GPU pair.", "topology", "peer", ("cap",), "p2p", default=False),
    Family("gpu_test_events_total", COUNTER, "1", "Test: events.", "events", "event", ("code",), "xid_counts"),
    Family("gpu_test_bus", GAUGE, "1", "Test: the bus.", "bus", "node", ("vendor",), "pci_devices"),
    Family("gpu_test_host_info", GAUGE, "1", "Test: the host.", "identity", "host", ("os", "node"),
           filterable=False),
    Family("gpu_exporter_test_total", COUNTER, "1", "Test: per backend.", "self", "self", ("backend",),
           "collections_total", filterable=False),
    Family("gpu_exporter_test_errors", GAUGE, "1", "Test: per backend and kind.", "self", "self",
           ("backend", "why"), "errors_total", filterable=False),
    Family("gpu_exporter_test_info", GAUGE, "1", "Test: the build.", "self", "self", ("version",),
           filterable=False),
)
schema.FAMILIES = schema.FAMILIES + rows
schema.FAMILY_BY_NAME.update({f.name: f for f in rows})
schema.FILTERABLE = schema.FILTERABLE + tuple(f.name for f in rows if f.filterable)
print(json.dumps(sorted({f.scope for f in rows})))

from exporter.core.options import FieldFilter
from exporter.core.readings import Collection, GpuReading, HostInfo, MigReading, PeerReading
from exporter.core.snapshot import BackendStats, Snapshot
from exporter.serve.render import render

gpu = GpuReading(index=0, uuid="GPU-a", vendor="nvidia", power_watts=250.0, clock_hertz={"sm": 1.5e9},
                 unsupported={"gpu_fan_speed_ratio"},
                 mig=[MigReading(1, 0, "MIG-1", "1g.10gb", memory_total_bytes=1e9)])
down = GpuReading(index=1, uuid="GPU-b", vendor="nvidia").down("lost")
peer = GpuReading(index=2, uuid="GPU-c", vendor="nvidia")
coll = Collection("nvml", [gpu, down, peer], [PeerReading(0, 2, {"read": 1.0})], {(0, "GPU-a", "79"): 3.0},
                  pci_devices=4)
stats = {"nvml": BackendStats(success=True, collections_total=7, errors_total={"driver": 2})}
snap = Snapshot([coll], HostInfo("node-a", "cpu", "6.1", "Debian"), stats, 0.0)
sys.stdout.write(render(snap, FieldFilter(include=[sys.argv[1]]) if sys.argv[1:] else FieldFilter()).decode())
"""

EXPECTED = {
    "gpu_test_watts": 'gpu_test_watts{gpu="0",uuid="GPU-a"} 250',
    "gpu_test_hertz": 'gpu_test_hertz{gpu="0",uuid="GPU-a",clock="sm"} 1500000000',
    "gpu_test_lost": 'gpu_test_lost{gpu="1",uuid="GPU-b"} 0',
    "gpu_test_missing": 'gpu_test_missing{gpu="0",uuid="GPU-a",what="gpu_fan_speed_ratio"} 1',
    "gpu_test_mig_bytes": ('gpu_test_mig_bytes{gpu="0",uuid="GPU-a",gpu_instance="1",compute_instance="0",'
                           'mig_profile="1g.10gb",mig_uuid="MIG-1"} 1000000000'),
    "gpu_test_events_total": 'gpu_test_events_total{gpu="0",uuid="GPU-a",code="79"} 3',
    "gpu_test_bus": 'gpu_test_bus{vendor="nvidia"} 4',
    "gpu_test_host_info": 'gpu_test_host_info{os="Debian",node="node-a"} 1',
    "gpu_exporter_test_total": 'gpu_exporter_test_total{backend="nvml"} 7',
    "gpu_exporter_test_errors": 'gpu_exporter_test_errors{backend="nvml",why="driver"} 2',
}


def _render(*include: str) -> str:
    p = subprocess.run([sys.executable, "-c", NEW_ROWS, *include], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    scopes, _, text = p.stdout.partition("\n")
    # every scope but pod, whose families the pod attribution plugin builds (schema.metric), and the
    # profiler's own (PROFILER_FAMILIES, tests/unit/profiler/test_exposition.py)
    assert json.loads(scopes) == sorted(set(SCOPE_LABELS) - {"pod", "profiler"})
    return text


def test_a_new_row_of_every_scope_is_rendered_from_the_row_alone() -> None:
    text = _render()
    lines = text.splitlines()
    for name, sample in EXPECTED.items():
        assert sample in lines, f"{name}: {sample!r} not rendered"
        help_ = next(line for line in lines if line.startswith(f"# HELP {name} "))
        assert help_.startswith(f"# HELP {name} Test: "), help_
    assert "# TYPE gpu_test_events_total counter" in lines and "# TYPE gpu_test_bus gauge" in lines
    assert [line for line in lines if line.startswith("gpu_test_lost")] == [
        'gpu_test_lost{gpu="0",uuid="GPU-a"} 1', 'gpu_test_lost{gpu="1",uuid="GPU-b"} 0',
        'gpu_test_lost{gpu="2",uuid="GPU-c"} 1']  # every GPU, the down one too
    assert not [line for line in lines if line.startswith("gpu_test_watts{gpu=\"1\"")]  # only GPUs that answered
    assert re.search(r'^gpu_exporter_test_info\{version="[^"]+"\} 1$', text, re.M)
    assert "gpu_test_peer{" not in text  # default=False: off /metrics ...
    assert 'gpu_test_peer{gpu="0",uuid="GPU-a",peer="2",cap="read"} 1' in _render("gpu_test_peer").splitlines()


def test_the_render_caches_do_not_grow_with_pod_churn() -> None:
    """Pod labels are part of each GPU's label string: a node that sees a new pod on every scrape for
    a day must not keep the text of every pod it ever saw."""
    import tracemalloc

    from exporter.core.options import FieldFilter
    from exporter.core.readings import Collection, GpuReading, HostInfo
    from exporter.core.snapshot import BackendStats, Snapshot
    from exporter.serve.render import render

    links = {(link, c): 0.0 for link in range(18) for c in ("crc_flit", "replay", "recovery")}

    def snap(pod: int) -> Snapshot:
        gpus = [GpuReading(index=i, uuid=f"GPU-{i}", power_watts=100.0, clock_hertz={"sm": 1e9, "mem": 2e9},
                           link_errors=dict(links)) for i in range(2)]
        return Snapshot([Collection("nvml", gpus)], HostInfo("n", "c", "k"), {"nvml": BackendStats()}, 0.0,
                        gpu_labels=lambda r: {"pod": f"job-{pod}-{r.index}", "namespace": "ml"})

    fields = FieldFilter()
    for pod in range(200):
        render(snap(pod), fields)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for pod in range(200, 1200):
            body = render(snap(pod), fields)
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert b'pod="job-1199-1"' in body and b"gpu_link_errors_total{" in body
    # kept: the texts of at most 2 x 2 + 16 GPU label strings, about 20 kB each here (all 2,000: 40 MB)
    assert grown < 1024 * 1024, f"the render caches grew by {grown} bytes over 1,000 pods"


def test_value_text() -> None:
    """Go's float text, which Prometheus parses back exactly; integral values without a fraction."""
    from exporter.serve.render import num

    cases = [(0.0, "0"), (-0.0, "0"), (5.0, "5"), (True, "1"), (85520809984, "85520809984"), (2.5, "2.5"),
             (-3.5e-9, "-3.5e-09"), (1e16, "1e+16"), (0.1 + 0.2, "0.30000000000000004"), (float("nan"), "NaN"),
             (float("inf"), "+Inf"), (float("-inf"), "-Inf")]
    assert [(v, num(v)) for v, _ in cases] == cases
