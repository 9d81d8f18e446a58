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

Extending with a new NVML symbol: see "ADDING A SYMBOL" at the top of fake_nvml.c; a new
per-GPU value also needs its default in ``_default_gpu`` below.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
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

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fake_nvml" / "fake_nvml.c"
BUILD_ROOT = HERE / ".build"
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

# Limits of the C side.
MAX_GPUS = 64
MAX_MIG = 8
MAX_EVENTS = 1024
MAX_SEQ = 65535

XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError

# DGX H100 PCI bus numbers of GPUs 0-7; further GPUs repeat them in the next PCI domain.
_DGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_GIB = 1 << 30

# Per-GPU keys whose values are not scalars.
_COMPOUND = {"violation", "nvlink_active", "nvlink_err", "retired_sbe", "retired_dbe", "procs",
             "graphics_procs", "mig", "unsupported"}
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
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + repr((omit, CFLAGS)).encode()).hexdigest()[:16]
    out_dir = BUILD_ROOT / f"fakenvml-{key}"
    lib = out_dir / SONAME
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    ignore = BUILD_ROOT / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    # A private temp name, then an atomic rename: parallel test processes never see half a file.
    tmp = out_dir / f".{SONAME}.{os.getpid()}.{threading.get_ident()}.tmp"
    cmd = [os.environ.get("CC", "gcc"), *CFLAGS, *(f"-DOMIT_{n}" for n in omit), "-o", str(tmp), str(SOURCE)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"building the fake NVML failed ({' '.join(cmd)}):\n{proc.stderr}")
    os.replace(tmp, lib)
    return lib


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
                yield from (f"{pre}mig.{slot}.{k}={_scalar(k, v)}" for k, v in d.items())
        elif key in ("procs", "graphics_procs"):
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

        ``function=None`` also removes ``fail_field`` entries (of ``gpu``, or all).
        """
        self.fails = {
            (f, g): c for (f, g), c in self.fails.items()
            if not ((function is None or f == function) and (gpu is None or g == gpu))
        }
        self.field_fails = {
            (f, g): c for (f, g), c in self.field_fails.items() if not (function is None and (gpu is None or g == gpu))
        }
        self.write()

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
                uuid: str | None = None) -> str:
        """Create MIG device ``slot`` on ``gpu`` (turns MIG mode on); returns its ``MIG-`` UUID."""
        self._check_gpu(gpu)
        if not 0 <= slot < MAX_MIG:
            raise ValueError(f"MIG slot {slot} is outside 0..{MAX_MIG - 1}")
        mig_uuid = uuid or f"MIG-{gpu:04x}{slot:04x}-7b3c-5d2e-9f1a-{gi:06x}{ci:06x}"
        self.gpus[gpu]["mig"][slot] = {
            "profile": profile, "uuid": mig_uuid, "gi": gi, "ci": ci,
            "mem_total": mem_total, "mem_reserved": mem_reserved, "mem_used": mem_used,
        }
        self.set(gpu, mig_mode=1, mig_pending=1)
        return mig_uuid

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
