"""pynvml's internals are used in one guarded module (exporter/backends/nvml_private.py), issue 27.

Two halves:

- the source: no module of the exporter but ``nvml_private`` imports ``pynvml``, names one of its
  internals (a name of the installed pynvml that starts with ``_``, its ``c_nvml*`` / ``struct_c_nvml*``
  structures, ``nvmlLib``, ``libLoadLock``) or declares a ctypes structure; no other NVML module
  imports ctypes (checked on the AST, the checker itself checked on a snippet that breaks each rule);
- the behaviour: an nvidia-ml-py without one of the internals the module uses (the real pynvml with
  that name hidden, over the fake libnvidia-ml.so.1, in a subprocess) loses only the readings that need it,
  with one log line naming it, every GPU up and no traceback; on a driver before
  ``nvmlInitWithFlags`` and the ``_v2`` count/handle calls too.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest

from exporter.backends import nvml_private
from tests.fakes.fakenvml import FakeNvml
from tests.harness.exporter import REPO

PACKAGE = REPO / "exporter"
OWNER = PACKAGE / "backends" / "nvml_private.py"
STRUCTURE_BASES = {"Structure", "Union", "BigEndianStructure", "LittleEndianStructure"}


def internal_names() -> frozenset[str]:
    """pynvml's internals: what the installed binding itself marks private, its C structure types and
    the loaded library's globals (and any ``_nvml*`` a newer binding may add)."""
    names = {n for n in vars(pynvml) if n.startswith("_") and not n.startswith("__")}
    names |= {n for n in vars(pynvml) if n.startswith(("c_nvml", "struct_c_nvml"))}
    return frozenset(names | {"nvmlLib", "libLoadLock"})


def _is_internal(name: str, internals: frozenset[str]) -> bool:
    return name in internals or name.startswith(("_nvml", "c_nvml", "struct_c_nvml"))


