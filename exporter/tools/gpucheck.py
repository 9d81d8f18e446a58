"""``make gpu-check``: our NVML readings against ``nvidia-smi``, field by field, on a real GPU.

Takes our collection, then ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``,
then our collection again: a dynamic value passes when nvidia-smi's number lies within
tolerance of either of our two readings around it (they bracket the same moment).
Identity and static values must match exactly. Also compares ``nvidia-smi topo -m``
with our topology levels and times the collection. Exits 1 on any mismatch.

``--markdown FILE`` appends the result table to FILE (docs/validation.md).

:data:`VALIDATION` says, per metric family, the unit conversion and either the ``nvidia-smi
--query-gpu`` fields that must equal it (:data:`FIELDS`, with their tolerances; each is one of the
names in the schema row's nvidia-smi column) or why ``--query-gpu`` cannot check it. A family it
does not list gets its row from the schema's (:func:`default_row`), so a new family needs no edit
here. docs/validation.md's table is generated from both: ``python -m exporter.tools.gpucheck --write-docs``.
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
from pathlib import Path

from exporter.backends.nvml import NvmlBackend
from exporter.core.options import BackendOptions
from exporter.core.readings import Collection, GpuReading
from exporter.core.schema import FAMILIES, Family

MiB = 2**20


@dataclass(frozen=True)
class Field:
    family: str  # the metric family it checks
    query: str  # nvidia-smi --query-gpu name
    ours: Callable[[GpuReading], float | str | None]
    smi_scale: float = 1.0  # multiply nvidia-smi's number by this to get our unit
    tol_abs: float = 0.0
    tol_rel: float = 0.0
    text: bool = False
    note: str = ""


def _pstate(r: GpuReading) -> float | None:
    return r.performance_state


_GPU = "gpu_info"
_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown",
            "hw_power_brake_slowdown", "sw_thermal_slowdown", "sync_boost")


def _named(names: dict[int, str], v: float | None) -> str | None:
    """An NVML enum number as nvidia-smi prints it."""
    return None if v is None else names.get(int(v), f"Unknown({int(v)})")


_COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
_FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}
_RECOVERY_ACTIONS = {0: "None", 1: "GPU Reset", 2: "Node Reboot", 3: "Drain P2P", 4: "Drain and Reset"}


def _reason(name: str) -> Field:
    return Field("gpu_throttle_reason_active", f"clocks_event_reasons.{name}",
                 lambda r: r.throttle_reasons.get(name), note="\"Not Active\" also matches a reason the GPU lacks")


FIELDS: tuple[Field, ...] = (
    Field(_GPU, "uuid", lambda r: r.uuid, text=True),
    Field(_GPU, "name", lambda r: r.name, text=True),
    Field(_GPU, "pci.bus_id", lambda r: r.pci_bus_id, text=True, note="NVML 8-digit domain shortened to 4"),
    Field(_GPU, "serial", lambda r: r.serial, text=True),
    Field(_GPU, "driver_version", lambda r: r.driver_version, text=True),
    Field("gpu_utilization_ratio", "utilization.gpu", lambda r: r.utilization_ratio, 0.01, tol_abs=0.15,
          note="sampled: +/-15 points"),
    Field("gpu_memory_utilization_ratio", "utilization.memory", lambda r: r.memory_utilization_ratio, 0.01,
          tol_abs=0.15),
    Field("gpu_encoder_utilization_ratio", "utilization.encoder", lambda r: r.encoder_utilization_ratio, 0.01,
          tol_abs=0.15),
    Field("gpu_decoder_utilization_ratio", "utilization.decoder", lambda r: r.decoder_utilization_ratio, 0.01,
          tol_abs=0.15),
    Field("gpu_memory_total_bytes", "memory.total", lambda r: r.memory_total_bytes, MiB, tol_abs=MiB),
    Field("gpu_memory_used_bytes", "memory.used", lambda r: r.memory_used_bytes, MiB, tol_abs=64 * MiB),
    Field("gpu_memory_free_bytes", "memory.free", lambda r: r.memory_free_bytes, MiB, tol_abs=64 * MiB),
    Field("gpu_memory_reserved_bytes", "memory.reserved", lambda r: r.memory_reserved_bytes, MiB, tol_abs=MiB),
    Field("gpu_temperature_celsius", "temperature.gpu", lambda r: r.temperature_celsius.get("gpu"), tol_abs=3),
    Field("gpu_temperature_celsius", "temperature.memory", lambda r: r.temperature_celsius.get("memory"),
          tol_abs=3),
    Field("gpu_power_watts", "power.draw", lambda r: r.power_watts, tol_abs=15, tol_rel=0.10),
    Field("gpu_power_limit_watts", "enforced.power.limit", lambda r: r.power_limit_watts, tol_abs=0.5),
    Field("gpu_clock_hertz", "clocks.gr", lambda r: r.clock_hertz.get("graphics"), 1e6, tol_rel=0.10,
          tol_abs=30e6),
    Field("gpu_clock_hertz", "clocks.sm", lambda r: r.clock_hertz.get("sm"), 1e6, tol_rel=0.10, tol_abs=30e6),
    Field("gpu_clock_hertz", "clocks.mem", lambda r: r.clock_hertz.get("memory"), 1e6, tol_rel=0.05),
    Field("gpu_clock_hertz", "clocks.video", lambda r: r.clock_hertz.get("video"), 1e6, tol_rel=0.10,
          tol_abs=30e6),
    Field("gpu_clock_max_hertz", "clocks.max.gr", lambda r: r.clock_max_hertz.get("graphics"), 1e6),
    Field("gpu_clock_max_hertz", "clocks.max.sm", lambda r: r.clock_max_hertz.get("sm"), 1e6),
    Field("gpu_clock_max_hertz", "clocks.max.mem", lambda r: r.clock_max_hertz.get("memory"), 1e6),
    Field("gpu_pcie_link_generation", "pcie.link.gen.current", lambda r: r.pcie_link_generation),
    Field("gpu_pcie_link_generation_max", "pcie.link.gen.max", lambda r: r.pcie_link_generation_max),
    Field("gpu_pcie_link_width", "pcie.link.width.current", lambda r: r.pcie_link_width),
    Field("gpu_pcie_link_width_max", "pcie.link.width.max", lambda r: r.pcie_link_width_max),
    Field("gpu_fan_speed_ratio", "fan.speed", lambda r: r.fan_speed_ratio, 0.01, tol_abs=0.05),
    Field("gpu_performance_state", "pstate", _pstate, note="P0 = 0"),
    Field("gpu_ecc_mode_enabled", "ecc.mode.current", lambda r: r.ecc_mode_enabled),
    Field("gpu_ecc_errors_total", "ecc.errors.corrected.volatile.total",
          lambda r: r.ecc_errors.get(("corrected", "volatile"))),
    Field("gpu_ecc_errors_total", "ecc.errors.uncorrected.volatile.total",
          lambda r: r.ecc_errors.get(("uncorrected", "volatile"))),
    Field("gpu_ecc_errors_total", "ecc.errors.corrected.aggregate.total",
          lambda r: r.ecc_errors.get(("corrected", "aggregate"))),
    Field("gpu_ecc_errors_total", "ecc.errors.uncorrected.aggregate.total",
          lambda r: r.ecc_errors.get(("uncorrected", "aggregate"))),
    Field("gpu_retired_pages", "retired_pages.single_bit_ecc.count", lambda r: r.retired_pages.get("single_bit")),
    Field("gpu_retired_pages", "retired_pages.double_bit.count", lambda r: r.retired_pages.get("double_bit")),
    Field("gpu_retired_pages_pending", "retired_pages.pending", lambda r: r.retired_pages_pending),
    Field("gpu_remapped_rows", "remapped_rows.correctable", lambda r: r.remapped_rows.get("corrected")),
    Field("gpu_remapped_rows", "remapped_rows.uncorrectable", lambda r: r.remapped_rows.get("uncorrected")),
    Field("gpu_remapped_rows_pending", "remapped_rows.pending", lambda r: r.remapped_rows_pending),
    Field("gpu_remapped_rows_failed", "remapped_rows.failure", lambda r: r.remapped_rows_failed),
    *(_reason(n) for n in _REASONS),
    Field("gpu_mig_mode_enabled", "mig.mode.current", lambda r: r.mig_mode_enabled),
    # issue 28: nvidia_gpu_exporter's series; enums compared as nvidia-smi spells them
    Field(_GPU, "vbios_version", lambda r: r.firmware_version, text=True),
    Field("gpu_power_default_limit_watts", "power.default_limit", lambda r: r.power_default_limit_watts,
          tol_abs=0.5),
    Field("gpu_compute_mode", "compute_mode", lambda r: _named(_COMPUTE_MODES, r.compute_mode), text=True),
    Field("gpu_fabric_state", "fabric.state", lambda r: _named(_FABRIC_STATES, r.fabric_state), text=True,
          note="N/A (no fabric): absent"),
    Field("gpu_recovery_action", "gpu_recovery_action", lambda r: _named(_RECOVERY_ACTIONS, r.recovery_action),
          text=True, note="only \"None\" is spelling-verified"),
)


@dataclass(frozen=True)
class Row:
    """One family in docs/validation.md: its unit conversion, and why ``--query-gpu`` cannot check it
    (empty: the :data:`FIELDS` of that family check it)."""

    conversion: str
    not_comparable: str = ""


_ONE = "none"
_GPM_WHY = "a rate over our own interval (GPM); nvidia-smi --query-gpu has no profiling field (dcgmi dmon does)"
_SELF = "the exporter's own health"
VALIDATION: dict[str, Row] = {
    "gpu_info": Row("text; bus ID: domain to 4 digits, lower case"),
    "gpu_up": Row("NVML_ERROR_GPU_IS_LOST -> 0", "nvidia-smi prints no row field for it (a lost GPU errors)"),
    "gpu_field_unsupported": Row(_ONE, "derived from NVML statuses; nvidia-smi prints [N/A] in the field itself"),
    "gpu_host_info": Row(_ONE, "host facts, not NVML"),
    "gpu_utilization_ratio": Row("% / 100"),
    "gpu_memory_utilization_ratio": Row("% / 100"),
    "gpu_encoder_utilization_ratio": Row("% / 100"),
    "gpu_decoder_utilization_ratio": Row("% / 100"),
    "gpu_memory_total_bytes": Row("bytes (nvidia-smi: MiB)"),
    "gpu_memory_used_bytes": Row("bytes (nvidia-smi: MiB)"),
    "gpu_memory_free_bytes": Row("bytes (nvidia-smi: MiB)"),
    "gpu_memory_reserved_bytes": Row("bytes (nvidia-smi: MiB)"),
    "gpu_temperature_celsius": Row(_ONE),
    "gpu_fan_speed_ratio": Row("% / 100"),
    "gpu_power_watts": Row("mW / 1000"),
    "gpu_power_limit_watts": Row("mW / 1000"),
    "gpu_energy_joules_total": Row("mJ / 1000", "nvidia-smi --query-gpu has no energy counter"),
    "gpu_performance_state": Row("P<n> -> n"),
    "gpu_clock_hertz": Row("MHz x 1e6"),
    "gpu_clock_max_hertz": Row("MHz x 1e6"),
    "gpu_pcie_link_generation": Row(_ONE),
    "gpu_pcie_link_generation_max": Row(_ONE),
    "gpu_pcie_link_width": Row(_ONE),
    "gpu_pcie_link_width_max": Row(_ONE),
    "gpu_pcie_replays_total": Row(_ONE, "nvidia-smi -q only (Replays Since Reset), not --query-gpu"),
    "gpu_pcie_throughput_bytes_per_second": Row("GPM MiB/s x 2^20; else KB/s x 1024",
                                                "a rate over different windows (nvidia-smi dmon -s t)"),
    "gpu_sm_active_ratio": Row("% / 100", _GPM_WHY),
    "gpu_sm_occupancy_ratio": Row("% / 100", _GPM_WHY),
    "gpu_graphics_engine_active_ratio": Row("% / 100", _GPM_WHY),
    "gpu_pipe_active_ratio": Row("% / 100", _GPM_WHY),
    "gpu_dram_active_ratio": Row("% / 100", _GPM_WHY),
    "gpu_nvlink_throughput_bytes_per_second": Row("MiB/s x 2^20", _GPM_WHY),
    "gpu_ecc_mode_enabled": Row("Enabled/Disabled -> 1/0"),
    "gpu_ecc_errors_total": Row(_ONE),
    "gpu_retired_pages": Row("page count"),
    "gpu_retired_pages_pending": Row("Yes/No -> 1/0"),
    "gpu_remapped_rows": Row(_ONE),
    "gpu_remapped_rows_pending": Row("Yes/No -> 1/0"),
    "gpu_remapped_rows_failed": Row("Yes/No -> 1/0"),
    "gpu_throttle_reason_active": Row("bit of the reason mask -> 1/0 (Active/Not Active)"),
    "gpu_violation_seconds_total": Row("ns / 1e9", "nvidia-smi -q -d PERFORMANCE prints the reasons, not the times"),
    "gpu_link_up": Row(_ONE, "nvidia-smi nvlink -s, not --query-gpu"),
    "gpu_link_errors_total": Row(_ONE, "nvidia-smi nvlink -e, not --query-gpu"),
    "gpu_link_transferred_bytes_total": Row("KB x 1000 (AMD gpu_metrics)", "AMD only: NVIDIA gives rates"),
    "gpu_processes": Row("count", "nvidia-smi --query-compute-apps, not --query-gpu"),
    "gpu_processes_memory_used_bytes": Row("bytes", "nvidia-smi --query-compute-apps, not --query-gpu"),
    "gpu_process_memory_used_bytes": Row("bytes", "nvidia-smi --query-compute-apps, not --query-gpu"),
    "gpu_mig_mode_enabled": Row("Enabled/Disabled -> 1/0"),
    "gpu_mig_memory_total_bytes": Row("bytes", "per MIG device: nvidia-smi -q -d MEMORY, not --query-gpu"),
    "gpu_mig_memory_used_bytes": Row("bytes (_v2: reserved excluded)",
                                     "per MIG device: nvidia-smi -q -d MEMORY, not --query-gpu"),
    "gpu_mig_utilization_ratio": Row("% / 100", "NVML reports none for MIG devices"),
    "gpu_power_default_limit_watts": Row("mW / 1000"),
    "gpu_compute_mode": Row("nvmlComputeMode_t number (nvidia-smi: its name)"),
    "gpu_fabric_state": Row("nvmlGpuFabricState_t number (nvidia-smi: its name)"),
    "gpu_recovery_action": Row("nvmlDeviceGpuRecoveryAction_t number (nvidia-smi: its name)"),
    "gpu_p2p_supported": Row("OK -> 1", "compared with nvidia-smi topo -m (NV#: nvlink), not --query-gpu"),
    "gpu_topology_level": Row("NVML level", "compared with nvidia-smi topo -m (PIX/PXB/PHB/NODE/SYS)"),
    "gpu_xid_errors_total": Row("count", "events (dmesg: NVRM: Xid), not a --query-gpu field"),
    "gpu_xid_last_timestamp_seconds": Row("Unix seconds", "events (dmesg), not a --query-gpu field"),
    "gpu_pci_devices": Row("count", "sysfs (lspci), not NVML"),
    "gpu_visible_devices": Row("count", "a GPU missing from our collection fails every row of it"),
    "gpu_allocation_info": Row(_ONE, "the kubelet's pod-resources API, not NVML"),
    "gpu_pod_utilization_ratio": Row("% / 100, summed per pod", "per-process samples (nvidia-smi pmon), per pod "
                                     "through /proc and the API; not a --query-gpu field"),
    "gpu_pod_memory_used_bytes": Row("bytes, summed per pod", "nvidia-smi --query-compute-apps per process, summed "
                                     "per pod through /proc and the API"),
}

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
    word = raw.lower()
    if f.query == "ecc.mode.current" or f.query == "mig.mode.current":
        return 1.0 if word == "enabled" else 0.0
    if f.query.startswith("clocks_event_reasons."):
        return 1.0 if word == "active" else 0.0  # "Not Active"
    if word in ("yes", "no"):  # retired_pages.pending, remapped_rows.pending / .failure
        return 1.0 if word == "yes" else 0.0
    return float(raw) * f.smi_scale


def _ours_text(f: Field, v: float | str | None) -> float | str | None:
    if isinstance(v, str) and f.query == "pci.bus_id":
        return v.lower()
    return v


def compare(f: Field, smi: float | str | None, ours: list[float | str | None]) -> bool:
    if smi is None:
        return all(v is None for v in ours)  # nvidia-smi cannot read it: we must not publish it either
    if f.family == "gpu_throttle_reason_active" and smi == 0.0 and all(v is None for v in ours):
        return True  # nvidia-smi prints "Not Active" for a reason the GPU does not support; we omit it
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


def smi_fields(fam: Family) -> list[str]:
    """The ``nvidia-smi`` column of the family's schema row, as a list (``--query-gpu`` names or globs)."""
    return [p.strip() for p in fam.equivalent("nvidia-smi").split(",") if p.strip()]


