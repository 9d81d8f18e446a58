"""``gpu-exporter diff BEFORE.json AFTER.json``: did the system change during a benchmark run?

Exit status: 0 unchanged, 1 changed (so CI can gate a result on it), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from exporter.tools.audit import (
    IGNORABLE,
    MIB,
    Limits,
    ToolError,
    check_audit,
    diff_audits,
    fail,
    parse_size,
)

PROG = "gpu-exporter diff"


def parser() -> argparse.ArgumentParser:
    d = Limits()
    p = argparse.ArgumentParser(
        prog=PROG, description="Compare two snapshots (gpu-exporter snapshot --json). Fixed facts "
        "(GPU models, PCIe links, P2P, processor, driver) must be identical; memory in use and power "
        "must not have risen beyond the limits. Exit 0 unchanged, 1 changed, 2 bad input.")
    p.add_argument("before", metavar="BEFORE.json")
    p.add_argument("after", metavar="AFTER.json")
    p.add_argument("--max-memory-rise", default=f"{d.memory_rise_bytes / MIB:g}MiB",
                   metavar="SIZE",
                   help="memory in use may rise this much per GPU (default %(default)s; e.g. 1GiB, 500MB)")
    p.add_argument("--max-power-rise", type=float, default=d.power_rise_watts, metavar="WATTS",
                   help="power may rise this much per GPU (default %(default)g W); the average from the "
                        "energy counter when both snapshots have it, else the instantaneous reading")
    p.add_argument("--ignore", action="append", default=[], metavar="FIELD",
                   help=f"skip a check (repeatable): {', '.join(IGNORABLE)}")
    return p


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise ToolError(f"cannot read {path}: {exc.strerror or exc}", code=2) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ToolError(f"{path}: not valid JSON ({exc})", code=2) from None
    return check_audit(doc, path)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        bad = [f for f in args.ignore if f not in IGNORABLE]
        if bad:
            raise ToolError(f"--ignore {bad[0]}: unknown check; expected one of {', '.join(IGNORABLE)}",
                            code=2)
        try:
            memory = parse_size(args.max_memory_rise)
        except ValueError as exc:
            raise ToolError(f"--max-memory-rise: {exc}", code=2) from None
        if args.max_power_rise < 0:
            raise ToolError(f"--max-power-rise {args.max_power_rise:g}: expected watts >= 0", code=2)
        before, after = _load(args.before), _load(args.after)
    except ToolError as exc:
        return fail(PROG, exc)
    limits = Limits(memory_rise_bytes=memory, power_rise_watts=args.max_power_rise)
    changes = diff_audits(before, after, limits, args.ignore)
    span = f"{before.get('timestamp', '?')} -> {after.get('timestamp', '?')}"
    if not changes:
        sys.stdout.write(f"unchanged: {len(after['gpus'])} GPUs, {span}\n")
        return 0
    sys.stdout.write("".join(c + "\n" for c in changes))
    sys.stdout.write(f"CHANGED: {len(changes)} difference{'s' if len(changes) != 1 else ''}, {span}\n")
    return 1

