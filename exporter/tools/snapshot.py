"""``gpu-exporter snapshot``: a one-shot audit of the GPUs and the host (the content of ``/stats``).

Take one before and one after a benchmark, then ``gpu-exporter diff before.json after.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from exporter import backends
from exporter.core.fields import Field
from exporter.core.views import FIELDS, format_bytes
from exporter.platform.errors import ConfigError, fail
from exporter.platform.settings import OneLineParser
from exporter.python_api.checks import check_number
from exporter.tools.audit import (
    add_backend_arguments,
    check_writable,
    checked,
    get_dotted,
    open_session,
    setup_logging,
    take_audit,
    write_file,
)

PROG = "gpu-exporter snapshot"

# nvidia-smi topo -m abbreviations of the NVML topology levels
TOPO_CODES = {"internal": "INT", "single": "PIX", "multiple": "PXB", "hostbridge": "PHB", "node": "NODE",
              "system": "SYS"}


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description="Write a one-shot audit of the GPUs and the host "
                                "(the content of /stats) as a table or as JSON.")
    p.add_argument("--json", action="store_true", help="write JSON (the /stats schema) instead of a table")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write to FILE instead of stdout (JSON when FILE ends in .json)")
    p.add_argument("--window", type=float, default=1.0, metavar="SECONDS",
                   help="read twice this far apart to get the average power from the energy counter "
                        "(default 1; 0: one reading, no average power)")
    add_backend_arguments(p)
    return p


def _num(v: float | None, fmt: str = "{:.0f}", unit: str = "") -> str:
    return "-" if v is None else fmt.format(v) + unit


def _pcie(p: dict[str, Any]) -> str:
    cur = f"gen{_num(p['generation'])} x{_num(p['width'])}"
    return f"{cur} (max gen{_num(p['generation_max'])} x{_num(p['width_max'])})"


# a field's value in its own column, by its SI unit
_CELL = {"bytes": format_bytes, "ratio": lambda v: f"{v * 100:.0f}%", "celsius": lambda v: f"{v:.0f} C",
         "watts": lambda v: f"{v:.1f} W", "joules": lambda v: f"{v:.0f} J", "hertz": lambda v: f"{v / 1e6:.0f} MHz",
         "seconds": lambda v: f"{v:g} s"}


def cell(f: Field, v: Any) -> str:
    """A field's value in the table: in its unit, ``-`` when not read."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int | float) and f.unit in _CELL:
        return str(_CELL[f.unit](v))
    return f"{v:g}" if isinstance(v, float) else str(v)


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def table(audit: dict[str, Any]) -> str:
    """The audit as text: host, one line per GPU, and the topology matrix (as nvidia-smi topo -m)."""
    h = audit["host"]
    lines = [f"Host       {h['node_name']}   taken {audit['timestamp']}",
             f"Processor  {h['processor']}",
             f"Kernel     {h['kernel']}   {h['os']}".rstrip(),
             f"Driver     {h['driver_version'] or '-'}   {backends.runtime_label()} {h['cuda_version'] or '-'}", ""]
    # the fixed columns combine fields; then a column for each field of the table that names one (its row's
    # ``column``, exporter/core/schema.py)
    extra = [f for f in FIELDS if f.column and f.stats_key]
    rows = [["GPU", "BACKEND", "NAME", "PCI BUS ID", "MEMORY USED / TOTAL", "UTIL", "POWER (AVG)", "TEMP",
             "PCIE", *(f.column for f in extra)]]
    for g in audit["gpus"]:
        util = g["utilization_ratio"]
        power = f"{_num(g['power_watts'], '{:.1f}', ' W')} ({_num(g['power_average_watts'], '{:.1f}', ' W')})"
        rows.append([str(g["index"]), g["backend"], (g["name"] or "-") + ("" if g["up"] else " [DOWN]"),
                     g["pci_bus_id"] or "-",
                     f"{format_bytes(g['memory_used_bytes'])} / {format_bytes(g['memory_total_bytes'])}",
                     _num(None if util is None else util * 100, "{:.0f}", "%"), power,
                     _num(g["temperature_celsius"], "{:.0f}", " C"), _pcie(g["pcie"]),
                     *(cell(f, get_dotted(g, f.stats_key or "")) for f in extra)])
    lines += _columns(rows) if audit["gpus"] else ["(no GPUs)"]
    for backend in dict.fromkeys(p["backend"] for p in audit["p2p"]):
        peers = {(p["gpu"], p["peer"]): p for p in audit["p2p"] if p["backend"] == backend}
        ids = sorted({i for pair in peers for i in pair})
        matrix = [["", *(f"GPU{i}" for i in ids)]]
        for a in ids:
            row = [f"GPU{a}"]
            for b in ids:
                p = peers.get((a, b))
                if a == b:
                    row.append("X")
                elif p is None:
                    row.append("-")
                elif p["p2p"].get("nvlink") or p["p2p"].get("xgmi"):
                    row.append("NV" if p["p2p"].get("nvlink") else "XGMI")
                else:
                    row.append(TOPO_CODES.get(p["topology_level"] or "", p["topology_level"] or "?"))
            matrix.append(row)
        p2p_ok = sum(1 for p in peers.values() if p["p2p"].get("read") and p["p2p"].get("write"))
        lines += ["", f"Topology ({backend}; P2P read+write supported on {p2p_ok} of {len(peers)} pairs)",
                  *_columns(matrix),
                  "Legend: X self, NV NVLink, XGMI AMD XGMI, PIX one PCIe switch, PXB several switches, "
                  "PHB host bridge, NODE same NUMA node, SYS across NUMA nodes, INT same board"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    try:
        args = parser().parse_args(argv)
        window = checked(lambda: check_number(args.window, "window", 0, 60, what="seconds"), "--window")
        if args.output:
            check_writable(args.output)
        as_json = args.json or (args.output or "").endswith(".json")
        setup_logging()
        with open_session(args) as engine:
            audit = take_audit(engine, window)
        text = json.dumps(audit, indent=2) + "\n" if as_json else table(audit)
        if args.output:
            write_file(args.output, text)
        else:
            sys.stdout.write(text)
    except ConfigError as exc:
        return fail(PROG, exc)
    return 0
