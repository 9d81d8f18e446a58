"""Simulated GPUs for demos, dashboards and tests on machines without a GPU.

Never chosen silently: ``--backend simulated``, or ``--backend auto --allow-simulated``
(``make run``), which logs a warning. ``gpu_info`` carries ``backend="simulated"``.

GPU ``i`` follows pattern ``PATTERNS[i % 5]``:

- ``idle``: ~0 % utilisation, little memory;
- ``steady``: ~70 % utilisation with small noise;
- ``periodic``: a training loop, 45 s busy / 15 s eval-and-checkpoint, period 60 s;
- ``bursty``: random bursts in 5 s slots, no period;
- ``leak``: moderate load while memory used grows ~32 MiB/s until it wraps (a restart).

:func:`utilization_at` and :func:`memory_used_at` are pure functions of time, so the
profiler's demo can backfill history from the same model.
"""

from __future__ import annotations

import time
from typing import ClassVar

from exporter.backends.base import Backend
from exporter.core.readings import Collection, GpuReading, PeerReading

PATTERNS = ("idle", "steady", "periodic", "bursty", "leak")
PERIOD_SECONDS = 60.0
LEAK_BYTES_PER_SECOND = 32 * 2**20
MEMORY_TOTAL = 80 * 2**30
POWER_IDLE_W, POWER_MAX_W = 70.0, 700.0
_EPOCH = time.time()
_M64 = 2**64 - 1


def _noise(index: int, slot: int, salt: str = "") -> float:
    """Deterministic pseudo-random number in [0, 1) for (gpu, time slot): splitmix64.

    (Not hashlib: it loads OpenSSL's libcrypto, megabytes of RSS for a demo backend.)
    """
    x = (index * 0x9E3779B97F4A7C15 + slot * 0xBF58476D1CE4E5B9 + sum(map(ord, salt)) * 0x94D049BB133111EB) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return (x ^ (x >> 31)) / 2**64


def pattern_of(index: int) -> str:
    return PATTERNS[index % len(PATTERNS)]


def utilization_at(index: int, t: float) -> float:
    """GPU utilisation ratio (0-1) of simulated GPU ``index`` at unix time ``t``."""
    pattern = pattern_of(index)
    slot = int(t)
    n = _noise(index, slot)
    if pattern == "idle":
        return 0.0 if n < 0.9 else 0.01
    if pattern == "steady":
        return 0.70 + 0.04 * (n - 0.5)
    if pattern == "periodic":
        phase = t % PERIOD_SECONDS
        return (0.95 if phase < 45.0 else 0.10) + 0.03 * (n - 0.5)
    if pattern == "bursty":
        burst = _noise(index, int(t // 5), "burst")
        return min(1.0, 0.3 + 0.7 * burst) if burst > 0.6 else 0.05 + 0.05 * n
    return 0.35 + 0.05 * (n - 0.5)  # leak


def memory_used_at(index: int, t: float) -> float:
    """Memory used in bytes of simulated GPU ``index`` at unix time ``t``."""
    pattern = pattern_of(index)
    if pattern == "idle":
        return 512 * 2**20
    if pattern == "leak":
        span = 0.85 * MEMORY_TOTAL - 8 * 2**30
        return 8 * 2**30 + (LEAK_BYTES_PER_SECOND * (t - _EPOCH)) % span
    u = utilization_at(index, t)
    base = {"steady": 40, "periodic": 60, "bursty": 20}[pattern] * 2**30
    return base + u * 8 * 2**30


class SimulatedBackend(Backend):
    """Deterministic, realistic-looking readings; ``vendor`` is "simulated"."""

    name: ClassVar[str] = "simulated"
    vendor: ClassVar[str] = "simulated"
    auto_priority: ClassVar[int | None] = None  # never part of --backend auto

    def init(self) -> None:
        self._count = self.options.simulated_gpus
        self._energy = [0.0] * self._count
        self._last_t: float | None = None
        self._peers = [  # static, like a real topology: the same list every collection
            PeerReading(gpu=a, peer=b, p2p={"read": 1.0, "write": 1.0, "nvlink": 1.0},
                        topology_level="single", topology_level_value=10.0)
            for a in range(self._count) for b in range(self._count) if a != b
        ]

    def collect(self, out: Collection) -> None:
        now = time.time()
        dt = 0.0 if self._last_t is None else max(0.0, now - self._last_t)
        self._last_t = now
        for i in range(self._count):
            u = utilization_at(i, now)
            power = POWER_IDLE_W + (POWER_MAX_W - POWER_IDLE_W) * u
            self._energy[i] += power * dt
            used = memory_used_at(i, now)
            reserved = 512 * 2**20
            temp = 30.0 + 50.0 * u + 2 * _noise(i, int(now), "t")
            sm_clock = (1980 if u > 0.05 else 345) * 1e6
            out.gpus.append(
                GpuReading(
                    index=i,
                    uuid=f"GPU-5140a7ed-0000-4000-8000-{i:012d}",
                    vendor="simulated",
                    name="Simulated GPU",
                    pci_bus_id=f"0000:{0x10 + i:02x}:00.0",
                    serial=f"SIM{i:08d}",
                    driver_version="0.0-simulated",
                    cuda_driver_version=None,
                    utilization_ratio=u,
                    memory_utilization_ratio=0.6 * u,
                    memory_total_bytes=float(MEMORY_TOTAL),
                    memory_used_bytes=used,
                    memory_reserved_bytes=float(reserved),
                    memory_free_bytes=MEMORY_TOTAL - used - reserved,
                    temperature_celsius={"gpu": round(temp, 1), "memory": round(temp + 5.0, 1)},
                    power_watts=round(power, 3),
                    power_limit_watts=POWER_MAX_W,
                    energy_joules=round(self._energy[i], 3),
                    clock_hertz={"graphics": sm_clock, "sm": sm_clock, "memory": 2619e6, "video": 1545e6},
                    clock_max_hertz={"graphics": 1980e6, "sm": 1980e6, "memory": 2619e6, "video": 1545e6},
                    pcie_link_generation=5.0 if u > 0.05 else 1.0,
                    pcie_link_generation_max=5.0,
                    pcie_link_width=16.0,
                    pcie_link_width_max=16.0,
                    fan_speed_ratio=None,  # datacentre GPUs have no fan reading: absent, not 0
                    performance_state=0.0 if u > 0.05 else 8.0,
                    throttle_reasons={"gpu_idle": 1.0 if u < 0.05 else 0.0, "sw_power_cap": 0.0},
                )
            )
        out.peers = self._peers


BACKEND = SimulatedBackend
