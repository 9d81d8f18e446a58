"""``gpu-exporter pick``: the N least-loaded GPUs, comma-separated, for CUDA_VISIBLE_DEVICES.

A thin layer over :mod:`exporter.python_api` (the Python API's ``wait_for_availability`` and
``estimate_requirements``): score = 0.6 x free-memory ratio + 0.4 x (1 - utilisation); a GPU
qualifies when it is up, has at least ``--min-free`` memory free and at most ``--max-util``
utilisation. Indices are the driver's (nvidia-smi / amd-smi order, which is PCI bus order): set
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or use ``--format uuid`` so that CUDA numbers the devices the
same way.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys

from exporter.platform.errors import ConfigError, fail
from exporter.platform.settings import OneLineParser
from exporter.platform.units import parse_size
from exporter.python_api import checks, requirements, selection
from exporter.tools.audit import (
    add_backend_arguments,
    checked,
    open_session,
    setup_logging,
)

PROG = "gpu-exporter pick"
MAX_CONFIG_BYTES = 16 << 20


def parse_ratio(text: str) -> float:
    """``0.5`` or ``50%`` -> 0.5."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        v = math.nan
    if not 0 <= v <= 1:  # also rejects NaN
        raise ValueError(f"{text[:40]!r}: expected a ratio 0-1 or a percentage such as 50%")
    return v


# Options that take a value: a value such as -1GiB must reach the check (and its message), not
# argparse's "expected one argument".
_VALUE_OPTIONS = ("-n", "--min-free", "--max-util", "--wait", "--poll")


def _negative_values_attached(argv: list[str]) -> list[str]:
    """``--min-free -1GiB`` -> ``--min-free=-1GiB`` (argparse reads a leading '-' as an option)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in _VALUE_OPTIONS and i + 1 < len(argv) and re.match(r"-[0-9.]", argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def parse_min_free(text: str) -> float:
    """``--min-free``: a size with its unit (8GiB, 512MiB, 10GB, 4096B) or 0. A bare number would be
    bytes, and ``--min-free 8`` meaning 8 bytes is a trap: it is refused."""
    t = text.strip()
    if t.startswith("-"):
        raise ValueError(f"{t[:40]!r} is negative; give a size such as 8GiB, or 0 for no floor")
    if re.fullmatch(r"[0-9]*\.?[0-9]+", t) and float(t) != 0:
        raise ValueError(f"{t!r} has no unit; write e.g. {t}GiB or {t}MiB ({t}B if you mean bytes)")
    return parse_size(t)


def seconds_text(s: float) -> str:
    """A pause as the user set it: 0.5 s stays 0.5 s (not "0 s")."""
    return f"{s:.0f}" if s >= 10 or s == int(s) else f"{s:.1f}" if s >= 1 else f"{s:.2g}"


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG, description="Print the best N GPU indices, comma-separated (CUDA_VISIBLE_DEVICES / "
        "HIP_VISIBLE_DEVICES), ranked by 0.6 x free memory ratio + 0.4 x (1 - utilisation).")
    n = p.add_mutually_exclusive_group(required=True)
    n.add_argument("-n", type=int, metavar="N", help="how many GPUs")
    n.add_argument("--for", dest="config", metavar="CONFIG.json",
                   help="how many GPUs a parallelism config needs: tp x pp x max(dp, cp, dcp)")
    p.add_argument("--min-free", default=f"{selection.DEFAULT_MIN_FREE_BYTES >> 30}GiB", metavar="SIZE",
                   help=f"free memory a GPU needs, with its unit: 8GiB, 512MiB, 10GB (default "
                        f"{selection.DEFAULT_MIN_FREE_BYTES >> 30}GiB; 0: no floor)")
    p.add_argument("--max-util", default="0.5", metavar="RATIO",
                   help="highest utilisation a GPU may have, 0-1 or a percentage (default 0.5)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help=f"wait up to this long for enough GPUs to qualify (default 0: do not wait; "
                        f"at most {checks.MAX_TIMEOUT:g})")
    p.add_argument("--poll", type=float, default=30.0, metavar="SECONDS",
                   help=f"seconds between checks while waiting (default 30; {checks.MIN_INTERVAL:g} to "
                        f"{checks.MAX_INTERVAL:g})")
    p.add_argument("--format", choices=("index", "uuid"), default="index",
                   help="print indices (default) or UUIDs (independent of CUDA_DEVICE_ORDER)")
    p.add_argument("-v", "--verbose", action="store_true", help="print every GPU's score to stderr")
    add_backend_arguments(p)
    return p


def _wanted(args: argparse.Namespace) -> int:
    if args.config is None:
        return checked(lambda: checks.check_count(args.n), "-n")
    try:
        with open(args.config, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {args.config}: {exc.strerror or exc}", code=2) from None
    try:
        if len(raw) > MAX_CONFIG_BYTES:
            raise ValueError(f"larger than {MAX_CONFIG_BYTES >> 20} MiB")
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{args.config}: not valid JSON ({str(exc)[:100]})", code=2) from None
    try:
        sizes, given = requirements.parallelism(doc, args.config)
    except ValueError as exc:
        raise ConfigError(str(exc), code=2) from None
    if not given:
        names = ", ".join(s.replace("_", "-") for s in requirements.PARALLEL_KEYS["tp"])
        raise ConfigError(f"{args.config}: no parallelism setting found (expected e.g. {names}, and likewise "
                        "pipeline/data/context/decode-context parallel)", code=2)
    n = requirements.world_size(sizes)
    sys.stderr.write(f"{args.config}: " + " ".join(f"{k}={v}" for k, v in sizes.items()) + f" -> {n} GPUs\n")
    return n


def main(argv: list[str]) -> int:
    try:
        args = parser().parse_args(_negative_values_attached(argv))
        want = _wanted(args)
        min_free = checked(lambda: checks.check_number(parse_min_free(args.min_free), "min_free", 0, math.inf),
                           "--min-free")
        max_util = checked(lambda: parse_ratio(args.max_util), "--max-util")
        wait = checked(lambda: checks.check_timeout(args.wait), "--wait")
        poll = checked(lambda: checks.check_interval(args.poll), "--poll")

        def show(a: selection.Availability) -> None:
            if args.verbose:
                for s in a.statuses:
                    state = "; ".join(selection.why_not(s, min_free, max_util)) or "ok"
                    sys.stderr.write(f"  gpu {s.index} score {s.score:.3f}: {state}\n")

        def waiting(a: selection.Availability, pause: float, left: float) -> None:
            sys.stderr.write(f"waiting: {len(a.gpus)} of {want} GPUs qualify; checking again in "
                             f"{seconds_text(pause)} s ({seconds_text(left)} s left)\n")
            sys.stderr.flush()

        setup_logging()
        with open_session(args) as engine:
            found = selection.wait(engine, want, min_free, max_util, wait, poll, report=waiting, on_check=show)
        if not found.ok:
            raise ConfigError(found.reason, code=1)
    except ConfigError as exc:
        return fail(PROG, exc)
    uuids = {s.index: s.uuid for s in found.statuses}
    sys.stdout.write(",".join(str(i) if args.format == "index" else uuids[i] for i in found.gpus) + "\n")
    return 0


__all__ = ["main", "parse_min_free", "parse_ratio"]
