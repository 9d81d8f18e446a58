"""No dead or write-only code in ``exporter/``: vulture at 60% confidence reports nothing unexplained.

Vulture reads only ``exporter/``, so it cannot see the readers it does not parse: Python itself (module hooks,
``atexit``, signal handler signatures), C libraries (ctypes structures), third-party objects, the public API's
callers, ``demo/`` and the tests. Each such name is listed below with the reason it stays. Two kinds of hit are
explained by a declaration instead of a list:

- a ``GpuReading``/``MigReading`` field that a schema row names as its ``attr``: the renderer reads it with
  ``getattr`` (a new family's field needs no entry here);
- a name on the path of a GPU field's ``source`` (``reading.free_memory_bytes()``): the JSON views read it
  through that path (exporter/core/views.py);
- generated gRPC code (``exporter/k8s/proto``), which is not ours to trim.
"""

from __future__ import annotations

import re
from pathlib import Path

from vulture import Vulture

from exporter.core.schema import FAMILIES
from exporter.core.views import FIELDS
from tests.harness.exporter import REPO

MIN_CONFIDENCE = 60

# (kind, name) as vulture says it ("unused attribute 'x'") -> why it is not dead.
EXPLAINED: dict[tuple[str, str], str] = {
    ("function", "__getattr__"): "exporter/__init__.py: PEP 562 module hook, Python calls it for the lazy API names",
    ("function", "__dir__"): "exporter/__init__.py: PEP 562 module hook, dir(exporter) calls it",
    ("attribute", "_nvmlLib_refcount"): "pynvml's own module global, kept right for its nvmlShutdown()",
    ("attribute", "numMetrics"): "nvml_gpm: a ctypes structure field that libnvidia-ml reads",
    ("attribute", "sample1"): "nvml_gpm: a ctypes structure field that libnvidia-ml reads",
    ("attribute", "sample2"): "nvml_gpm: a ctypes structure field that libnvidia-ml reads",
    ("attribute", "metricId"): "nvml_gpm: a ctypes structure field that libnvidia-ml reads",
    ("function", "kill_running"): "backends/cli: registered with @atexit.register, Python calls it at exit",
    ("method", "ecc_uncorrected"): "simulated: the demo (demo/run.py) draws the model's ECC counter with it",
    ("attribute", "lists"): "k8s/watch: how many lists a watcher made, read by tests/unit/k8s/test_watch.py "
                            "to prove a watch follows the first list",
    ("attribute", "transitions"): "profiler/leader: how often this replica became leader, read by "
                                  "tests/unit/profiler/test_leader_election.py (a renewal is not a new leadership)",
    ("variable", "client_address"): "platform/http Handler: a request's peer, as http.server names it, for routes",
    ("variable", "request_version"): "platform/http Handler: the request's HTTP version, for routes",
    ("variable", "poll_interval"): "platform/http: serve_forever keeps socketserver's signature",
    ("attribute", "user_agent"): "profiler/main: the kubernetes ApiClient's property, sent as User-Agent",
    ("variable", "frame"): "serve/main, profiler/main: a signal handler's signature (signum, frame)",
    ("function", "smi_fields"): "tools/gpucheck: the schema row's nvidia-smi column as a list, the API "
                                "tests/unit/tools/test_gpucheck.py checks every compared field against",
    ("variable", "memory_per_gpu_bytes"): "python_api Requirements: a public field of the Python API "
                                          "(docs/python-api.md), read by its callers",
    ("method", "util_stats"): "profiler/promql: a shard's utilisation parts joined as one query, the text "
                              "tests/unit/profiler/test_reader.py checks for the source's selectors",
    ("method", "mem_stats"): "profiler/promql: a shard's memory and health parts joined as one query, the text "
                             "tests/unit/profiler/test_health.py and test_reader.py check",
    ("function", "gpu_causes"): "profiler/health: one GPU's causes in CAUSES order (gpu_findings without the "
                                "warn entries), the table tests/unit/profiler/test_health.py checks cause by cause",
    ("variable", "CRITICAL_XIDS"): "profiler/health: the catalogue's fatal codes with no override, the rules "
                                   "tests/unit/profiler/test_health.py and test_device_taints.py pass explicitly",
    ("variable", "exc_type"): "python_api Monitor.__exit__: the context manager signature",
    ("variable", "tb"): "python_api Monitor.__exit__: the context manager signature",
}

GENERATED = ("exporter/k8s/proto",)


def _hits() -> list[tuple[str, str, str]]:
    """(kind, name, 'file:line') of every hit at MIN_CONFIDENCE, generated code left out."""
    v = Vulture()
    v.scavenge([str(REPO / "exporter")], exclude=[str(REPO / g) for g in GENERATED])
    out = []
    for item in v.get_unused_code(min_confidence=MIN_CONFIDENCE):
        where = f"{item.filename.relative_to(REPO)}:{item.first_lineno}"
        out.append((item.typ, item.name, where))
    return out


def test_vulture_finds_nothing_unexplained() -> None:
    read_by_render = {f.attr for f in FAMILIES if f.attr}
    read_by_views = {step for f in FIELDS for step in re.sub(r"\(\)|\[\w+\]", "", f.source).split(".")}
    unexplained = [f"{where}: unused {kind} {name!r}" for kind, name, where in _hits()
                   if (kind, name) not in EXPLAINED and name not in read_by_render | read_by_views]
    assert not unexplained, ("dead or write-only code (remove it, or add it to EXPLAINED with the reason it "
                             "stays):\n" + "\n".join(unexplained))


def test_it_would_see_dead_code(tmp_path: Path) -> None:
    """The check is live: vulture, as configured here, reports a write-only counter and an unused function."""
    module = tmp_path / "m.py"
    module.write_text("class C:\n    def __init__(self) -> None:\n        self.sent = 0\n\n"
                      "    def send(self) -> None:\n        self.sent += 1\n\n\n"
                      "def never_called() -> None:\n    pass\n\n\nC().send()\n")
    v = Vulture()
    v.scavenge([str(module)])
    assert {(i.typ, i.name) for i in v.get_unused_code(min_confidence=MIN_CONFIDENCE)} == {
        ("attribute", "sent"), ("function", "never_called")}