def default_row(fam: Family) -> Row:
    """A family :data:`VALIDATION` says nothing about: the schema row's own unit and nvidia-smi column."""
    if fam.scope == "self":
        return Row(_ONE, _SELF)
    smi = fam.equivalent("nvidia-smi")
    why = f"no --query-gpu comparison written (nvidia-smi: {smi})" if smi else "no nvidia-smi equivalent"
    return Row(f"as read, in {fam.unit}" if fam.unit != "1" else _ONE, why)


def validation_rows() -> list[tuple[str, str, str, str, str, str]]:
    """(family, NVML call, conversion, nvidia-smi fields, tolerance, amd-smi field) for every family."""
    out = []
    for fam in FAMILIES:
        row = VALIDATION.get(fam.name) or default_row(fam)
        fields = [f for f in FIELDS if f.family == fam.name]
        if row.not_comparable:
            smi, tol = f"not comparable: {row.not_comparable}", "-"
        else:
            smi = ", ".join(f"`{f.query}`" for f in fields)
            tol = "; ".join(sorted({_tolerance(f) for f in fields}))
        out.append((fam.name, fam.nvml or "-", row.conversion, smi, tol, fam.equivalent("amd-smi") or "-"))
    return out


def markdown_table() -> str:
    lines = ["| family | NVML call | conversion | nvidia-smi --query-gpu (must equal) | tolerance | amd-smi |",
             "|---|---|---|---|---|---|"]
    for fam, nvml, conv, smi, tol, amd in validation_rows():
        cells = (f"`{fam}`", nvml, conv, smi, tol, amd)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