def violations(source: str, where: str, internals: frozenset[str]) -> list[str]:
    """Each use of a pynvml internal, import of pynvml, ctypes structure (and, in an NVML module,
    ctypes import) in ``source``."""
    nvml_module = Path(where).name.startswith("nvml")
    out: list[str] = []
    for node in ast.walk(ast.parse(source, filename=where)):
        at = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "pynvml":
                    out.append(f"{at}: imports pynvml")
                if a.name.split(".")[0] == "ctypes" and nvml_module:
                    out.append(f"{at}: imports ctypes")
        elif isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            if root == "pynvml":
                out.append(f"{at}: imports from pynvml")
            if root == "ctypes" and nvml_module:
                out.append(f"{at}: imports from ctypes")
        elif isinstance(node, ast.Attribute) and _is_internal(node.attr, internals):
            out.append(f"{at}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _is_internal(node.value, internals):
            out.append(f"{at}: {node.value!r}")  # getattr(nv, "_nvml...")
        elif isinstance(node, ast.ClassDef):
            bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
            if bases & STRUCTURE_BASES:
                out.append(f"{at}: ctypes structure {node.name}")
    return out


def test_the_checker_catches_each_rule() -> None:
    snippet = (
        "import ctypes\nimport pynvml\nfrom pynvml import nvmlInit\n"
        "fn = pynvml._nvmlGetFunctionPointer('x')\nh = nv.c_nvmlDevice_t()\nlock = nv.libLoadLock\n"
        "lib = getattr(nv, 'nvmlLib')\nclass S(ctypes.Structure):\n    pass\n"
    )
    found = violations(snippet, "exporter/backends/nvml_new.py", internal_names())
    assert sorted(v.split(": ", 1)[1] for v in found) == sorted([
        "imports ctypes", "imports pynvml", "imports from pynvml", "ctypes structure S", "._nvmlGetFunctionPointer",
        ".c_nvmlDevice_t", ".libLoadLock", "'nvmlLib'"])
    # outside an NVML module ctypes itself is allowed (serve/main.py's mallopt, amdsmi's own binding)
    assert violations("import ctypes\n", "exporter/serve/main.py", internal_names()) == []


def test_no_module_but_nvml_private_touches_pynvml_internals() -> None:
    internals = internal_names()
    assert {"_nvmlGetFunctionPointer", "_PrintableStructure", "c_nvmlDevice_t", "nvmlLib"} <= internals
    found = [v for path in sorted(PACKAGE.rglob("*.py")) if path != OWNER
             for v in violations(path.read_text(), str(path.relative_to(REPO)), internals)]
    assert found == [], "pynvml internals or ctypes structures outside nvml_private.py:\n" + "\n".join(found)


def test_every_internal_the_module_guards_exists_in_the_installed_binding() -> None:
    """A name guarded here but gone from nvidia-ml-py would make its readings absent everywhere."""
    assert set(nvml_private.INTERNALS) <= set(vars(pynvml))
    assert set(nvml_private.INTERNALS) == set(LOSES), "each guarded internal needs its case below"


# --- behaviour: an nvidia-ml-py without one internal -------------------------------------------------

# Reads a fleet (at least twice: GPM needs two samples) through NvmlBackend, with an nvidia-ml-py whose
# module lacks the named attributes (a stand-in module: pynvml's own functions keep using their
# globals, as in a release that renamed them), until the queued XID is counted, and prints what was
# read: families per GPU, up, XID codes.
SCRIPT = r"""
import json, logging, sys, types
import pynvml

hidden = set(json.loads(sys.argv[1]))


class Binding(types.ModuleType):
    # the installed pynvml without the hidden names (its own functions keep their globals)

    def __getattr__(self, name):
        if name in hidden:
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}")
        return getattr(pynvml, name)

    def __setattr__(self, name, value):
        setattr(pynvml, name, value)


if hidden:
    sys.modules["pynvml"] = Binding("pynvml")
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
from exporter.backends.nvml import NvmlBackend
from exporter.core.options import BackendOptions
from exporter.core.readings import Collection
from exporter.core.schema import GPU_FAMILIES

from tests.harness.poll import wait_until

b = NvmlBackend(BackendOptions(sysfs_root=sys.argv[2]))
b.init()

def collected():
    out = Collection(backend="nvml")
    b.collect(out)
    return out if out.xid_counts else None

wait_until(collected, 30, what="the queued XID counted")  # collections go on meanwhile: GPM has two samples
b.collect(out := Collection(backend="nvml"))
b.shutdown()
families = {str(r.index): sorted(f.name for f in GPU_FAMILIES if getattr(r, f.attr, None) not in (None, {}, []))
            for r in out.gpus}
print(json.dumps({"families": families, "up": [r.up for r in out.gpus],
                  "xid": sorted(str(k[2]) for k in out.xid_counts)}))
"""

GPM = {"gpu_sm_active_ratio", "gpu_sm_occupancy_ratio", "gpu_graphics_engine_active_ratio", "gpu_pipe_active_ratio",
       "gpu_dram_active_ratio", "gpu_nvlink_throughput_bytes_per_second", "gpu_pcie_throughput_bytes_per_second"}
# Families read only by direct calls (looked up through _nvmlGetFunctionPointer): everything but what
# pynvml's own wrappers read (identity, max clocks and links, ECC mode, pending pages, throttle
# reasons, processes, MIG mode, recovery action; the memory temperature keeps gpu_temperature_celsius).
DIRECT = {"gpu_utilization_ratio", "gpu_memory_utilization_ratio", "gpu_memory_total_bytes", "gpu_memory_used_bytes",
          "gpu_memory_free_bytes", "gpu_memory_reserved_bytes", "gpu_power_watts", "gpu_power_limit_watts",
          "gpu_energy_joules_total", "gpu_pcie_link_generation", "gpu_pcie_link_width", "gpu_pcie_replays_total",
          "gpu_clock_hertz", "gpu_power_default_limit_watts", "gpu_compute_mode", "gpu_performance_state",
          "gpu_ecc_errors_total", "gpu_retired_pages", "gpu_remapped_rows", "gpu_remapped_rows_pending",
          "gpu_remapped_rows_failed", "gpu_violation_seconds_total", "gpu_link_up", "gpu_link_errors_total",
          "gpu_encoder_utilization_ratio", "gpu_decoder_utilization_ratio", "gpu_fabric_state"}
# A driver before nvmlInitWithFlags and the _v2 count and handle calls: the init, count and handle
# go through the module's own calls.
OLD_DRIVER = ("nvmlInitWithFlags", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2")
# internal -> (the fake's omitted functions, the families it costs)
LOSES: dict[str, tuple[tuple[str, ...], set[str]]] = {
    "_nvmlGetFunctionPointer": ((), DIRECT | GPM),
    "c_nvmlGpmSample_t": ((), GPM),
    "NVML_GPM_METRIC_MAX": ((), GPM),
    "NVML_GPM_METRICS_GET_VERSION": ((), GPM),
    "libLoadLock": (OLD_DRIVER, set()),
    "_nvmlLib_refcount": (OLD_DRIVER, set()),
}
GPUS = 2


def read(tmp_path: Path, omit: tuple[str, ...], delete: list[str]) -> tuple[dict[str, Any], str]:
    fleet = FakeNvml(tmp_path / f"fleet-{'-'.join(delete) or 'all'}.conf", gpus=GPUS, omit=omit)
    fleet.queue_xid(1, 79)
    res = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(delete), str(tmp_path / "sys")], cwd=REPO,
                         env={"PATH": "/usr/bin:/bin", **fleet.env()}, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout), res.stderr


@pytest.mark.parametrize("internal", sorted(LOSES))
def test_a_missing_internal_costs_only_its_readings(internal: str, tmp_path: Path) -> None:
    omit, lost = LOSES[internal]
    base, base_log = read(tmp_path, omit, [])
    got, log = read(tmp_path, omit, [internal])
    assert base["up"] == [True] * GPUS and "lacks pynvml" not in base_log
    assert lost <= set(base["families"]["0"]), "the fleet must serve what the internal's absence costs"
    assert got["up"] == [True] * GPUS, f"without pynvml.{internal} a GPU is down:\n{log}"
    for gpu in map(str, range(GPUS)):
        assert set(base["families"][gpu]) - set(got["families"][gpu]) == lost, gpu
        assert set(got["families"][gpu]) <= set(base["families"][gpu])
    assert got["xid"] == base["xid"] == ["79"], "the event watcher still counts XIDs"
    # one line says why; the readings it costs are logged as any unsupported reading (once per GPU)
    why = f"nvml: the installed nvidia-ml-py lacks pynvml.{internal}:"
    named = [ln for ln in log.splitlines() if ln.startswith(why)]
    assert len(named) == 1, log
    assert "Traceback" not in log
