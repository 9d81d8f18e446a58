"""``gpu-exporter pick``: the N least-loaded GPUs, comma-separated, for CUDA_VISIBLE_DEVICES.

Score = 0.6 x free-memory ratio + 0.4 x (1 - utilisation); a GPU qualifies when it is up, has at
least ``--min-free`` memory free and at most ``--max-util`` utilisation. Indices are the driver's
(nvidia-smi / amd-smi order, which is PCI bus order): set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or use
``--format uuid`` so that CUDA numbers the devices the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from exporter.core.readings import GpuReading
from exporter.serve.engine import Engine
from exporter.tools.audit import (
    ToolError,
    add_backend_arguments,
    fail,
    format_bytes,
    numbered,
    open_engine,
    parse_size,
    read,
    setup_logging,
)

PROG = "gpu-exporter pick"
FREE_WEIGHT, IDLE_WEIGHT = 0.6, 0.4

# parallelism dimension -> accepted spellings (matched after lower-casing and "-" -> "_")
PARALLEL_KEYS: dict[str, tuple[str, ...]] = {
    "tp": ("tensor_parallel_size", "tp_size", "tp"),
    "pp": ("pipeline_parallel_size", "pp_size", "pp"),
    "dp": ("data_parallel_size", "dp_size", "dp"),
    "cp": ("context_parallel_size", "cp_size", "cp"),
    "dcp": ("decode_context_parallel_size", "dcp_size", "dcp"),
}
_SPELLING = {s: dim for dim, spellings in PARALLEL_KEYS.items() for s in spellings}


def gpus_for(config: Any, source: str = "config") -> tuple[int, dict[str, int]]:
    """GPUs a parallelism config needs: tp x pp x max(dp, cp, dcp); also the sizes found.

    Keys are searched at every depth of nested objects (``{"parallel": {"tp": 2}}`` works); a
    dimension given twice with different values is an error, a missing one is 1.
    """
    found: dict[str, tuple[int, str]] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                where = f"{path}.{k}" if path else str(k)
                dim = _SPELLING.get(str(k).lower().replace("-", "_"))
                if dim is not None and not isinstance(v, dict | list):
                    n = _size(v, source, where)
                    if dim in found and found[dim][0] != n:
                        raise ToolError(f"{source}: {dim} is given twice with different values "
                                        f"({found[dim][1]}={found[dim][0]}, {where}={n})", code=2)
                    found.setdefault(dim, (n, where))
                else:
                    walk(v, where)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(config, "")
    if not found:
        names = ", ".join(s.replace("_", "-") for s in PARALLEL_KEYS["tp"])
        raise ToolError(f"{source}: no parallelism setting found (expected e.g. {names}, and likewise "
                        "pipeline/data/context/decode-context parallel)", code=2)
    sizes = {dim: found[dim][0] if dim in found else 1 for dim in PARALLEL_KEYS}
    return sizes["tp"] * sizes["pp"] * max(sizes["dp"], sizes["cp"], sizes["dcp"]), sizes


def _size(v: Any, source: str, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ToolError(f"{source}: {where}={v!r}: expected a positive integer", code=2)
    try:
        f = float(v)
    except ValueError:
        raise ToolError(f"{source}: {where}={v!r}: expected a positive integer", code=2) from None
    if not f.is_integer() or f < 1:
        raise ToolError(f"{source}: {where}={v!r}: expected a positive integer", code=2)
    return int(f)


def parse_ratio(text: str) -> float:
    """``0.5`` or ``50%`` -> 0.5."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        v = math.nan
    if not 0 <= v <= 1:  # also rejects NaN
        raise ValueError(f"{text!r}: expected a ratio 0-1 or a percentage such as 50%")
    return v


@dataclass
class Candidate:
    backend: str
    index: int
    uuid: str
    free: float | None
    total: float | None
    util: float | None
    score: float
    why_not: list[str] = field(default_factory=list)


