"""Simulated GPUs for demos, dashboards and tests on machines without a GPU.

Never chosen silently: ``--backend simulated``, or ``--backend auto --allow-simulated``
(``make run``), which logs a warning. ``gpu_info`` carries ``backend="simulated"``.

Load patterns: a healthy GPU ``i`` follows ``PATTERNS[i % 5]``:

- ``idle``: ~0 % utilisation, little memory;
- ``steady``: ~70 % utilisation with small noise;
- ``periodic``: a training loop, 45 s busy / 15 s eval-and-checkpoint, period 60 s;
- ``bursty``: random bursts in 5 s slots, no period;
- ``leak``: moderate load while memory used grows ~32 MiB/s until it wraps (a restart).

Scenarios (``--simulated-scenario``) put GPUs into the states a real fleet shows, each
through the same readings (and so the same metric families) as a real GPU in that state:
GPU ``i`` of a scenario is in state ``STATES[scenario][i]``; GPUs past the list are healthy.
Times are seconds since the backend started (``dt``):

- ``lost``: answers like NVML's ``GPU_IS_LOST`` from ``dt`` = 2 s: ``up`` False with its
  identity kept, XID 79, one ``gpu_lost`` collection error per collection. The bus also holds
  one GPU more than the library enumerates (it failed to initialise):
  ``gpu_pci_devices`` > ``gpu_visible_devices``.
- ``mig``: MIG mode on, four instances (3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb) with their own
  memory and utilisation; the parent reports no utilisation of its own (NVML in MIG mode).
- ``ecc``: corrected ECC errors every 5 s; uncorrected ones at 2 s and every 120 s after,
  each with XID 94 and a row remap that stays pending until a reset; the first remap
  succeeds (XID 63), later ones fail (XID 64, ``remapped_rows_failed`` 1).
- ``xid``: application XIDs 13 and 31 recurring, and XID 119 (GSP RPC timeout) at 3 s and
  every 10 minutes.
- ``thermal``: full load at 92-94 degC, software and hardware thermal slowdown and
  HW slowdown active, clocks held at 1110 MHz, thermal violation time growing.
- ``power_cap``: full load at the power limit, ``sw_power_cap`` active, power violation time
  growing.
- ``leak``: memory used grows 128 MiB/s from 40 GiB to 96 % (about 5 minutes), then keeps
  creeping at 1 MiB/s up to 99 % (about 40 more minutes), where it stays (the leaking job keeps
  it while its allocations fail): nearly full soon, and still growing over a profiler window.
- ``starved`` (in ``mixed``): over 90 % utilisation while only ~12 % of the SMs are active
  (GPM SM activity): small kernels or an input-bound loop.
- ``driver`` (a scenario of its own): from ``dt`` = 2 s the driver stops answering at all,
  as after an unload or a half-finished upgrade (NVML's ``nvmlDeviceGetCount`` failing):
  every collection fails as a whole with a ``driver`` error, so the engine publishes
  ``gpu_exporter_collector_success 0`` and the GPUs it knew as ``gpu_up 0``.

In the ``healthy`` scenario the output is what it always was, plus the default power limit
(700 W) and compute mode (0, default). In every other scenario each GPU that answers also
reports ECC mode and counters, row remapping, the driver's recovery action (1, GPU reset,
while a row remap is pending), violation time and MIG mode, as an NVML datacentre GPU does,
and from the second collection GPM SM activity (MIG instances: tensor activity too), so a
faulty GPU stands out against healthy neighbours.

Byte values are whole numbers (memory in whole MiB, as drivers report it). :class:`Model`
is a pure function of time (and of the start time), so the demo can backfill history
from the same model as the live exporter.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from exporter.backends.base import DRIVER, Backend, BackendError
from exporter.core.options import BackendOptions
from exporter.core.readings import Collection, GpuReading, MigReading, PeerReading

PATTERNS = ("idle", "steady", "periodic", "bursty", "leak")
PERIOD_SECONDS = 60.0
MIB, GIB = 2**20, 2**30
LEAK_BYTES_PER_SECOND = 32 * MIB
MEMORY_TOTAL = 80 * GIB
MEMORY_RESERVED = 512 * MIB
POWER_IDLE_W, POWER_MAX_W = 70.0, 700.0
_EPOCH = time.time()
_M64 = 2**64 - 1

HEALTHY, LOST, MIG, ECC, XID, THERMAL, POWER_CAP, LEAK, STARVED = (
    "healthy", "lost", "mig", "ecc", "xid", "thermal", "power_cap", "leak", "starved")
# scenario -> the state of GPU 0, 1, ...; GPUs past the list are healthy
STATES: dict[str, tuple[str, ...]] = {
    "healthy": (),
    "lost": (LOST,),
    "mig": (MIG,),
    "ecc": (ECC,),
    "xid": (XID,),
    "throttle": (THERMAL, POWER_CAP),
    "leak": (LEAK,),
    # the four most distinct first: the default four GPUs show a MIG GPU, ECC errors, heat and a lost GPU
    "mixed": (MIG, ECC, THERMAL, LOST, XID, LEAK, POWER_CAP, STARVED, HEALTHY),
    "driver": (),  # no GPU state: the whole driver stops answering (DRIVER_GONE_AFTER)
}
SCENARIOS = tuple(STATES)

LOST_AFTER = 2.0  # s after start
DRIVER_GONE_AFTER = 2.0  # s after start, in the "driver" scenario
LEAK_START = 40 * GIB
LEAK_FAST_BYTES_PER_SECOND = 128 * MIB
LEAK_PLATEAU = int(0.96 * MEMORY_TOTAL) // MIB * MIB  # under 5 % free: GPUMemoryNearlyFull
LEAK_CREEP_BYTES_PER_SECOND = 1 * MIB  # then the leak goes on, slower (a growing pattern for the profiler)
LEAK_CEILING = int(0.99 * MEMORY_TOTAL) // MIB * MIB
# clock event reasons active in a throttled state
SLOWDOWN: dict[str, tuple[str, ...]] = {"thermal": ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown"),
                                        "power_cap": ("sw_power_cap",)}
# (profile, gpu instance id, memory MiB, load pattern): an 80 GB GPU's seven slices
MIG_LAYOUT = (("3g.40gb", 2, 40448, "steady"), ("2g.20gb", 3, 19968, "periodic"),
              ("1g.10gb", 9, 9856, "bursty"), ("1g.10gb", 10, 9856, "idle"))
# nvidia-smi's clocks_event_reasons, as the NVML backend names them
THROTTLE_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
                    "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
                    "display_clock_setting")
VIOLATIONS = ("power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability")
# XID events of a state: (code, first at dt, repeat every s; 0: once)
XID_EVENTS: dict[str, tuple[tuple[str, float, float], ...]] = {
    LOST: (("79", LOST_AFTER, 0.0),),
    XID: (("13", 1.0, 40.0), ("31", 20.0, 90.0), ("119", 3.0, 600.0)),
}
ECC_UNCORRECTED_AT, ECC_UNCORRECTED_EVERY, ECC_CORRECTED_EVERY = 2.0, 120.0, 5.0
ECC_HISTORY = {"corrected": 120, "uncorrected": 3}  # lifetime (aggregate) errors before this boot


def _noise(index: int, slot: int, salt: str = "") -> float:
    """Deterministic pseudo-random number in [0, 1) for (gpu, time slot): splitmix64.

    (Not hashlib: it loads OpenSSL's libcrypto, megabytes of RSS for a demo backend.)
    """
    x = (index * 0x9E3779B97F4A7C15 + slot * 0xBF58476D1CE4E5B9 + sum(map(ord, salt)) * 0x94D049BB133111EB) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return (x ^ (x >> 31)) / 2**64


def _whole_mib(n: float) -> float:
    """Bytes rounded down to whole MiB (drivers report memory in MiB pages): never a fractional byte."""
    return float(int(n) // MIB * MIB)


def pattern_of(index: int) -> str:
    return PATTERNS[index % len(PATTERNS)]


def _pattern_utilization(pattern: str, key: int, t: float) -> float:
    n = _noise(key, int(t))
    if pattern == "idle":
        return 0.0 if n < 0.9 else 0.01
    if pattern == "steady":
        return 0.70 + 0.04 * (n - 0.5)
    if pattern == "periodic":
        phase = t % PERIOD_SECONDS
        return (0.95 if phase < 45.0 else 0.10) + 0.03 * (n - 0.5)
    if pattern == "bursty":
        burst = _noise(key, int(t // 5), "burst")
        return min(1.0, 0.3 + 0.7 * burst) if burst > 0.6 else 0.05 + 0.05 * n
    return 0.35 + 0.05 * (n - 0.5)  # leak


def _pattern_memory(pattern: str, index: int, t: float) -> float:
    if pattern == "idle":
        return float(512 * MIB)
    if pattern == "leak":
        span = 0.85 * MEMORY_TOTAL - 8 * GIB
        return _whole_mib(8 * GIB + (LEAK_BYTES_PER_SECOND * (t - _EPOCH)) % span)
    u = _pattern_utilization(pattern, index, t)
    base = {"steady": 40, "periodic": 60, "bursty": 20}[pattern] * GIB
    return _whole_mib(base + u * 8 * GIB)


def _events(state: str, dt: float) -> dict[str, tuple[int, float]]:
    """XID code -> (events up to ``dt``, dt of the last one) for a GPU in ``state``."""
    out: dict[str, tuple[int, float]] = {}
    for code, first, every in XID_EVENTS.get(state, ()):
        if dt >= first:
            n = 1 if every == 0 else 1 + int((dt - first) // every)
            out[code] = (n, first + (n - 1) * every)
    if state == ECC:
        n = _uncorrected(dt)
        if n:
            last = ECC_UNCORRECTED_AT + (n - 1) * ECC_UNCORRECTED_EVERY
            out["94"] = (n, last)  # contained uncorrectable ECC error
            out["63"] = (1, ECC_UNCORRECTED_AT)  # row remapping recorded
            if n > 1:
                out["64"] = (n - 1, last)  # row remapping failure
    return out


def _uncorrected(dt: float) -> int:
    return 0 if dt < ECC_UNCORRECTED_AT else 1 + int((dt - ECC_UNCORRECTED_AT) // ECC_UNCORRECTED_EVERY)


@dataclass(frozen=True)
class Model:
    """The simulated fleet of one scenario, as pure functions of unix time ``t``.

    ``t0`` is when the backend started: faults develop from then (a GPU is lost 2 s after it,
    a leak fills memory from it). The demo backfills history from the same model.
    """

    scenario: str = "healthy"
    count: int = 4
    t0: float = _EPOCH

    def state(self, index: int) -> str:
        states = STATES[self.scenario]
        return states[index] if index < len(states) else HEALTHY

    def pattern(self, index: int) -> str:
        """The load pattern of a GPU that reports one: its index's, except that a GPU in a fault
        state (XID, ECC) runs a steady job: it shows its fault, not the healthy leak pattern."""
        p = pattern_of(index)
        return "steady" if p == "leak" and self.state(index) != HEALTHY else p

    def up(self, index: int, t: float) -> bool:
        return not (self.state(index) == LOST and t - self.t0 >= LOST_AFTER)

    def driver_answers(self, t: float) -> bool:
        return not (self.scenario == "driver" and t - self.t0 >= DRIVER_GONE_AFTER)

    def utilization(self, index: int, t: float) -> float | None:
        """Utilisation ratio; None where the GPU reports none (lost, or MIG mode: per instance only)."""
        state = self.state(index)
        if not self.up(index, t) or state == MIG:
            return None
        n = _noise(index, int(t), "load")
        if state == THERMAL:
            return 0.97 + 0.02 * (n - 0.5)
        if state == POWER_CAP:
            return 0.985 + 0.02 * (n - 0.5)
        if state == STARVED:
            return 0.93 + 0.04 * (n - 0.5)
        if state == LEAK:
            return _pattern_utilization("leak", index, t)
        return _pattern_utilization(self.pattern(index), index, t)

    def mig_instances(self, index: int, t: float) -> list[MigReading]:
        if self.state(index) != MIG or not self.up(index, t):
            return []
        out = []
        for k, (profile, gi, mib, pattern) in enumerate(MIG_LAYOUT):
            u = _pattern_utilization(pattern, 1000 * (index + 1) + k, t)
            used = 12 * MIB if pattern == "idle" else _whole_mib(mib * MIB * (0.25 + 0.6 * u))
            out.append(MigReading(gpu_instance_id=gi, compute_instance_id=0,
                                  uuid=f"MIG-5140a7ed-{index:04d}-4000-8000-{k:012d}", profile=profile,
                                  memory_total_bytes=float(mib * MIB), memory_used_bytes=float(used),
                                  utilization_ratio=u))
        return out

    def load(self, index: int, t: float) -> float:
        """The GPU's busy fraction, whatever it reports (power and heat follow it)."""
        u = self.utilization(index, t)
        if u is not None:
            return u
        mig = self.mig_instances(index, t)
        slices = sum(int(m.profile[0]) for m in mig if m.profile)
        return sum(int(m.profile[0]) * (m.utilization_ratio or 0.0) for m in mig if m.profile) / (slices or 1)

    def memory_used(self, index: int, t: float) -> float | None:
        """Memory used in bytes, whole MiB; None when the GPU is lost."""
        if not self.up(index, t):
            return None
        state = self.state(index)
        if state == LEAK:
            dt = max(0.0, t - self.t0)
            fast = LEAK_START + LEAK_FAST_BYTES_PER_SECOND * dt
            if fast <= LEAK_PLATEAU:
                return _whole_mib(fast)
            creep = (dt - (LEAK_PLATEAU - LEAK_START) / LEAK_FAST_BYTES_PER_SECOND) * LEAK_CREEP_BYTES_PER_SECOND
            return _whole_mib(min(LEAK_CEILING, LEAK_PLATEAU + creep))
        if state == MIG:
            return float(sum(m.memory_used_bytes or 0.0 for m in self.mig_instances(index, t)))
        if state in (THERMAL, POWER_CAP):
            return _whole_mib((52 + 4 * _noise(index, int(t), "mem")) * GIB)
        return _pattern_memory(self.pattern(index), index, t)

    def sm_active(self, index: int, t: float) -> float | None:
        """The whole GPU's SM activity (GPM), 0-1; None for a MIG GPU (per instance) or a lost one."""
        if not self.up(index, t) or self.state(index) == MIG:
            return None
        return round(0.12 if self.state(index) == STARVED else 0.85 * self.load(index, t), 4)

    def xid_counts(self, index: int, t: float) -> dict[str, int]:
        """XID code -> events since the start, at ``t`` (the exporter's gpu_xid_errors_total)."""
        return {code: n for code, (n, _) in _events(self.state(index), t - self.t0).items()}

    def ecc_uncorrected(self, index: int, t: float) -> int:
        """Uncorrectable ECC errors since the start (volatile), at ``t``."""
        return _uncorrected(t - self.t0) if self.state(index) == ECC else 0

    def pci_devices(self) -> int:
        """GPUs on the simulated PCI bus: one more than enumerated when the scenario has a lost GPU."""
        return self.count + (1 if LOST in STATES[self.scenario][: self.count] else 0)


def _driver_gone() -> BackendError:
    return BackendError("simulated: the driver stopped answering (as NVML's nvmlDeviceGetCount after a driver "
                        "unload)", kind=DRIVER)


class SimulatedBackend(Backend):
    """Deterministic, realistic-looking readings; ``vendor`` is "simulated"."""

    name: ClassVar[str] = "simulated"
    vendor: ClassVar[str] = "simulated"
    #: the families this backend fills (docs/metrics.md's support table; the contract test checks it)
    families: ClassVar[frozenset[str]] = frozenset({
        "gpu_utilization_ratio", "gpu_memory_utilization_ratio", "gpu_memory_total_bytes", "gpu_memory_used_bytes",
        "gpu_memory_free_bytes", "gpu_memory_reserved_bytes", "gpu_temperature_celsius", "gpu_power_watts",
        "gpu_power_limit_watts", "gpu_energy_joules_total", "gpu_performance_state", "gpu_clock_hertz",
        "gpu_clock_max_hertz", "gpu_pcie_link_generation", "gpu_pcie_link_generation_max", "gpu_pcie_link_width",
        "gpu_pcie_link_width_max", "gpu_throttle_reason_active", "gpu_power_default_limit_watts", "gpu_compute_mode",
        "gpu_recovery_action", "gpu_p2p_supported", "gpu_topology_level",
        "gpu_pci_devices", "gpu_visible_devices",  # the simulated bus (issue 28: the table said no)
    })
    auto_priority: ClassVar[int | None] = None  # never part of --backend auto

    def __init__(self, options: BackendOptions | None = None, clock: Callable[[], float] = time.time) -> None:
        super().__init__(options)
        self.clock = clock  # unix seconds; tests pass their own to step through a scenario
        self._started: float | None = None  # the first init: when the scenario's faults start

    def init(self) -> None:
        # faults develop from the first start: a re-initialisation after a failed collection
        # (the engine's retry) finds the same driver, not a fresh one
        if self._started is None:
            self._started = self.clock()
        self.model = Model(self.options.simulated_scenario, self.options.simulated_gpus, self._started)
        if not self.model.driver_answers(self.clock()):
            raise _driver_gone()
        self._count = self.options.simulated_gpus
        self._energy = [0.0] * self._count
        self._violation = [dict.fromkeys(VIOLATIONS, 0.0) for _ in range(self._count)]
        self._last_t: float | None = None
        self._collections = 0
        self._peers = [  # static, like a real topology: the same list every collection
            PeerReading(gpu=a, peer=b, p2p={"read": 1.0, "write": 1.0, "nvlink": 1.0},
                        topology_level="single", topology_level_value=10.0)
            for a in range(self._count) for b in range(self._count) if a != b
        ]

    def collect(self, out: Collection) -> None:
        now = self.clock()
        dt = 0.0 if self._last_t is None else max(0.0, now - self._last_t)
        self._last_t = now
        since = now - self.model.t0
        if not self.model.driver_answers(now):
            raise _driver_gone()
        for i in range(self._count):
            r = self._reading(i, now, dt)
            if not r.up:
                out.count_error("gpu_lost")
            out.gpus.append(r)
            for code, (n, last) in _events(self.model.state(i), since).items():
                out.xid_counts[(i, r.uuid, code)] = float(n)
                prev = out.xid_last_seconds.get((i, r.uuid), 0.0)
                out.xid_last_seconds[(i, r.uuid)] = max(prev, round(self.model.t0 + last, 3))
        out.peers = self._peers
        out.pci_devices = self.model.pci_devices()
        self._collections += 1

    def _identity(self, i: int) -> GpuReading:
        return GpuReading(index=i, uuid=f"GPU-5140a7ed-0000-4000-8000-{i:012d}", vendor="simulated",
                          name="Simulated GPU", pci_bus_id=f"0000:{0x10 + i:02x}:00.0", serial=f"SIM{i:08d}",
                          driver_version="0.0-simulated", cuda_driver_version=None)

    def _reading(self, i: int, now: float, dt: float) -> GpuReading:
        m = self.model
        state = m.state(i)
        if not m.up(i, now):
            # identity as last seen, as the NVML backend keeps it
            return self._identity(i).down("nvmlDeviceGetUtilizationRates: GPU is lost (simulated)", "gpu_lost")
        r = self._identity(i)
        u = m.utilization(i, now)
        load = m.load(i, now)
        used = m.memory_used(i, now) or 0.0
        power = POWER_IDLE_W + (POWER_MAX_W - POWER_IDLE_W) * load
        temp = 30.0 + 50.0 * load + 2 * _noise(i, int(now), "t")
        sm_clock = (1980 if load > 0.05 else 345) * 1e6
        reasons = dict.fromkeys(THROTTLE_REASONS, 0.0)
        reasons["gpu_idle"] = 1.0 if load < 0.05 else 0.0
        if state == THERMAL:
            power, temp, sm_clock = 480.0 + 10 * _noise(i, int(now), "p"), 92.0 + 2 * _noise(i, int(now), "t"), 1110e6
        elif state == POWER_CAP:
            power, temp, sm_clock = POWER_MAX_W, 80.0 + 2 * _noise(i, int(now), "t"), 1755e6
        for reason in SLOWDOWN.get(state, ()):
            reasons[reason] = 1.0
        self._energy[i] += power * dt
        v = self._violation[i]
        v["power"] += dt * reasons["sw_power_cap"]
        v["thermal"] += dt * max(reasons["sw_thermal_slowdown"], reasons["hw_thermal_slowdown"])
        v["low_utilization"] += dt * reasons["gpu_idle"]

        r.utilization_ratio = u
        r.memory_utilization_ratio = None if u is None else 0.6 * u
        r.memory_total_bytes = float(MEMORY_TOTAL)
        r.memory_used_bytes = used
        r.memory_reserved_bytes = float(MEMORY_RESERVED)
        r.memory_free_bytes = float(MEMORY_TOTAL - used - MEMORY_RESERVED)
        r.temperature_celsius = {"gpu": round(temp, 1), "memory": round(temp + 5.0, 1)}
        r.power_watts = round(power, 3)
        r.power_limit_watts = POWER_MAX_W
        r.power_default_limit_watts = POWER_MAX_W
        r.compute_mode = 0.0  # default (shared)
        r.energy_joules = round(self._energy[i], 3)
        r.clock_hertz = {"graphics": sm_clock, "sm": sm_clock, "memory": 2619e6, "video": 1545e6}
        r.clock_max_hertz = {"graphics": 1980e6, "sm": 1980e6, "memory": 2619e6, "video": 1545e6}
        r.pcie_link_generation = 5.0 if load > 0.05 else 1.0
        r.pcie_link_generation_max = 5.0
        r.pcie_link_width = 16.0
        r.pcie_link_width_max = 16.0
        r.fan_speed_ratio = None  # datacentre GPUs have no fan reading: absent, not 0
        r.performance_state = 0.0 if load > 0.05 else 8.0
        r.throttle_reasons = reasons
        if m.scenario != "healthy":
            self._health(r, i, now, v)
        return r

    def _health(self, r: GpuReading, i: int, now: float, violation: dict[str, float]) -> None:
        """ECC, row remapping, violation time and MIG, as an NVML datacentre GPU reports them."""
        state = self.model.state(i)
        dt = now - self.model.t0
        unc = _uncorrected(dt) if state == ECC else 0
        corr = int(max(0.0, dt) // ECC_CORRECTED_EVERY) if state == ECC else 0
        history = ECC_HISTORY if state == ECC else {"corrected": 0, "uncorrected": 0}
        r.ecc_mode_enabled = 1.0
        r.ecc_errors = {("uncorrected", "volatile"): float(unc),
                        ("uncorrected", "aggregate"): float(unc + history["uncorrected"]),
                        ("corrected", "volatile"): float(corr),
                        ("corrected", "aggregate"): float(corr + history["corrected"])}
        r.remapped_rows = {"corrected": 0.0, "uncorrected": float(min(unc, 1))}
        r.remapped_rows_pending = 1.0 if unc >= 1 else 0.0
        r.remapped_rows_failed = 1.0 if unc >= 2 else 0.0
        r.violation_seconds = {k: round(s, 3) for k, s in violation.items()}
        # a pending row remap needs a GPU reset (nvmlDeviceGpuRecoveryAction_t 1), as the driver says
        r.recovery_action = 1.0 if r.remapped_rows_pending else 0.0
        r.mig_mode_enabled = 1.0 if state == MIG else 0.0
        r.mig = self.model.mig_instances(i, now)
        if self._collections > 0:  # GPM is a rate between two samples: absent on the first collection
            if r.mig:
                r.sm_active_ratio = {str(m.gpu_instance_id): round(0.85 * (m.utilization_ratio or 0.0), 4)
                                     for m in r.mig}
                r.pipe_active_ratio = {("tensor", str(m.gpu_instance_id)): round(0.4 * (m.utilization_ratio or 0.0), 4)
                                       for m in r.mig}
            else:
                sm = self.model.sm_active(i, now)
                r.sm_active_ratio = {} if sm is None else {"": sm}
        if state == MIG:
            r.unsupported.add("gpu_utilization_ratio")  # NVML has no whole-GPU utilisation in MIG mode


BACKEND = SimulatedBackend
