"""Fake NVML for tests: build the fake ``libnvidia-ml.so.1`` and describe a GPU fleet.

The real ``pynvml`` (nvidia-ml-py) loads ``tests/fakes/fake_nvml/fake_nvml.c`` instead of NVIDIA's
library, and the fake answers from a *fleet file* that this module writes.

Loading
    * subprocess: merge ``fake.env()`` (``LD_LIBRARY_PATH`` + ``FAKE_NVML_CONFIG``) into its env;
    * in process: ``fake.activate()`` (``ctypes.CDLL`` of the absolute path before the first
      ``nvmlInit()``; the soname makes pynvml's ``CDLL("libnvidia-ml.so.1")`` reuse it) and set
      ``FAKE_NVML_CONFIG``.  Only one build can live in a process, so ``omit=`` builds need a
      subprocess.

Fleet file (parsed by the C side; its header comment is the full reference)
    ``key=value`` lines.  Globals: ``count``, ``driver_version``, ``nvml_version``,
    ``cuda_version``, ``fail.<function>=<code>``, ``field_fail.<fieldId>=<code>``,
    ``topo.<i>.<j>=<level>``, ``p2p.<i>.<j>.<index>=<status>``, ``xid.<seq>=<gpu>:<xid>``.
    Per GPU: ``gpu.<i>.<field>=<value>`` for every key of ``FakeNvml.gpus[i]`` (see
    ``_default_gpu``), plus ``gpu.<i>.fail.<function>`` and ``gpu.<i>.field_fail.<id>``.
    Values are NVML's raw units: mW, mJ, MHz, percent, bytes, celsius, KB/s, ns.
    The file is replaced atomically (temp + rename) with a strictly increasing mtime, then the
    u64 counter in ``<file>.gen`` (mmap'd by the library) is incremented; the library stat()s the
    file only when that counter moved (one memory load per call), so ``set()`` is visible to the
    very next NVML call.  A hand-written fleet file without ``.gen`` is stat()ed on every call.

Defaults: an 8-GPU DGX-H100-like node, distinct deterministic values per index, healthy (no
ECC/remap/XID errors), passively cooled (``fans=0``: fan-speed calls return NOT_SUPPORTED; pass
``fans=1`` to get ``fan_speed``), MIG disabled, 18 NVLinks, GPUs 0-3 on NUMA node 0 and 4-7 on 1
(so the default topology level is 40 NODE within a half, 50 SYSTEM across; P2P is OK everywhere).
Memory: ``mem_used`` excludes ``mem_reserved`` (nvmlMemory_v2 meaning); v1 reports
``used + reserved`` and both report ``free = total - reserved - used``.

GPM (``nvmlGpm*``, R520+): every default GPU supports it (``gpm_supported=1``) and carries
``gpm`` values for the metrics of ``GPM_DEFAULT_METRICS`` (percent, or MiB/s for PCIe/NVLink),
keyed by ``NVML_GPM_METRIC_*`` id.  ``nvmlGpmMetricsGet`` over two samples of a GPU returns the
values configured when the later sample was taken; ``gpm_fail`` ({id: code}) sets a metric's own
``nvmlReturn``.  A MIG instance carries only its slot's ``gpm`` dict (``add_mig`` fills the SM
metrics by default; PCIe and NVLink are device-wide, so an instance reports them NOT_SUPPORTED).

Extending with a new NVML symbol: see "ADDING A SYMBOL" at the top of fake_nvml.c; a new
per-GPU value also needs its default in ``_default_gpu`` below.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import re
import struct
import subprocess
import threading
import time
import uuid as uuidlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tests.harness import cbuild

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fake_nvml" / "fake_nvml.c"
BUILD_ROOT = cbuild.BUILD_ROOT
SONAME = "libnvidia-ml.so.1"
CFLAGS = ("-std=c11", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-fvisibility=hidden", "-pthread",
          f"-Wl,-soname,{SONAME}")

# NVML return codes (nvml.h).
SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
ARGUMENT_VERSION_MISMATCH = 25
UNKNOWN = 999
HANG = 65536  # not an NVML code: the fake blocks the call until the file stops injecting it (hang())

# Limits of the C side.
MAX_GPUS = 64
MAX_MIG = 8
MAX_EVENTS = 1024
MAX_SEQ = 65535

XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError

# NVML_GPM_METRIC_* ids (nvml.h) of the metrics every default GPU carries.
GPM_GRAPHICS_UTIL = 1
GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_INTEGER_UTIL = 4
GPM_ANY_TENSOR_UTIL = 5
GPM_DFMA_TENSOR_UTIL = 6
GPM_HMMA_TENSOR_UTIL = 7
GPM_DMMA_TENSOR_UTIL = 8
GPM_IMMA_TENSOR_UTIL = 9
GPM_DRAM_BW_UTIL = 10
GPM_FP64_UTIL = 11
GPM_FP32_UTIL = 12
GPM_FP16_UTIL = 13
GPM_PCIE_TX_PER_SEC = 20
GPM_PCIE_RX_PER_SEC = 21
GPM_NVLINK_TOTAL_RX_PER_SEC = 60
GPM_NVLINK_TOTAL_TX_PER_SEC = 61
GPM_SM_METRICS = (GPM_GRAPHICS_UTIL, GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_INTEGER_UTIL, GPM_ANY_TENSOR_UTIL,
                  GPM_DFMA_TENSOR_UTIL, GPM_HMMA_TENSOR_UTIL, GPM_DMMA_TENSOR_UTIL, GPM_IMMA_TENSOR_UTIL,
                  GPM_DRAM_BW_UTIL, GPM_FP64_UTIL, GPM_FP32_UTIL, GPM_FP16_UTIL)
GPM_DEFAULT_METRICS = (*GPM_SM_METRICS, GPM_PCIE_TX_PER_SEC, GPM_PCIE_RX_PER_SEC, GPM_NVLINK_TOTAL_RX_PER_SEC,
                       GPM_NVLINK_TOTAL_TX_PER_SEC)
GPM_METRIC_MAX = 477  # the fake's NVML_GPM_METRIC_MAX (nvidia-ml-py 13.615's)

# DGX H100 PCI bus numbers of GPUs 0-7; further GPUs repeat them in the next PCI domain.
_DGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_GIB = 1 << 30

# Per-GPU keys whose values are not scalars.
_COMPOUND = {"violation", "nvlink_active", "nvlink_err", "retired_sbe", "retired_dbe", "procs",
             "graphics_procs", "mig", "unsupported", "gpm", "gpm_fail", "proc_util", "mps_procs"}
_GLOBAL_KEYS = {"driver_version", "nvml_version", "cuda_version"}


@functools.cache
def symbols() -> tuple[str, ...]:
    """Every NVML function the fake exports (the names ``omit`` and ``fail`` accept)."""
    return tuple(re.findall(r"^#ifndef OMIT_(\w+)$", SOURCE.read_text(), flags=re.M))


def _check_function(name: str) -> None:
    if name not in symbols():
        raise ValueError(f"unknown fake NVML function {name!r} (see FAKE_FUNCS in {SOURCE.name})")


@functools.cache
def _build(omit: tuple[str, ...]) -> Path:
    for name in omit:
        _check_function(name)

    def compile_into(out: Path) -> None:
        cmd = [os.environ.get("CC", "gcc"), *CFLAGS, *(f"-DOMIT_{n}" for n in omit), "-o", str(out / SONAME),
               str(SOURCE)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"building the fake NVML failed ({' '.join(cmd)}):\n{proc.stderr}")

    # once per source and omit list for the whole session, whatever the number of test processes
    return cbuild.cached("fakenvml", SOURCE.read_bytes() + repr((omit, CFLAGS)).encode(), compile_into) / SONAME


def build_library(omit: Sequence[str] = ()) -> Path:
    """Compile the fake (cached by source + omit list) and return the path of ``libnvidia-ml.so.1``.

    The returned path is the *file*; its ``.parent`` is what ``LD_LIBRARY_PATH`` needs.
    ``omit``: NVML function names to leave out, so pynvml raises ``NVMLError_FunctionNotFound``.
    """
    return _build(tuple(sorted(set(omit))))


_loaded: ctypes.CDLL | None = None


def load_in_process(lib: Path) -> ctypes.CDLL:
    """Load the fake into this process so pynvml's ``CDLL("libnvidia-ml.so.1")`` reuses it.

    Call before the first ``pynvml.nvmlInit()``.  Fails if another ``libnvidia-ml.so.1`` (another
    build, or a real driver) is already mapped, since the loader would keep using that one.
    """
    global _loaded
    lib = lib.resolve()
    maps = Path("/proc/self/maps")
    if maps.exists():
        for line in maps.read_text().splitlines():
            parts = line.split(maxsplit=5)
            path = parts[5] if len(parts) == 6 else ""
            if path.endswith("/" + SONAME) and Path(path) != lib:
                raise RuntimeError(f"another {SONAME} is already loaded in this process: {path}")
    if _loaded is None or Path(_loaded._name) != lib:
        _loaded = ctypes.CDLL(str(lib))
    return _loaded


def _default_gpm(seed: int, util: float, mem_util: float) -> dict[int, float]:
    """GPM values (percent; MiB/s for PCIe/NVLink), distinct per ``seed``, below ``util``."""
    return {
        GPM_GRAPHICS_UTIL: util,
        GPM_SM_UTIL: round(util * 0.75, 2),
        GPM_SM_OCCUPANCY: round(util * 0.5, 2),
        GPM_INTEGER_UTIL: 3.0 + seed,
        GPM_ANY_TENSOR_UTIL: round(util * 0.4, 2),
        GPM_DFMA_TENSOR_UTIL: 1.0 + seed / 2,
        GPM_HMMA_TENSOR_UTIL: round(util * 0.3, 2),
        GPM_DMMA_TENSOR_UTIL: 0.5 + seed / 4,
        GPM_IMMA_TENSOR_UTIL: 2.0 + seed / 4,
        GPM_DRAM_BW_UTIL: round(mem_util * 0.9, 2),
        GPM_FP64_UTIL: 4.0 + seed / 2,
        GPM_FP32_UTIL: 20.0 + seed,
        GPM_FP16_UTIL: 8.0 + seed,
    }


def _default_gpu(i: int, n: int) -> dict[str, Any]:
    """Raw NVML values of GPU ``i`` of ``n``: an H100 SXM5 80GB, distinct per index."""
    return {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-6a5e{i:04x}-1c2d-4e5f-8a9b-0c1d2e3f{i:04x}",
        "serial": f"16523220{i:05d}",
        "bus_id": f"{i // 8:08X}:{_DGX_BUSES[i % 8]:02X}:00.0",
        "minor": i,
        "pci_device_id": 0x233010DE,      # device 0x2330 << 16 | vendor 0x10de
        "pci_subsystem_id": 0x16C110DE,
        "pci_class": 0x030200,            # 3D controller
        "brand": 14,                      # NVML_BRAND_NVIDIA
        "arch": 9,                        # NVML_DEVICE_ARCH_HOPPER
        "numa": 0 if i < max(n, 1) / 2 else 1,
        "util_gpu": (10 + 11 * i) % 101,  # percent
        "util_mem": (5 + 7 * i) % 101,
        "mem_total": 85_520_809_984,      # bytes (81559 MiB)
        "mem_reserved": 567_279_616,
        "mem_used": (i + 1) * _GIB,
        "temp_gpu": 30 + i,               # celsius
        "temp_mem": 35 + i,
        "power_mw": 70_123 + 10_000 * i,  # milliwatts
        "power_limit_mw": 700_000,
        "enforced_limit_mw": 700_000,
        "energy_mj": 1_000_000_000 + 12_345_678 * i,  # millijoules since driver load
        "clock_graphics": 1755 + 15 * i,  # MHz
        "clock_sm": 1755 + 15 * i,
        "clock_mem": 2619,
        "clock_video": 1275 + 5 * i,
        "max_clock_graphics": 1980,
        "max_clock_sm": 1980,
        "max_clock_mem": 2619,
        "max_clock_video": 1545,
        "pcie_gen": 5,
        "pcie_max_gen": 5,
        "pcie_gpu_max_gen": 5,
        "pcie_width": 16,
        "pcie_max_width": 16,
        "pcie_replay": 0,
        "pcie_tx_kbps": 1000 * (i + 1),   # KB/s
        "pcie_rx_kbps": 2000 * (i + 1),
        "fans": 0,
        "fan_speed": 40 + i,              # percent, reported only when fans > 0
        "pstate": 0,
        "ecc_mode": 1,
        "ecc_pending": 1,
        "ecc_corrected_volatile": 0,
        "ecc_corrected_aggregate": 0,
        "ecc_uncorrected_volatile": 0,
        "ecc_uncorrected_aggregate": 0,
        "retired_pending": 0,
        "remap_corr": 0,
        "remap_unc": 0,
        "remap_pending": 0,
        "remap_failure": 0,
        "clocks_event_reasons": 0x1 if i % 2 == 0 else 0x4,  # GPU idle / SW power cap
        "supported_clocks_event_reasons": 0x1FF,
        "violation_ref": 1_700_000_000_000_000_000,  # ns
        "violation": {p: (p + 1) * 1_000_000 * (i + 1) for p in (0, 1, 2, 3, 4, 5, 10, 11)},  # ns
        "nvlinks": 18,
        "nvlink_active": [1] * 18,
        "nvlink_err": {},                 # {(link, counter): count}, counters 0..4
        "enc_util": 0,
        "enc_period_us": 167_000,
        "dec_util": i,
        "dec_period_us": 167_000,
        "jpg_util": 2 * i,
        "jpg_period_us": 167_000,
        "ofa_util": 0,
        "ofa_period_us": 167_000,
        "retired_sbe": [],                # [(address, timestamp)]
        "retired_dbe": [],
        "procs": [],                      # [(pid, used_bytes | None[, gi, ci])]
        "graphics_procs": [],
        "mig_mode": 0,
        "mig_pending": 0,
        "mig_max": 7,
        "mig": {},                        # {slot: {profile, uuid, gi, ci, mem_total, mem_reserved, mem_used}}
        "unsupported": [],                # NVML function names returning NOT_SUPPORTED
        "supported_events": 0xD1F,        # SBE|DBE|PState|XID|Clock|MIG|DRAM retirement (+failure)
        "lost": 0,
        "delay_ms": 0,                    # every device call sleeps this long (a hung driver)
        "gpm_supported": 1,               # nvmlGpmQueryDeviceSupport (Hopper)
        "gpm": {**_default_gpm(i, float((10 + 11 * i) % 101), float((5 + 7 * i) % 101)),
                GPM_PCIE_TX_PER_SEC: 100.0 * (i + 1) + 0.5,   # MiB/s
                GPM_PCIE_RX_PER_SEC: 200.0 * (i + 1) + 0.25,
                GPM_NVLINK_TOTAL_RX_PER_SEC: 1000.0 * (i + 1),
                GPM_NVLINK_TOTAL_TX_PER_SEC: 1500.0 * (i + 1)},
        "gpm_fail": {},                   # {metric id: nvmlReturn of that metric alone}
        # shared GPUs (time-slicing, MPS): see time_slicing() and mps() below
        "proc_util": [],                  # [(pid, sm_percent[, mem, enc, dec[, timestamp_us]])] samples
        "mps_procs": [],                  # [(pid, used_bytes | None)] MPS clients
        # issue 28 (nvidia_gpu_exporter's series)
        "default_limit_mw": 700_000,      # nvmlDeviceGetPowerManagementDefaultLimit
        "compute_mode": 0,                # nvmlComputeMode_t: 0 Default ... 3 Exclusive_Process
        "vbios_version": f"96.00.99.00.{i + 1:02d}",
        "fabric_state": 3,                # nvmlGpuFabricState_t: 0 not supported ... 3 completed
        "fabric_status": 0,               # nvmlReturn_t of the fabric registration
        "recovery_action": 0,             # field 230, nvmlDeviceGpuRecoveryAction_t (0 none)
    }


_FIELDS = frozenset(_default_gpu(0, 1))


def _scalar(key: str, value: Any) -> str:
    text = str(int(value)) if isinstance(value, bool) else str(value)
    if "\n" in text or "\r" in text:
        raise ValueError(f"fake NVML value for {key!r} contains a newline")
    return text


def _proc(p: Sequence[Any]) -> str:
    pid, used, *rest = p
    return ":".join([str(pid), "-" if used is None else str(used), *map(str, rest)])


def _gpu_lines(i: int, g: dict[str, Any]) -> Iterable[str]:
    pre = f"gpu.{i}."
    for key, val in g.items():
        if key == "violation":
            yield from (f"{pre}violation.{p}={ns}" for p, ns in sorted(val.items()))
        elif key == "nvlink_err":
            yield from (f"{pre}nvlink_err.{link}.{ctr}={n}" for (link, ctr), n in sorted(val.items()))
        elif key == "mig":
            for slot, d in sorted(val.items()):
                for k, v in d.items():
                    if k == "gpm":
                        yield from (f"{pre}mig.{slot}.gpm.{m}={x!r}" for m, x in sorted(v.items()))
                    else:
                        yield f"{pre}mig.{slot}.{k}={_scalar(k, v)}"
        elif key == "gpm":
            yield from (f"{pre}gpm.{m}={float(x)!r}" for m, x in sorted(val.items()))
        elif key == "gpm_fail":
            yield from (f"{pre}gpm_fail.{m}={code}" for m, code in sorted(val.items()))
        elif key == "proc_util":
            yield f"{pre}{key}=" + ",".join(":".join(str(int(x)) for x in smp) for smp in val)
        elif key in ("procs", "graphics_procs", "mps_procs"):
            yield f"{pre}{key}=" + ",".join(_proc(p) for p in val)
        elif key in ("retired_sbe", "retired_dbe"):
            yield f"{pre}{key}=" + ",".join(f"{a}@{t}" for a, t in val)
        elif key == "nvlink_active":
            yield f"{pre}{key}=" + ",".join(str(int(x)) for x in val)
        elif key == "unsupported":
            yield f"{pre}{key}=" + ",".join(val)
        else:
            yield f"{pre}{key}={_scalar(key, val)}"


class FakeNvml:
    """A fleet of fake GPUs behind the fake ``libnvidia-ml.so.1``; every mutator rewrites the file.

    Raw values live in ``self.gpus[i]`` (a dict keyed like the file, NVML units), globals in
    ``self.globals``, injected codes in ``self.fails`` / ``self.field_fails``, XID events in
    ``self.events`` as ``(seq, gpu, xid)``.  Edit them directly and call ``write()``, or use the
    methods.  ``**defaults`` override fields on every GPU (e.g. ``FakeNvml(p, fans=1)``).
    """

    SUCCESS = SUCCESS
    UNINITIALIZED = UNINITIALIZED
    INVALID_ARGUMENT = INVALID_ARGUMENT
    NOT_SUPPORTED = NOT_SUPPORTED
    NO_PERMISSION = NO_PERMISSION
    NOT_FOUND = NOT_FOUND
    INSUFFICIENT_SIZE = INSUFFICIENT_SIZE
    DRIVER_NOT_LOADED = DRIVER_NOT_LOADED
    TIMEOUT = TIMEOUT
    FUNCTION_NOT_FOUND = FUNCTION_NOT_FOUND
    GPU_IS_LOST = GPU_IS_LOST
    ARGUMENT_VERSION_MISMATCH = ARGUMENT_VERSION_MISMATCH
    UNKNOWN = UNKNOWN

    def __init__(self, path: Path | str, gpus: int = 8, *, omit: Sequence[str] = (), **defaults: Any) -> None:
        if not 0 <= gpus <= MAX_GPUS:
            raise ValueError(f"gpus={gpus} is outside 0..{MAX_GPUS}")
        self._check_fields(defaults)
        self.path = Path(path).resolve()
        self.omit = tuple(omit)
        for name in self.omit:
            _check_function(name)
        self.defaults = dict(defaults)
        self.globals: dict[str, Any] = {
            # A new token resets the library's "already delivered" XID state (one per fleet).
            "fleet": uuidlib.uuid4().hex[:16],
            "count": gpus,
            "driver_version": "550.54.15",
            "nvml_version": "12.550.54.15",
            "cuda_version": 12040,
        }
        self.gpus: list[dict[str, Any]] = [self._new_gpu(i, gpus) for i in range(gpus)]
        self.fails: dict[tuple[str, int | None], int] = {}
        self.field_fails: dict[tuple[int, int | None], int] = {}
        self.topology: dict[tuple[int, int], int] = {}
        self.p2p: dict[tuple[int, int, int], int] = {}
        self.events: list[tuple[int, int, int]] = []
        self.generation = 0
        self._lock = threading.Lock()
        self._last_mtime_ns = 0
        self._gen = self._map_gen()
        self.write()

    # ---- loading ----

    @property
    def library(self) -> Path:
        """Path of the built ``libnvidia-ml.so.1`` (with this fleet's ``omit`` list)."""
        return build_library(self.omit)

    def env(self) -> dict[str, str]:
        """Variables to merge into a subprocess environment so its pynvml uses this fleet."""
        return {"LD_LIBRARY_PATH": str(self.library.parent), "FAKE_NVML_CONFIG": str(self.path)}

    def activate(self) -> None:
        """Load the fake into this process and point ``FAKE_NVML_CONFIG`` at this fleet."""
        if self.omit:
            raise ValueError("a fleet with omit= needs a subprocess (one build per process): use env()")
        load_in_process(self.library)
        os.environ["FAKE_NVML_CONFIG"] = str(self.path)

    # ---- mutators ----

    def set(self, gpu: int, **fields: Any) -> None:
        """Set raw per-GPU fields, e.g. ``set(3, power_mw=250_000, temp_gpu=71)``."""
        self._check_gpu(gpu)
        self._check_fields(fields)
        self.gpus[gpu].update(fields)
        self.write()

    def set_global(self, **fields: Any) -> None:
        """Set ``driver_version`` / ``nvml_version`` / ``cuda_version``."""
        bad = sorted(set(fields) - _GLOBAL_KEYS)
        if bad:
            raise ValueError(f"unknown fake NVML global field {bad[0]!r} (known: {sorted(_GLOBAL_KEYS)})")
        self.globals.update(fields)
        self.write()

    def set_count(self, n: int) -> None:
        """Change what nvmlDeviceGetCount reports; new GPUs get defaults, removed ones keep theirs."""
        if not 0 <= n <= MAX_GPUS:
            raise ValueError(f"count {n} is outside 0..{MAX_GPUS}")
        while len(self.gpus) < n:
            self.gpus.append(self._new_gpu(len(self.gpus), n))
        self.globals["count"] = n
        self.write()

    def fail(self, function: str, code: int, gpu: int | None = None) -> None:
        """Make ``function`` return ``code`` on ``gpu`` (``None``: every GPU / non-device function)."""
        _check_function(function)
        if gpu is not None:
            self._check_gpu(gpu)
        self.fails[(function, gpu)] = code
        self.write()

    def clear_fail(self, function: str | None = None, gpu: int | None = None) -> None:
        """Remove injected codes matching ``function`` and ``gpu`` (``None`` matches anything).

        ``function=None`` also removes ``fail_field`` and ``fail_gpm`` entries (of ``gpu``, or all).
        """
        self.fails = {
            (f, g): c for (f, g), c in self.fails.items()
            if not ((function is None or f == function) and (gpu is None or g == gpu))
        }
        self.field_fails = {
            (f, g): c for (f, g), c in self.field_fails.items() if not (function is None and (gpu is None or g == gpu))
        }
        if function is None:
            for i, g in enumerate(self.gpus):
                if gpu is None or i == gpu:
                    g["gpm_fail"] = {}
        self.write()

    def hang(self, function: str, gpu: int | None = None) -> None:
        """Make ``function`` block (on ``gpu``; ``None``: every GPU / a system function) until :meth:`release`:
        what NVML does while a GPU falls off the bus. Blocked calls go on with what the file says then."""
        self.fail(function, HANG, gpu)

    def release(self, function: str, gpu: int | None = None) -> None:
        """End :meth:`hang`: the blocked call returns within a few milliseconds."""
        self.clear_fail(function, gpu)

    @staticmethod
    def hanging() -> int:
        """Calls blocked in an injected hang now (in this process's library)."""
        lib = load_in_process(build_library())
        lib.fakeNvmlHanging.restype = ctypes.c_int
        return int(lib.fakeNvmlHanging())

    @staticmethod
    def device_calls(gpu: int) -> int:
        """Every call the library received for GPU ``gpu`` (its MIG handles included) in this process."""
        lib = load_in_process(build_library())
        lib.fakeNvmlDeviceCalls.restype = ctypes.c_ulong
        lib.fakeNvmlDeviceCalls.argtypes = [ctypes.c_int]
        return int(lib.fakeNvmlDeviceCalls(gpu))

    def fail_field(self, field_id: int, code: int, gpu: int | None = None) -> None:
        """Make field ``field_id`` of nvmlDeviceGetFieldValues report ``code`` in its nvmlReturn."""
        if gpu is not None:
            self._check_gpu(gpu)
        self.field_fails[(field_id, gpu)] = code
        self.write()

    def unsupported(self, gpu: int, *functions: str) -> None:
        """Add NVML functions that return NOT_SUPPORTED on ``gpu``."""
        for f in functions:
            _check_function(f)
        self.set(gpu, unsupported=sorted({*self.gpus[gpu]["unsupported"], *functions}))

    def lose(self, gpu: int) -> None:
        """GPU fell off the bus: every call about it returns 15 (NVML_ERROR_GPU_IS_LOST)."""
        self.set(gpu, lost=1)

    def restore(self, gpu: int) -> None:
        """Undo ``lose``."""
        self.set(gpu, lost=0)

    def queue_xid(self, gpu: int, xid: int) -> int:
        """Queue an XID critical-error event (delivered once per process); returns its sequence number."""
        self._check_gpu(gpu)
        seq = (self.events[-1][0] if self.events else 0) + 1
        if seq > MAX_SEQ or len(self.events) >= MAX_EVENTS:
            raise ValueError(f"too many queued XID events for the fake NVML (limit {MAX_EVENTS})")
        self.events.append((seq, gpu, xid))
        self.write()
        return seq

    def set_topology(self, a: int, b: int, level: int) -> None:
        """Override nvmlDeviceGetTopologyCommonAncestor for the pair (both orders)."""
        self._check_gpu(a)
        self._check_gpu(b)
        self.topology[(a, b)] = self.topology[(b, a)] = level
        self.write()

    def set_p2p(self, a: int, b: int, status: int, index: int | None = None) -> None:
        """Override nvmlDeviceGetP2PStatus for the pair (both orders), one index or all (0..4)."""
        self._check_gpu(a)
        self._check_gpu(b)
        for idx in range(5) if index is None else (index,):
            self.p2p[(a, b, idx)] = self.p2p[(b, a, idx)] = status
        self.write()

    def add_mig(self, gpu: int, slot: int, profile: str = "1g.10gb", *, gi: int, ci: int = 0,
                mem_total: int = 10_200_547_328, mem_used: int = 0, mem_reserved: int = 0,
                uuid: str | None = None, gpm: dict[int, float] | None = None) -> str:
        """Create MIG device ``slot`` on ``gpu`` (turns MIG mode on); returns its ``MIG-`` UUID.

        ``gpm``: the GPU instance's GPM values (default: the SM metrics, distinct per ``gi``).
        """
        self._check_gpu(gpu)
        if not 0 <= slot < MAX_MIG:
            raise ValueError(f"MIG slot {slot} is outside 0..{MAX_MIG - 1}")
        mig_uuid = uuid or f"MIG-{gpu:04x}{slot:04x}-7b3c-5d2e-9f1a-{gi:06x}{ci:06x}"
        self.gpus[gpu]["mig"][slot] = {
            "profile": profile, "uuid": mig_uuid, "gi": gi, "ci": ci,
            "mem_total": mem_total, "mem_reserved": mem_reserved, "mem_used": mem_used,
            "gpm": dict(_default_gpm(gi, 60.0 + gi, 30.0 + gi) if gpm is None else gpm),
        }
        self.set(gpu, mig_mode=1, mig_pending=1)
        return mig_uuid

    def set_gpm(self, gpu: int, metric: int, value: float | None, *, mig_slot: int | None = None) -> None:
        """Set GPM ``metric`` (an ``NVML_GPM_METRIC_*`` id) of ``gpu`` or of its MIG slot; ``None``
        removes it (the metric then answers NOT_SUPPORTED)."""
        self._check_gpu(gpu)
        if not 0 < metric < GPM_METRIC_MAX:
            raise ValueError(f"GPM metric id {metric} is outside 1..{GPM_METRIC_MAX - 1}")
        if mig_slot is not None and mig_slot not in self.gpus[gpu]["mig"]:
            raise ValueError(f"GPU {gpu} has no MIG slot {mig_slot}")
        table = self.gpus[gpu]["gpm"] if mig_slot is None else self.gpus[gpu]["mig"][mig_slot]["gpm"]
        if value is None:
            table.pop(metric, None)
        else:
            table[metric] = float(value)
        self.write()

    def fail_gpm(self, metric: int, code: int, gpu: int | None = None) -> None:
        """Make GPM ``metric`` report ``code`` in its own nvmlReturn (on ``gpu``, or every GPU)."""
        for i in range(len(self.gpus)) if gpu is None else (gpu,):
            self._check_gpu(i)
            self.gpus[i]["gpm_fail"][metric] = code
        self.write()

    def write(self) -> None:
        """Atomically replace the fleet file; its mtime strictly increases on every write."""
        with self._lock:
            self.generation += 1
            text = "\n".join(self._lines()) + "\n"
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(text)
            ns = max(time.time_ns(), self._last_mtime_ns + 1)
            self._last_mtime_ns = ns
            os.utime(tmp, ns=(ns, ns))
            os.replace(tmp, self.path)
            # After the rename: a reader that sees the new counter then finds the new file.
            (count,) = struct.unpack_from("=Q", self._gen, 0)
            struct.pack_into("=Q", self._gen, 0, count + 1)

    # ---- helpers ----

    def _map_gen(self) -> mmap.mmap:
        """Map ``<file>.gen``, reusing an existing one: a library may already have it mapped."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".gen"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < 8:
                os.ftruncate(fd, 8)
            return mmap.mmap(fd, 8)
        finally:
            os.close(fd)

    def _new_gpu(self, i: int, n: int) -> dict[str, Any]:
        g = _default_gpu(i, n)
        g.update({k: (v.copy() if isinstance(v, dict | list) else v) for k, v in self.defaults.items()})
        return g

    def _check_gpu(self, gpu: int) -> None:
        if not 0 <= gpu < len(self.gpus):
            raise ValueError(f"GPU {gpu} is not in this fake fleet of {len(self.gpus)}")

    @staticmethod
    def _check_fields(fields: dict[str, Any]) -> None:
        bad = sorted(set(fields) - _FIELDS)
        if bad:
            raise ValueError(f"unknown fake NVML GPU field {bad[0]!r}")

    def _lines(self) -> Iterable[str]:
        yield "# fake NVML fleet, written by tests/fakes/fakenvml.py; format: tests/fakes/fake_nvml/fake_nvml.c"
        yield f"generation={self.generation}"
        yield from (f"{k}={_scalar(k, v)}" for k, v in self.globals.items())
        for (fn, gpu), code in self.fails.items():
            yield f"fail.{fn}={code}" if gpu is None else f"gpu.{gpu}.fail.{fn}={code}"
        for (fid, gpu), code in self.field_fails.items():
            yield f"field_fail.{fid}={code}" if gpu is None else f"gpu.{gpu}.field_fail.{fid}={code}"
        yield from (f"topo.{a}.{b}={lvl}" for (a, b), lvl in self.topology.items())
        yield from (f"p2p.{a}.{b}.{i}={st}" for (a, b, i), st in self.p2p.items())
        yield from (f"xid.{seq}={gpu}:{xid}" for seq, gpu, xid in self.events)
        for i, g in enumerate(self.gpus):
            yield from _gpu_lines(i, g)


def time_slicing(fake: FakeNvml, gpu: int, procs: Sequence[tuple[int, int | None, int | None]]) -> None:
    """GPU ``gpu`` shared by time-slicing: ``procs`` are (pid, used bytes, SM percent or None for
    no utilisation sample); every process is in the compute list and has its own samples."""
    fake.set(gpu, procs=[(pid, used) for pid, used, _ in procs],
             proc_util=[(pid, sm) for pid, _, sm in procs if sm is not None], mps_procs=[])


def mps(fake: FakeNvml, gpu: int, server: int, clients: Sequence[tuple[int, int | None, int | None]]) -> None:
    """GPU ``gpu`` shared through MPS: the compute list holds the MPS server ``server``; the
    clients (pid, used bytes, SM percent or None) are in the MPS list, with samples where given."""
    fake.set(gpu, procs=[(server, 0)], mps_procs=[(pid, used) for pid, used, _ in clients],
             proc_util=[(pid, sm) for pid, _, sm in clients if sm is not None])


def make_sysfs(root: Path, devices: list[tuple[str, int, int]]) -> Path:
    """Create ``root/bus/pci/devices/<addr>/{vendor,class}`` like Linux sysfs; returns the devices dir.

    ``devices``: ``(address, vendor, class)``, e.g. ``("0000:18:00.0", 0x10DE, 0x030200)``
    (0x030200 3D controller, 0x030000 VGA).  Files hold ``0x10de\\n`` / ``0x030200\\n``.
    """
    base = root / "bus" / "pci" / "devices"
    base.mkdir(parents=True, exist_ok=True)
    for addr, vendor, cls in devices:
        d = base / addr
        d.mkdir(parents=True, exist_ok=True)
        (d / "vendor").write_text(f"0x{vendor:04x}\n")
        (d / "class").write_text(f"0x{cls:06x}\n")
    return base


def sysfs_address(bus_id: str) -> str:
    """NVML bus id ``00000000:18:00.0`` -> sysfs name ``0000:18:00.0`` (lower case)."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"
