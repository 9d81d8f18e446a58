"""NVIDIA compute processes (``nvidia-smi --query-compute-apps``, ``nvidia-smi pmon -s u``): how many
run on a GPU and the memory they use, per process with ``--per-process``, the MPS clients behind an
MPS server, and each process's SM utilisation for the per-pod families.

Every NVML call goes through the backend's funnel (:meth:`Backend.probe`, versioned functions newest
first: ``_v3``, ``_v2``, v1), so an error removes that reading only. The backend calls
:meth:`ProcessReader.read` once per readable GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from exporter.backends.base import MISSING, Device

if TYPE_CHECKING:
    from exporter.backends.nvml_private import Binding
    from exporter.core.options import BackendOptions
    from exporter.core.readings import GpuReading

NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND: "no sample since then"
NO_MEMORY = 0xFFFF_FFFF_FFFF_FFFF  # usedGpuMemory's "not available"


class _Host(Protocol):
    """What the reader needs of the NVML backend (its funnel, options, field selection and the loaded
    binding); not imported, so the backend can import this module."""

    binding: Binding
    options: BackendOptions

    def probe(self, dev: Device, reading: str, candidates: Sequence[tuple[str, Callable[..., Any]]], *args: Any,
              convert: Callable[[Any], Any] | None = None) -> Any: ...

    def enabled(self, family: str) -> bool: ...

    def any_enabled(self, *families: str) -> bool: ...


class ProcessReader:
    """The process readings of one GPU, as its families and ``--per-process`` ask."""

    def __init__(self, backend: _Host) -> None:
        self._b = backend

    def read(self, gpu: Device, static: dict[str, Any], r: GpuReading, h: Any) -> None:
        """Fill ``r``'s process readings; ``static``: the GPU's state kept across collections (the newest
        utilisation sample seen)."""
        b = self._b
        per_pod = b.options.per_process and b.any_enabled("gpu_pod_utilization_ratio", "gpu_pod_memory_used_bytes")
        per_pid = per_pod or (b.options.per_process and b.enabled("gpu_process_memory_used_bytes"))
        if per_pid or b.any_enabled("gpu_processes", "gpu_processes_memory_used_bytes"):
            self._processes(gpu, r, h, per_pid)
        mps: frozenset[int] = frozenset()
        if per_pod and r.process_pids is not None:
            mps = self._mps_clients(gpu, r, h)
        if per_pod and r.process_pids and b.enabled("gpu_pod_utilization_ratio"):
            self._utilization(gpu, static, r, h, mps)

    def _processes(self, gpu: Device, r: GpuReading, h: Any, per_pid: bool) -> None:
        """Compute processes: ``_v3``, ``_v2``, then v1, probed once per GPU."""
        nv = self._b.binding.nv

        def convert(procs: Any) -> tuple[float, float | None, dict[int, float], tuple[int, ...]]:
            used: dict[int, float] = {}
            for p in procs:
                mem = p.usedGpuMemory
                # None (or the "not available" sentinel) where the driver cannot attribute memory
                if isinstance(mem, int) and mem != NO_MEMORY:
                    used[int(p.pid)] = float(mem)
            total = float(sum(used.values())) if len(used) == len(procs) else None
            return float(len(procs)), total, used, tuple(int(p.pid) for p in procs)

        res = self._b.probe(gpu, "gpu_processes", (
            ("nvmlDeviceGetComputeRunningProcesses_v3", lambda x: nv.nvmlDeviceGetComputeRunningProcesses_v3(x)),
            ("nvmlDeviceGetComputeRunningProcesses_v2", lambda x: nv.nvmlDeviceGetComputeRunningProcesses_v2(x)),
            ("nvmlDeviceGetComputeRunningProcesses", self._b.binding.processes_v1),
        ), h, convert=convert)
        if res is MISSING:
            return
        r.process_count, r.process_memory_used_bytes, by_pid, pids = res
        if per_pid:
            r.process_memory_by_pid = by_pid
            r.process_pids = pids

    def _mps_clients(self, gpu: Device, r: GpuReading, h: Any) -> frozenset[int]:
        """MPS clients (``nvmlDeviceGetMPSComputeRunningProcesses_v3``/``_v2``): on an MPS GPU the
        compute list has only the MPS server; the clients, with their memory, are here. Added to
        the reading's PIDs; returns their PIDs."""
        nv = self._b.binding.nv
        procs = self._b.probe(gpu, "gpu_pod_memory_used_bytes:mps", (
            ("nvmlDeviceGetMPSComputeRunningProcesses_v3", lambda x: nv.nvmlDeviceGetMPSComputeRunningProcesses_v3(x)),
            ("nvmlDeviceGetMPSComputeRunningProcesses_v2", lambda x: nv.nvmlDeviceGetMPSComputeRunningProcesses_v2(x)),
        ), h)
        if procs is MISSING or not procs:
            return frozenset()
        pids = list(r.process_pids or ())
        for p in procs:
            pid, mem = int(p.pid), p.usedGpuMemory
            if pid in pids:
                continue
            pids.append(pid)
            if isinstance(mem, int) and mem != NO_MEMORY:
                r.process_memory_by_pid[pid] = float(mem)
        r.process_pids = tuple(pids)
        return frozenset(int(p.pid) for p in procs)

    def _utilization(self, gpu: Device, static: dict[str, Any], r: GpuReading, h: Any,
                     mps: frozenset[int]) -> None:
        """Per-process SM utilisation: ``nvmlDeviceGetProcessesUtilizationInfo`` (R550+), else
        ``nvmlDeviceGetProcessUtilization``, probed once per GPU (nvidia-smi pmon -s u: sm).

        Asked for the samples newer than the last one seen on this GPU; each process's latest
        sample is its reading. A running compute process with no new sample ran no kernel since
        the last collection: 0. ``NOT_FOUND`` is NVML's "no sample since then": every process 0.
        An MPS client (``mps``) gets a reading only from its own sample: the driver may count its
        work under the MPS server. Unsupported (MIG, vGPU, old drivers): absent, never 0.
        """
        nv = self._b.binding.nv
        since = int(static.get("proc_util_seen", 0))

        def newest(get: Callable[[Any, int], Any]) -> Callable[[Any], Any]:
            def read(x: Any) -> Any:
                try:
                    return get(x, since)
                except nv.NVMLError as exc:
                    # NOT_FOUND: no sample since ``since``; SUCCESS (0) raised by pynvml when the size
                    # query answers "0 samples" instead of INSUFFICIENT_SIZE: the same
                    if getattr(exc, "value", None) in (NOT_FOUND, 0):
                        return []
                    raise
            return read

        def convert(samples: Any) -> tuple[dict[int, float], int]:
            latest: dict[int, tuple[int, float]] = {}
            seen = since
            for smp in samples:
                ts, pid, sm = int(smp.timeStamp), int(smp.pid), int(smp.smUtil)
                seen = max(seen, ts)
                if sm > 100:  # a sentinel or a corrupt sample: not a reading
                    continue
                if pid not in latest or ts >= latest[pid][0]:
                    latest[pid] = (ts, sm / 100.0)
            return {pid: v for pid, (_, v) in latest.items()}, seen

        res = self._b.probe(gpu, "gpu_pod_utilization_ratio", (
            ("nvmlDeviceGetProcessesUtilizationInfo",
             newest(lambda x, t: nv.nvmlDeviceGetProcessesUtilizationInfo(x, t))),
            ("nvmlDeviceGetProcessUtilization", newest(lambda x, t: nv.nvmlDeviceGetProcessUtilization(x, t))),
        ), h, convert=convert)
        if res is MISSING:
            return
        by_pid, static["proc_util_seen"] = res
        r.process_utilization_by_pid = {pid: by_pid.get(pid, 0.0) for pid in r.process_pids or ()
                                        if pid in by_pid or pid not in mps}
