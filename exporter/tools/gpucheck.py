"""``make gpu-check``: our NVML readings against ``nvidia-smi``, field by field, on a real GPU.

Takes our collection, then ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``,
then our collection again: a dynamic value passes when nvidia-smi's number lies within
tolerance of either of our two readings around it (they bracket the same moment).
Identity and static values must match exactly. Also compares ``nvidia-smi topo -m``
with our topology levels and times the collection. Exits 1 on any mismatch.

``--markdown FILE`` appends the result table to FILE (docs/validation.md).
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from exporter.backends.nvml import NvmlBackend
from exporter.core.options import BackendOptions
from exporter.core.readings import Collection, GpuReading

MiB = 2**20


@dataclass(frozen=True)
class Field:
    query: str  # nvidia-smi --query-gpu name
    ours: Callable[[GpuReading], float | str | None]
    smi_scale: float = 1.0  # multiply nvidia-smi's number by this to get our unit
    tol_abs: float = 0.0
    tol_rel: float = 0.0
    text: bool = False
    note: str = ""


def _pstate(r: GpuReading) -> float | None:
    return r.performance_state


FIELDS: tuple[Field, ...] = (
    Field("uuid", lambda r: r.uuid, text=True),
    Field("name", lambda r: r.name, text=True),
    Field("pci.bus_id", lambda r: r.pci_bus_id, text=True, note="NVML 8-digit domain shortened to 4"),
    Field("serial", lambda r: r.serial, text=True),
    Field("driver_version", lambda r: r.driver_version, text=True),
    Field("utilization.gpu", lambda r: r.utilization_ratio, 0.01, tol_abs=0.15, note="sampled: +/-15 points"),
    Field("utilization.memory", lambda r: r.memory_utilization_ratio, 0.01, tol_abs=0.15),
    Field("memory.total", lambda r: r.memory_total_bytes, MiB, tol_abs=MiB),
    Field("memory.used", lambda r: r.memory_used_bytes, MiB, tol_abs=64 * MiB),
    Field("memory.free", lambda r: r.memory_free_bytes, MiB, tol_abs=64 * MiB),
    Field("memory.reserved", lambda r: r.memory_reserved_bytes, MiB, tol_abs=MiB),
    Field("temperature.gpu", lambda r: r.temperature_celsius.get("gpu"), tol_abs=3),
    Field("temperature.memory", lambda r: r.temperature_celsius.get("memory"), tol_abs=3),
    Field("power.draw", lambda r: r.power_watts, tol_abs=15, tol_rel=0.10),
    Field("enforced.power.limit", lambda r: r.power_limit_watts, tol_abs=0.5),
    Field("clocks.gr", lambda r: r.clock_hertz.get("graphics"), 1e6, tol_rel=0.10, tol_abs=30e6),
    Field("clocks.sm", lambda r: r.clock_hertz.get("sm"), 1e6, tol_rel=0.10, tol_abs=30e6),
    Field("clocks.mem", lambda r: r.clock_hertz.get("memory"), 1e6, tol_rel=0.05),
    Field("clocks.video", lambda r: r.clock_hertz.get("video"), 1e6, tol_rel=0.10, tol_abs=30e6),
    Field("clocks.max.gr", lambda r: r.clock_max_hertz.get("graphics"), 1e6),
    Field("clocks.max.sm", lambda r: r.clock_max_hertz.get("sm"), 1e6),
    Field("clocks.max.mem", lambda r: r.clock_max_hertz.get("memory"), 1e6),
    Field("pcie.link.gen.current", lambda r: r.pcie_link_generation),
    Field("pcie.link.gen.max", lambda r: r.pcie_link_generation_max),
    Field("pcie.link.width.current", lambda r: r.pcie_link_width),
    Field("pcie.link.width.max", lambda r: r.pcie_link_width_max),
    Field("fan.speed", lambda r: r.fan_speed_ratio, 0.01, tol_abs=0.05),
    Field("pstate", _pstate, note="P0 = 0"),
    Field("ecc.mode.current", lambda r: r.ecc_mode_enabled),
    Field("ecc.errors.corrected.volatile.total", lambda r: r.ecc_errors.get(("corrected", "volatile"))),
    Field("ecc.errors.uncorrected.volatile.total", lambda r: r.ecc_errors.get(("uncorrected", "volatile"))),
    Field("ecc.errors.corrected.aggregate.total", lambda r: r.ecc_errors.get(("corrected", "aggregate"))),
    Field("ecc.errors.uncorrected.aggregate.total", lambda r: r.ecc_errors.get(("uncorrected", "aggregate"))),
    Field("clocks_event_reasons.sw_power_cap", lambda r: r.throttle_reasons.get("sw_power_cap")),
    Field("clocks_event_reasons.hw_slowdown", lambda r: r.throttle_reasons.get("hw_slowdown")),
    Field("clocks_event_reasons.sw_thermal_slowdown", lambda r: r.throttle_reasons.get("sw_thermal_slowdown")),
    Field("mig.mode.current", lambda r: r.mig_mode_enabled),
)

NA = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", "")
TOPO_CODES = {"PIX": "single", "PXB": "multiple", "PHB": "hostbridge", "NODE": "node", "SYS": "system"}


def _smi_value(f: Field, raw: str) -> float | str | None:
    raw = raw.strip()
    if raw in NA:
        return None
    if f.text:
        return raw
    if f.query == "pstate":
        return float(raw.lstrip("P"))
    if f.query == "ecc.mode.current" or f.query == "mig.mode.current":
        return 1.0 if raw.lower() == "enabled" else 0.0
    if f.query.startswith("clocks_event_reasons."):
        return 1.0 if raw.lower() == "active" else 0.0
    return float(raw) * f.smi_scale


def _ours_text(f: Field, v: float | str | None) -> float | str | None:
    if isinstance(v, str) and f.query == "pci.bus_id":
        return v.lower()
    return v


def compare(f: Field, smi: float | str | None, ours: list[float | str | None]) -> bool:
    if smi is None:
        return all(v is None for v in ours)  # nvidia-smi cannot read it: we must not publish it either
    if isinstance(smi, str):
        want = smi.lower()[4:] if f.query == "pci.bus_id" and len(smi.split(":")[0]) == 8 else smi
        return any(isinstance(v, str) and _ours_text(f, v) == (want.lower() if f.query == "pci.bus_id" else want)
                   for v in ours)
    for v in ours:
        if isinstance(v, int | float):
            tol = max(f.tol_abs, f.tol_rel * abs(smi))
            if abs(float(v) - smi) <= tol + 1e-9:
                return True
    return False


def _fmt(f: Field, v: float | str | None) -> str:
    if v is None:
        return "absent"
    if isinstance(v, str):
        return v
    if f.smi_scale == MiB:
        return f"{v / MiB:.0f} MiB"
    if f.smi_scale == 1e6:
        return f"{v / 1e6:.0f} MHz"
    if f.smi_scale == 0.01:
        return f"{v * 100:.0f} %"
    return f"{v:g}"


def run_smi(smi: str, queries: list[str]) -> tuple[list[dict[str, str]], list[str]]:
    """One nvidia-smi call for every supported query; queries it rejects are reported, not fatal."""
    usable: list[str] = []
    rejected: list[str] = []
    for q in queries:  # older drivers reject unknown fields: probe each once
        res = subprocess.run([smi, f"--query-gpu={q}", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=60)
        (usable if res.returncode == 0 else rejected).append(q)
    res = subprocess.run([smi, f"--query-gpu={','.join(usable)}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True)
    rows = [[c.strip() for c in line.split(",")] for line in res.stdout.strip().splitlines()]
    return [dict(zip(usable, row, strict=False)) for row in rows], rejected


def topo_matrix(smi: str) -> dict[tuple[int, int], str]:
    """``nvidia-smi topo -m``: (gpu, peer) -> our level name, or "nvlink" for NV#."""
    res = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        return {}
    out: dict[tuple[int, int], str] = {}
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    if not lines:
        return out
    header = lines[0].split()
    gpu_cols = [i for i, h in enumerate(header) if h.startswith("GPU")]
    for line in lines[1:]:
        cells = line.split()
        if not cells or not cells[0].startswith("GPU") or not cells[0][3:].isdigit():
            continue
        a = int(cells[0][3:])
        for col, idx in enumerate(gpu_cols):
            if idx + 1 >= len(cells):
                break
            code = cells[col + 1]
            b = int(header[idx][3:])
            if a != b:
                out[(a, b)] = "nvlink" if code.startswith("NV") else TOPO_CODES.get(code, code)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu-check", description=__doc__.splitlines()[0])
    ap.add_argument("--nvidia-smi", default=shutil.which("nvidia-smi") or "nvidia-smi")
    ap.add_argument("--markdown", help="append the result as markdown to this file")
    ap.add_argument("--timing-rounds", type=int, default=50)
    a = ap.parse_args(argv)
    if not shutil.which(a.nvidia_smi):
        print(f"gpu-check: {a.nvidia_smi} not found: run this on a machine with an NVIDIA GPU and driver",
              file=sys.stderr)
        return 2
    backend = NvmlBackend(BackendOptions())
    try:
        backend.init()
    except Exception as exc:  # noqa: BLE001 - report any init failure in one line
        print(f"gpu-check: NVML init failed: {exc}", file=sys.stderr)
        return 2
    before = Collection("nvml")
    backend.collect(before)
    smi_rows, rejected = run_smi(a.nvidia_smi, [f.query for f in FIELDS])
    after = Collection("nvml")
    backend.collect(after)
    topo = topo_matrix(a.nvidia_smi)

    t0 = time.perf_counter()
    for _ in range(a.timing_rounds):
        backend.collect(Collection("nvml"))
    per_collection = (time.perf_counter() - t0) / a.timing_rounds

    lines = ["| GPU | field (nvidia-smi) | nvidia-smi | gpu-exporter | tolerance | result |",
             "|---|---|---|---|---|---|"]
    bad = 0
    for i, row in enumerate(smi_rows):
        r0 = next((g for g in before.gpus if g.index == i), None)
        r1 = next((g for g in after.gpus if g.index == i), None)
        if r0 is None or r1 is None:
            lines.append(f"| {i} | (all) | present | missing | - | MISMATCH |")
            bad += 1
            continue
        for f in FIELDS:
            if f.query not in row:
                continue
            smi = _smi_value(f, row[f.query])
            ours = [f.ours(r0), f.ours(r1)]
            ok = compare(f, smi, ours)
            bad += not ok
            tol = "exact" if not (f.tol_abs or f.tol_rel) else (
                f"{_fmt(f, f.tol_abs) if f.tol_abs else ''}{' / ' if f.tol_abs and f.tol_rel else ''}"
                f"{f'{f.tol_rel:.0%}' if f.tol_rel else ''}")
            lines.append(f"| {i} | {f.query} | {_fmt(f, smi)} | {_fmt(f, ours[0])} | {tol} | "
                         f"{'ok' if ok else 'MISMATCH'} |")
    peers = {(p.gpu, p.peer): p for p in after.peers}
    for (x, y), level in sorted(topo.items()):
        p = peers.get((x, y))
        if level == "nvlink":
            ok = p is not None and p.p2p.get("nvlink") == 1.0
            got = "nvlink" if ok else (str(p.p2p) if p else "absent")
        else:
            ok = p is not None and p.topology_level == level
            got = p.topology_level if p and p.topology_level else "absent"
        bad += not ok
        lines.append(f"| {x}-{y} | topo -m | {level} | {got} | exact | {'ok' if ok else 'MISMATCH'} |")
    name = after.gpus[0].name if after.gpus else "unknown"
    summary = (f"{time.strftime('%Y-%m-%d')}: {len(after.gpus)} x {name}, driver "
               f"{after.gpus[0].driver_version if after.gpus else '?'}, host {platform.node()}; "
               f"collection {per_collection * 1000:.2f} ms per cycle (mean of {a.timing_rounds}); "
               f"{'all fields match' if not bad else f'{bad} mismatches'}"
               + (f"; nvidia-smi rejected: {', '.join(rejected)}" if rejected else ""))
    print(summary)
    print("\n".join(lines))
    if a.markdown:
        with open(a.markdown, "a", encoding="utf-8") as fh:
            fh.write(f"\n### {summary}\n\n" + "\n".join(lines) + "\n")
    backend.shutdown()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
