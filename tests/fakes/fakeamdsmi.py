"""A fake ROCm install for the amdsmi backend: builds ``libamd_smi.so`` and writes fleet files.

The real ``amdsmi`` Python wrapper (pinned: :data:`PINNED_AMDSMI_VERSION`) loads the fake
through ``$ROCM_PATH/lib/libamd_smi.so``; ``$FAKE_AMDSMI_FLEET`` names the fleet file the
fake serves. Nothing below our code is mocked in Python.

Build (needs gcc; about a second, once per session: tests/harness/cbuild.py)::

    rocm = built()                      # .../rocm/lib/libamd_smi.so (+ librocm-core.so); shared, read-only
    fake = FakeAmdSmi(rocm, tmp_dir / "fleet.conf")
    fake.write(two_gpu_fleet())         # or any list of per-GPU dicts
    monkeypatch.setenv(...) for k, v in fake.env().items()

Fleet file format (one ``key=value`` per line, ``#`` comments; the C side is
``tests/fakes/fake_amdsmi/fake_amdsmi.c``)::

    gpus=2                    rocm_version=6.2.1      init_status=0     fail_all=0
    gpu.0.market_name=AMD Instinct MI300X   gpu.0.temp.edge=41   gpu.0.fail.get_power_info=2

Per-GPU keys (units as the library reports them): ``market_name``, ``device_id``,
``asic_serial`` (hex), ``uuid``, ``bdf``, ``driver_version``, ``vbios_version``,
``product_serial``, ``product_name``, ``gfx_activity``/``umc_activity``/``mm_activity`` (%),
``vram_total``/``vram_used`` (bytes), ``temp.edge``/``temp.hotspot``/``temp.vram`` (C;
``temp.<sensor>.critical``: the CRITICAL limit, 0 on boards without that sensor),
``current_socket_power``/``average_socket_power`` (W), ``power_cap_uw`` (uW),
``energy_accumulator`` + ``energy_resolution_uj``, ``clk.<gfx|mem|soc|vclk0>[.max|.min]`` (MHz),
``pcie.width``/``pcie.max_width``/``pcie.speed``/``pcie.max_speed`` (MT/s)/``pcie.version``/
``pcie.replay``, ``pci_replay_counter``, ``ecc.correctable``/``ecc.uncorrectable``/``ecc.deferred``,
``ras.enabled`` (the mask of RAS blocks, amdsmi_gpu_block_t bits) with ``ras.<bit>.state``
(amdsmi_ras_err_state_t) and ``ras.<bit>.correctable``/``.uncorrectable``/``.deferred``,
``xgmi.links`` (e.g. ``U,U,D,X``), ``fan.speed``/``fan.max`` (0-255), ``metrics.<gpu_metrics
field>`` (the fields ``amdsmi_get_gpu_metrics_info`` fills: throttle status and residencies,
``accumulation_counter``, ``average_gfx/umc/mm_activity`` (%), ``vcn_activity`` and
``xgmi_read/write_data_acc`` (KB) as comma lists, ``-`` for an unused slot, ``pcie_bandwidth_acc``,
``firmware_timestamp`` (10 ns), ``system_clock_counter`` (ns); others read as all ones),
``compute_partition``, ``memory_partition``, ``partition_id``, ``numa_node``, ``processes``
(``pid:vram_bytes:name[:gfx_engine_ns],...``), ``fail.<call>``/``fail.all`` (status codes).
Pair keys: ``link.<i>.<j>.type`` (``xgmi``/``pcie``), ``link.<i>.<j>.hops``, ``p2p.<i>.<j>``.
A key left out makes that call return AMDSMI_STATUS_NOT_SUPPORTED (2).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.fakes.fake_amdsmi.gen_stubs import PINNED_AMDSMI_VERSION, installed_version
from tests.harness import cbuild

HERE = Path(__file__).resolve().parent / "fake_amdsmi"
FLEET_ENV = "FAKE_AMDSMI_FLEET"

# amdsmi status codes used by tests (amdsmi_wrapper.amdsmi_status_t)
STATUS_NOT_SUPPORTED = 2
STATUS_DRM_ERROR = 6
STATUS_NOT_INIT = 32
STATUS_DRIVER_NOT_LOADED = 34

__all__ = [
    "FLEET_ENV",
    "PINNED_AMDSMI_VERSION",
    "FakeAmdSmi",
    "build",
    "built",
    "fleet_text",
    "installed_version",
    "rocm_smi_json",
    "two_gpu_fleet",
]


def _run(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"fake amdsmi build failed: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")


def release_symbols(release: str) -> set[str]:
    """The ``amdsmi_*`` functions a ROCm release's library exports (``amdsmi_symbols/rocm-<release>.txt``)."""
    path = Path(__file__).resolve().parent / "amdsmi_symbols" / f"rocm-{release}.txt"
    return {ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")}


def build(dest: Path, symbols: set[str] | None = None) -> Path:
    """Generate and compile the fake; return the directory to use as ``ROCM_PATH``.

    Step 1 compiles the generated stubs alone so that the wrapper can be imported; step 2
    reads the wrapper's structure layouts; step 3 links stubs + fake into the final library.
    ``symbols``: export only these ``amdsmi_*`` functions (a release's symbol set); the others
    stay inside the library, as if that release did not have them.
    """
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("fake amdsmi build needs gcc on PATH")
    gen = HERE / "gen_stubs.py"
    work = dest / "build"
    (work / "pass1" / "lib").mkdir(parents=True, exist_ok=True)
    rocm = dest / "rocm"
    (rocm / "lib").mkdir(parents=True, exist_ok=True)
    stubs = work / "amdsmi_stubs.c"
    layout = work / "amdsmi_layout.h"
    _run([sys.executable, str(gen), "stubs", str(stubs)])
    _run([gcc, "-shared", "-fPIC", "-O0", "-o", str(work / "pass1" / "lib" / "libamd_smi.so"), str(stubs)])
    env = {k: v for k, v in os.environ.items() if k not in ("ROCM_HOME", "LD_LIBRARY_PATH")}
    env["ROCM_PATH"] = str(work / "pass1")
    _run([sys.executable, str(gen), "layout", str(layout)], env=env)
    lib = rocm / "lib" / "libamd_smi.so"
    export: list[str] = []
    if symbols is not None:
        script = work / "exports.map"
        script.write_text("{ global: " + "".join(f"{s}; " for s in sorted(symbols)) + "local: amdsmi_*; };\n")
        export = [f"-Wl,--version-script={script}"]
    _run([
        gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
        "-I", str(work), "-o", str(lib), str(HERE / "fake_amdsmi.c"), str(stubs), "-lpthread", *export,
    ])
    core = rocm / "lib" / "librocm-core.so"
    if not core.exists():
        core.symlink_to(lib.name)  # getROCmVersion lives in the fake too
    return rocm


def built(symbols: set[str] | None = None) -> Path:
    """:func:`build`, once per source, installed ``amdsmi`` and ``symbols`` for every test process.

    The returned ``ROCM_PATH`` is shared by every test: read it, never change it.
    """
    key = b"".join(p.read_bytes() for p in (HERE / "fake_amdsmi.c", HERE / "gen_stubs.py", Path(__file__)))
    key += repr((installed_version(), None if symbols is None else sorted(symbols))).encode()
    return cbuild.cached("fakeamdsmi", key, lambda work: build(work, symbols)) / "rocm"


def fleet_text(gpus: Sequence[Mapping[str, object]], **top: object) -> str:
    """The fleet file for ``gpus`` (per-GPU keys) plus top-level keys (``rocm_version=...``)."""
    lines = [f"gpus={len(gpus)}"]
    lines += [f"{k}={v}" for k, v in top.items()]
    for i, gpu in enumerate(gpus):
        lines += [f"gpu.{i}.{k}={v}" for k, v in gpu.items() if not k.startswith(("link.", "p2p."))]
        # pair keys may be given on a GPU dict for convenience: {"link.1.type": "xgmi"} on GPU 0
        for k, v in gpu.items():
            if k.startswith(("link.", "p2p.")):
                kind, rest = k.split(".", 1)
                lines.append(f"{kind}.{i}.{rest}={v}")
    return "\n".join(lines) + "\n"


class FakeAmdSmi:
    """One fake ROCm install (``rocm``) serving the fleet file ``fleet``."""

    def __init__(self, rocm: Path, fleet: Path) -> None:
        self.rocm = rocm
        self.fleet = fleet

    def env(self) -> dict[str, str]:
        return {"ROCM_PATH": str(self.rocm), FLEET_ENV: str(self.fleet)}

    def write(self, gpus: Sequence[Mapping[str, object]], **top: object) -> None:
        """Replace the fleet atomically (new inode: the fake notices on its next call)."""
        tmp = self.fleet.with_name(self.fleet.name + ".tmp")
        tmp.write_text(fleet_text(gpus, **top))
        os.replace(tmp, self.fleet)


def two_gpu_fleet() -> list[dict[str, object]]:
    """Two MI300X-like GPUs on one XGMI hive, different NUMA nodes, every field the backend reads."""
    common: dict[str, object] = {
        "market_name": "AMD Instinct MI300X",
        "device_id": "0x74a1",
        "driver_version": "6.8.5",
        "vbios_version": "113-M3000100-102",
        "product_name": "AMD Instinct MI300X OAM",
        "vram_total": 206158430208,  # 192 GiB
        "power_cap_uw": 750_000_000,
        "energy_resolution_uj": 15.25,  # exact in float32
        "clk.gfx.max": 2100,
        "clk.mem.max": 1300,
        "clk.soc.max": 1143,
        "clk.vclk0.max": 1333,
        "pcie.max_width": 16,
        "pcie.max_speed": 32000,
        "pcie.version": 5,
        "fan.max": 255,
        "temp.edge.critical": 100,  # the edge sensor's limit (0 on boards without one)
        "memory_partition": "NPS1",
        "metrics.accumulation_counter": 1000,
    }
    gpu0: dict[str, object] = {
        **common,
        "uuid": "9dff74a1-0000-1000-8020-5b1f1f2b6ac6",
        "asic_serial": "0x9D205B1F1F2B6AC6",
        "product_serial": "692351000123",
        "bdf": "0000:0C:00.0",
        "gfx_activity": 87,
        "umc_activity": 42,
        "mm_activity": 0,
        "vram_used": 64424509440,  # 60 GiB
        "temp.edge": 45,
        "temp.hotspot": 61,
        "temp.vram": 52,
        "current_socket_power": 612,
        "energy_accumulator": 1_000_000_000,
        "clk.gfx": 2087,
        "clk.mem": 1300,
        "clk.soc": 1143,
        "clk.vclk0": 29,
        "pcie.width": 16,
        "pcie.speed": 32000,
        "pcie.replay": 3,
        "ecc.correctable": 12,
        "ecc.uncorrectable": 0,
        "ras.enabled": 0b1111,  # RAS on UMC, SDMA, GFX and MMHUB (amdsmi_gpu_block_t bits), each in state ENABLED
        "xgmi.links": "U,U,U,D,X",
        "fan.speed": 128,
        "metrics.indep_throttle_status": (1 << 0) | (1 << 47),  # PPT0 + PROCHOT_GFX
        # an MI300-class gpu_metrics table: VCN per instance, XGMI and PCIe data accumulators
        "metrics.average_gfx_activity": 85,
        "metrics.average_umc_activity": 40,
        "metrics.vcn_activity": "10,30,-,-",
        "metrics.xgmi_read_data_acc": "1000,2000,-,-,-,-,-,-",  # KB per link
        "metrics.xgmi_write_data_acc": "500,0,-,-,-,-,-,-",
        "metrics.pcie_bandwidth_acc": 64_000,  # 64 GB/s x 1000 iterations
        "metrics.firmware_timestamp": 100_000_000,  # 1 s in 10 ns ticks
        "compute_partition": "SPX",
        "partition_id": 0,
        "numa_node": 0,
        "processes": "4242:34359738368:python3,4343:1073741824:rccl-tests",
        "link.1.type": "xgmi",
        "link.1.hops": 1,
        "p2p.1": 1,
    }
    gpu1: dict[str, object] = {
        **common,
        "uuid": "55ff74a1-0000-1000-8031-7e2a3c4d5e6f",
        "asic_serial": "0x55317E2A3C4D5E6F",
        "product_serial": "692351000456",
        "bdf": "0000:8a:00.0",
        "gfx_activity": 3,
        "umc_activity": 1,
        "vram_used": 1073741824,  # 1 GiB
        "temp.edge": 38,
        "temp.hotspot": 44,
        # no temp.vram: the memory sensor is unsupported on this GPU
        "average_socket_power": 141,
        "energy_accumulator": 2_000_000_000,
        "clk.gfx": 132,
        "clk.mem": 900,
        "clk.soc": 800,
        "pcie.width": 8,
        "pcie.speed": 16000,
        "pci_replay_counter": 7,  # pcie_info has no replay count here: the sysfs counter is used
        "ecc.correctable": 0,
        "ecc.uncorrectable": 2,
        "ras.enabled": 0b101,  # UMC and GFX
        "xgmi.links": "U,D",
        "fan.speed": 0,
        "metrics.indep_throttle_status": 0,
        # one multimedia activity instead of per-VCN ones; time from the kernel's clock
        "metrics.average_gfx_activity": 3,
        "metrics.average_umc_activity": 1,
        "metrics.average_mm_activity": 7,
        "metrics.xgmi_read_data_acc": "4,-",
        "metrics.xgmi_write_data_acc": "6,-",
        "metrics.pcie_bandwidth_acc": 0,
        "metrics.system_clock_counter": 5_000_000_000,
        "compute_partition": "SPX",
        "partition_id": 0,
        "numa_node": 1,
    }
    return [gpu0, gpu1]


def rocm_smi_json(gpus: Sequence[Mapping[str, object]]) -> str:
    """The same fleet as ``rocm-smi ... --json`` (ROCm 6.2 key names) would print it.

    Lets a test feed one fleet to both AMD backends (a fake ``rocm-smi`` that ``cat``s this).
    Fields rocm-smi cannot show (maximum clocks, ECC, XGMI, throttling ...) are left out.
    """
    doc: dict[str, dict[str, str]] = {}
    for i, g in enumerate(gpus):
        def has(key: str, g: Mapping[str, object] = g) -> bool:
            return key in g and g[key] != ""

        card: dict[str, str] = {
            "Device ID": str(g.get("device_id", "N/A")),
            "Unique ID": hex(int(str(g["asic_serial"]), 16)) if has("asic_serial") else "N/A",
            "Card Series": str(g.get("market_name", "N/A")),
            "Serial Number": str(g.get("product_serial", "N/A")),
            "PCI Bus": str(g.get("bdf", "N/A")),
            "VBIOS version": str(g.get("vbios_version", "N/A")),
        }
        for sensor, key in (("edge", "temp.edge"), ("junction", "temp.hotspot"), ("memory", "temp.vram")):
            card[f"Temperature (Sensor {sensor}) (C)"] = f"{float(str(g[key])):.1f}" if has(key) else "N/A"
        if has("current_socket_power"):
            card["Current Socket Graphics Package Power (W)"] = f"{float(str(g['current_socket_power'])):.1f}"
        else:
            card["Average Graphics Package Power (W)"] = f"{float(str(g.get('average_socket_power', 'nan'))):.1f}"
        if has("power_cap_uw"):
            card["Max Graphics Package Power (W)"] = f"{int(str(g['power_cap_uw'])) / 1e6:.1f}"
        card["GPU use (%)"] = str(g.get("gfx_activity", "N/A"))
        card["GPU Memory Read/Write Activity (%)"] = str(g.get("umc_activity", "N/A"))
        if has("vram_total") and has("vram_used"):
            total, used = int(str(g["vram_total"])), int(str(g["vram_used"]))
            card["GPU Memory Allocated (VRAM%)"] = str(round(100 * used / total))
            card["VRAM Total Memory (B)"], card["VRAM Total Used Memory (B)"] = str(total), str(used)
        if has("energy_accumulator") and has("energy_resolution_uj"):
            count = int(str(g["energy_accumulator"]))
            card["Energy counter"] = str(count)
            card["Accumulated Energy (uJ)"] = str(round(count * float(str(g["energy_resolution_uj"])), 2))
        for clk, key in (("sclk", "clk.gfx"), ("mclk", "clk.mem"), ("socclk", "clk.soc"), ("vclk0", "clk.vclk0")):
            if has(key):
                card[f"{clk} clock speed:"] = f"({g[key]}Mhz)"
                card[f"{clk} clock level:"] = "0"
        if has("pcie.speed") and has("pcie.width"):
            card["pcie clock level"] = f"0 ({int(str(g['pcie.speed'])) / 1000:.1f}GT/s x{g['pcie.width']})"
        replay = g.get("pcie.replay", g.get("pci_replay_counter"))
        card["PCIe Replay Count"] = str(replay) if replay is not None else "N/A"
        if has("fan.speed") and has("fan.max") and int(str(g["fan.speed"])) > 0:
            # rocm-smi prints nothing for a fan at level 0 ("unable to detect fan speed")
            card["Fan speed (level)"] = str(g["fan.speed"])
            card["Fan speed (%)"] = str(round(100 * int(str(g["fan.speed"])) / int(str(g["fan.max"]))))
        card["Compute Partition"] = str(g.get("compute_partition", "N/A"))
        doc[f"card{i}"] = card
    driver = next((str(g["driver_version"]) for g in gpus if "driver_version" in g), "N/A")
    doc["system"] = {"Driver version": driver}
    return json.dumps(doc, indent=4) + "\n"
