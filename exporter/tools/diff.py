"""``gpu-exporter diff BEFORE.json AFTER.json``: did the system change during a benchmark run?

Exit status: 0 unchanged, 1 changed (so CI can gate a result on it), 2 bad input. Nothing
else ever exits 1: a file that is not a snapshot, or any failure to compare, is 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from functools import partial
from typing import Any

from exporter.core.fields import Field
from exporter.core.views import MIB
from exporter.platform.errors import ConfigError, fail, one_line
from exporter.platform.settings import OneLineParser
from exporter.platform.units import parse_size
from exporter.python_api.checks import check_number
from exporter.tools.audit import (
    IGNORABLE,
    RISES,
    UNIT_SYMBOLS,
    Limits,
    _show,
    check_audit,
    checked,
    diff_audits,
    rise_of,
)

PROG = "gpu-exporter diff"
MAX_FILE_BYTES = 16 << 20  # a 64-GPU snapshot is about 100 KiB


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG, description="Compare two snapshots (gpu-exporter snapshot --json). Fixed facts "
        "(GPU models, PCIe links, P2P, processor, driver) must be identical; memory in use and power "
        "must not have risen beyond the limits. Exit 0 unchanged, 1 changed, 2 bad input.")
    p.add_argument("before", metavar="BEFORE.json")
    p.add_argument("after", metavar="AFTER.json")
    for f in RISES:  # a --max-CHECK-rise flag per "rise" field of the schema's rows
        rise = rise_of(f)
        if f.unit == "bytes":
            default, metavar, unit = f"{rise.limit / MIB:g}MiB", "SIZE", "; e.g. 1GiB, 500MB"
        else:
            symbol = UNIT_SYMBOLS.get(f.unit or "", f.unit or "")
            default, metavar, unit = f"{rise.limit:g}", (f.unit or "number").upper(), f" {symbol}"
        p.add_argument(f"--max-{rise.check}-rise", default=default, metavar=metavar, dest=_dest(rise.check),
                       help=f"{rise.instead_what or rise.what} may rise this much per GPU "
                            f"(default %(default)s{unit.rstrip()}){rise.note}")
    p.add_argument("--ignore", action="append", default=[], metavar="FIELD",
                   help=f"skip a check (repeatable): {', '.join(IGNORABLE)}")
    return p


def _dest(check: str) -> str:
    return f"max_{check}_rise".replace("-", "_")


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


def _limit(f: Field, text: str) -> float:
    """A ``--max-CHECK-rise`` value in the field's unit: a size for bytes (``1GiB``), else a number >= 0."""
    flag = f"--max-{rise_of(f).check}-rise"
    if f.unit == "bytes":
        return check_number(parse_size(text), flag, 0, math.inf, what="bytes")
    try:
        v: object = float(text)
    except ValueError:
        v = text
    return check_number(v, flag, 0, math.inf, what=f.unit or "a number")


def main(argv: list[str]) -> int:
    try:
        args = parser().parse_args(argv)
        bad = [f for f in args.ignore if f not in IGNORABLE]
        if bad:
            raise ConfigError(f"--ignore {bad[0]}: unknown check; expected one of {', '.join(IGNORABLE)}",
                            code=2)
        limits: Limits = {}
        for f in RISES:
            check = rise_of(f).check
            limits[check] = checked(partial(_limit, f, getattr(args, _dest(check))), f"--max-{check}-rise")
        before, after = _load(args.before), _load(args.after)
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