def rank(gpus: list[tuple[int, str, GpuReading]], min_free: float, max_util: float) -> list[Candidate]:
    """Candidates best first (score, then index); ``why_not`` empty for those that qualify.

    ``gpus``: (number, backend, reading) as :func:`~exporter.tools.audit.numbered` lists them.
    """
    out = []
    for number, backend, g in gpus:
        total = g.memory_total_bytes
        free = g.memory_free_bytes
        if free is None and total is not None and g.memory_used_bytes is not None:
            free = max(0.0, total - g.memory_used_bytes)
        free_ratio = free / total if free is not None and total else 0.0  # unknown counts as full
        util = g.utilization_ratio
        score = FREE_WEIGHT * free_ratio + IDLE_WEIGHT * (1.0 - (util if util is not None else 1.0))
        c = Candidate(backend, number, g.uuid, free, total, util, round(score, 6))
        if not g.up:
            c.why_not.append("is down (" + (g.up_reason or "unreadable") + ")")
        else:
            if free is None and min_free > 0:
                c.why_not.append("does not report free memory")
            elif free is not None and free < min_free:
                c.why_not.append(f"has {format_bytes(free)} free (needs {format_bytes(min_free)})")
            if util is None and max_util < 1:
                c.why_not.append("does not report utilisation")
            elif util is not None and util > max_util:
                c.why_not.append(f"is {util * 100:.0f}% busy (max {max_util * 100:.0f}%)")
        out.append(c)
    out.sort(key=lambda c: (-c.score, c.index))
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Print the best N GPU indices, comma-separated (CUDA_VISIBLE_DEVICES / "
        "HIP_VISIBLE_DEVICES), ranked by 0.6 x free memory ratio + 0.4 x (1 - utilisation).")
    n = p.add_mutually_exclusive_group(required=True)
    n.add_argument("-n", type=int, metavar="N", help="how many GPUs")
    n.add_argument("--for", dest="config", metavar="CONFIG.json",
                   help="how many GPUs a parallelism config needs: tp x pp x max(dp, cp, dcp)")
    p.add_argument("--min-free", default="8GiB", metavar="SIZE",
                   help="free memory a GPU needs (default 8GiB)")
    p.add_argument("--max-util", default="0.5", metavar="RATIO",
                   help="highest utilisation a GPU may have, 0-1 or a percentage (default 0.5)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait up to this long for enough GPUs to qualify (default 0: do not wait)")
    p.add_argument("--poll", type=float, default=30.0, metavar="SECONDS",
                   help="seconds between checks while waiting (default 30)")
    p.add_argument("--format", choices=("index", "uuid"), default="index",
                   help="print indices (default) or UUIDs (independent of CUDA_DEVICE_ORDER)")
    p.add_argument("-v", "--verbose", action="store_true", help="print every GPU's score to stderr")
    add_backend_arguments(p)
    return p


def _wanted(args: argparse.Namespace) -> int:
    if args.config is None:
        if args.n < 1:
            raise ToolError(f"-n {args.n}: expected at least 1 GPU", code=2)
        return int(args.n)
    try:
        with open(args.config, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise ToolError(f"cannot read {args.config}: {exc.strerror or exc}", code=2) from None
    except json.JSONDecodeError as exc:
        raise ToolError(f"{args.config}: not valid JSON ({exc})", code=2) from None
    n, sizes = gpus_for(doc, args.config)
    sys.stderr.write(f"{args.config}: tp={sizes['tp']} pp={sizes['pp']} dp={sizes['dp']} cp={sizes['cp']} "
                     f"dcp={sizes['dcp']} -> {n} GPUs\n")
    return n


def _pick(engine: Engine, want: int, min_free: float, max_util: float,
          args: argparse.Namespace) -> list[Candidate]:
    start = time.monotonic()
    deadline = start + args.wait
    while True:
        snap = read(engine)
        ranked = rank(numbered(snap), min_free, max_util)
        ok = [c for c in ranked if not c.why_not]
        if args.verbose:
            for c in ranked:
                state = "ok" if not c.why_not else "; ".join(c.why_not)
                sys.stderr.write(f"  gpu {c.index} ({c.backend}) score {c.score:.3f}: {state}\n")
        if len(ok) >= want:
            return ok[:want]
        left = deadline - time.monotonic()
        if len(ranked) < want:
            raise ToolError(f"need {want} GPUs but this machine has {len(ranked)}")
        if left <= 0:
            waited = f" after waiting {time.monotonic() - start:.0f} s" if args.wait > 0 else ""
            reasons = "; ".join(f"gpu {c.index} {' and '.join(c.why_not)}" for c in ranked if c.why_not)
            raise ToolError(f"need {want} GPUs with >= {format_bytes(min_free)} free and "
                            f"<= {max_util * 100:.0f}% utilisation, found {len(ok)}{waited}: {reasons}")
        sys.stderr.write(f"waiting: {len(ok)} of {want} GPUs qualify; checking again in "
                         f"{min(args.poll, left):.0f} s ({left:.0f} s left)\n")
        time.sleep(min(args.poll, left))  # the wait between polls is the feature


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        want = _wanted(args)
        try:
            min_free = parse_size(args.min_free)
        except ValueError as exc:
            raise ToolError(f"--min-free: {exc}", code=2) from None
        try:
            max_util = parse_ratio(args.max_util)
        except ValueError as exc:
            raise ToolError(f"--max-util: {exc}", code=2) from None
        if args.wait < 0 or args.poll <= 0:
            raise ToolError("--wait must be >= 0 and --poll > 0 seconds", code=2)
        setup_logging()
        engine = open_engine(args)
        try:
            chosen = _pick(engine, want, min_free, max_util, args)
        finally:
            engine.stop()
    except ToolError as exc:
        return fail(PROG, exc)
    sys.stdout.write(",".join(str(c.index) if args.format == "index" else c.uuid for c in chosen) + "\n")
    return 0


__all__ = ["gpus_for", "main", "parse_ratio", "rank"]