DOCS = Path(__file__).resolve().parents[2] / "docs" / "validation.md"
BEGIN, END = "<!-- validation-table:begin -->", "<!-- validation-table:end -->"


def render_docs(text: str) -> str:
    """docs/validation.md with its generated table replaced by the current one."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"docs/validation.md lacks the {BEGIN} / {END} markers")
    return f"{head}{BEGIN}\n{markdown_table()}{END}{tail}"


def _tolerance(f: Field) -> str:
    if not (f.tol_abs or f.tol_rel):
        return "exact"
    parts = [_fmt(f, f.tol_abs)] if f.tol_abs else []
    if f.tol_rel:
        parts.append(f"{f.tol_rel:.0%}")
    return " / ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu-check", description=__doc__.splitlines()[0])
    ap.add_argument("--nvidia-smi", default=shutil.which("nvidia-smi") or "nvidia-smi")
    ap.add_argument("--markdown", help="append the result as markdown to this file")
    ap.add_argument("--timing-rounds", type=int, default=50)
    ap.add_argument("--write-docs", action="store_true", help="regenerate the table in docs/validation.md and exit")
    a = ap.parse_args(argv)
    if a.write_docs:
        DOCS.write_text(render_docs(DOCS.read_text()))
        return 0
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
    notes: dict[str, str] = {}  # nvidia-smi field -> what to know about a mismatch of it (Field.note)
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
            if not ok and f.note:
                notes[f.query] = f.note
            tol = _tolerance(f)
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
    for q in rejected:
        lines.append(f"| - | {q} | not comparable: this nvidia-smi rejects the field | - | - | skipped |")
    for fam_name, why in VALIDATION.items():
        if why.not_comparable:
            lines.append(f"| - | {fam_name} | not comparable: {why.not_comparable} | - | - | skipped |")
    if notes:  # after the table: a blank line ends it
        lines += ["", *(f"note on {q}: {note}" for q, note in sorted(notes.items()))]
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
