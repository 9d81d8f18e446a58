"""``gpu-exporter diff BEFORE.json AFTER.json``: did the system change during a benchmark run?

Exit status: 0 unchanged, 1 changed (so CI can gate a result on it), 2 bad input. Nothing
else ever exits 1: a file that is not a snapshot, or any failure to compare, is 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from exporter.core.views import MIB
from exporter.platform.errors import ConfigError, fail, one_line
from exporter.platform.settings import OneLineParser
from exporter.platform.units import parse_size
from exporter.python_api.checks import check_number
from exporter.tools.audit import (
    IGNORABLE,
    Limits,
    _show,
    check_audit,
    checked,
    diff_audits,
)

PROG = "gpu-exporter diff"
MAX_FILE_BYTES = 16 << 20  # a 64-GPU snapshot is about 100 KiB


def parser() -> argparse.ArgumentParser:
    d = Limits()
    p = OneLineParser(
        prog=PROG, description="Compare two snapshots (gpu-exporter snapshot --json). Fixed facts "
        "(GPU models, PCIe links, P2P, processor, driver) must be identical; memory in use and power "
        "must not have risen beyond the limits. Exit 0 unchanged, 1 changed, 2 bad input.")
    p.add_argument("before", metavar="BEFORE.json")
    p.add_argument("after", metavar="AFTER.json")
    p.add_argument("--max-memory-rise", default=f"{d.memory_rise_bytes / MIB:g}MiB",
                   metavar="SIZE",
                   help="memory in use may rise this much per GPU (default %(default)s; e.g. 1GiB, 500MB)")
    p.add_argument("--max-power-rise", default=f"{d.power_rise_watts:g}", metavar="WATTS",
                   help="power may rise this much per GPU (default %(default)s W); the average from the "
                        "energy counter when both snapshots have it, else the instantaneous reading")
    p.add_argument("--ignore", action="append", default=[], metavar="FIELD",
                   help=f"skip a check (repeatable): {', '.join(IGNORABLE)}")
    return p


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}", code=2) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB: not a gpu-exporter snapshot", code=2)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSON and UTF-8 errors are ValueErrors; nesting: RecursionError
        raise ConfigError(f"{path}: not valid JSON ({str(exc)[:100]})", code=2) from None
    return check_audit(doc, path)


def _watts(text: str) -> float:
    try:
        v: object = float(text)
    except ValueError:
        v = text
    return check_number(v, "--max-power-rise", 0, math.inf, what="watts")


def main(argv: list[str]) -> int:
    try:
        args = parser().parse_args(argv)
        bad = [f for f in args.ignore if f not in IGNORABLE]
        if bad:
            raise ConfigError(f"--ignore {bad[0]}: unknown check; expected one of {', '.join(IGNORABLE)}",
                            code=2)
        memory = checked(lambda: check_number(parse_size(args.max_memory_rise), "--max-memory-rise", 0, math.inf,
                                              what="bytes"), "--max-memory-rise")
        power = checked(lambda: _watts(args.max_power_rise), "--max-power-rise")
        before, after = _load(args.before), _load(args.after)
        limits = Limits(memory_rise_bytes=memory, power_rise_watts=power)
        try:
            changes = diff_audits(before, after, limits, args.ignore)
        except Exception as exc:  # noqa: BLE001 - exit 1 means "changed": no failure may ever look like it
            raise ConfigError(f"cannot compare {args.before} and {args.after}: {type(exc).__name__}: "
                            f"{str(exc)[:100]}", code=2) from None
    except ConfigError as exc:
        return fail(PROG, exc)
    span = f"{_show(before.get('timestamp', '?'))} -> {_show(after.get('timestamp', '?'))}"
    if not changes:
        sys.stdout.write(f"unchanged: {len(after['gpus'])} GPUs, {span}\n")
        return 0
    sys.stdout.write("".join(one_line(c) + "\n" for c in changes))
    sys.stdout.write(f"CHANGED: {len(changes)} difference{'s' if len(changes) != 1 else ''}, {span}\n")
    return 1
