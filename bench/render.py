"""Micro-benchmark of rendering alone: one snapshot of N fake NVML GPUs, rendered again and again.

``python -m bench.render --gpus 8`` prints the time of one render (text format) in ms.
``--against FILE`` also times another version of ``exporter/serve/render.py`` (for example
``git show <rev>:exporter/serve/render.py > /tmp/old_render.py``) on the same snapshot, the two
interleaved round by round, and prints the ratio: on a loaded machine only the relative figure of
one run means anything. Each figure is the fastest single render of ``--rounds`` x ``--reps``, the
two versions taking turns every ``--reps`` renders: the usual way to take scheduler noise out of a
CPU-bound loop. It then times, as a scrape pays them, a fresh collection and the render of it (each
version), with the fake's values and with every value changed before the render (the worst case
for the renderer's caches): the best mean of one turn of ``--reps``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fakes.fakenvml import FakeNvml, build_library
from tests.harness.exporter import REPO

SCRIPT = r"""
import importlib.util, json, sys, time
from exporter.backends.nvml import NvmlBackend
from exporter.core.options import BackendOptions, FieldFilter
from exporter.core.readings import Collection, HostInfo
from exporter.core.snapshot import BackendStats, Snapshot
from exporter.serve import render as current

reps, rounds, against = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
b = NvmlBackend(BackendOptions())
b.init()
for _ in range(3):  # GPM needs two samples
    c = Collection("nvml")
    b.collect(c)
snap = Snapshot([c], HostInfo("bench", "cpu", "kernel"), {"nvml": BackendStats(success=True)}, 0.0)
fields = FieldFilter()
modules = {"current": current}
if against:
    spec = importlib.util.spec_from_file_location("other_render", against[0])
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    modules["against"] = other
    def stable(body):  # process_* (CPU seconds, memory) move between two renders
        return [line for line in body.split(b"\n") if not line.startswith(b"process_")]
    same = stable(other.render(snap, fields)) == stable(current.render(snap, fields))
best = dict.fromkeys(modules, float("inf"))
for _ in range(rounds):
    for name, mod in modules.items():
        for _ in range(reps):
            t0 = time.perf_counter()
            mod.render(snap, fields)
            best[name] = min(best[name], time.perf_counter() - t0)

# As a scrape pays it: a fresh collection (new reading objects), then its render, each timed;
# "static": the values the fake returns (its counters do not move); "moving": every value of the
# collection changed first (the worst case for the caches of values and texts). Each figure: the
# best mean over one turn of --reps, the versions taking turns.
import dataclasses
serial = [0]
def moved(r):
    serial[0] += 1
    d = serial[0] * 1e-3
    for f in dataclasses.fields(r):
        v = getattr(r, f.name)
        if type(v) is float:
            setattr(r, f.name, v + d)
        elif type(v) is dict and v and all(type(x) is float for x in v.values()):
            setattr(r, f.name, {k: x + d for k, x in v.items()})
for case in ("static", "moving"):
    for _ in range(rounds):
        for name, mod in modules.items():
            tc = tr = 0.0
            for _ in range(reps):
                t0 = time.perf_counter()
                c2 = Collection("nvml")
                b.collect(c2)
                t1 = time.perf_counter()
                if case == "moving":
                    for r in c2.gpus:
                        moved(r)
                s2 = Snapshot([c2], snap.host, snap.stats, 0.0)
                t2 = time.perf_counter()
                mod.render(s2, fields)
                t3 = time.perf_counter()
                tc, tr = tc + t1 - t0, tr + t3 - t2
            best[f"collect"] = min(best.get("collect", float("inf")), tc / reps)
            best[f"{case}:{name}"] = min(best.get(f"{case}:{name}", float("inf")), tr / reps)
extra = {"same_output": same} if against else {}
print(json.dumps({"gpus": len(c.gpus), "bytes": len(current.render(snap, fields)), **best, **extra}))
"""


def measure(gpus: int, reps: int, rounds: int, against: str | None) -> dict[str, float]:
    build_library()
    with tempfile.TemporaryDirectory() as tmp:
        fleet = FakeNvml(Path(tmp) / "fleet.conf", gpus=gpus)
        env = {**os.environ, **fleet.env()}
        other = [str(Path(against).resolve())] if against else []
        args = [sys.executable, "-c", SCRIPT, str(reps), str(rounds), *other]
        out = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise SystemExit(out.stderr.strip().splitlines()[-1])
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.render", description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20, help="renders per turn")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--against", help="another render.py to time on the same snapshot")
    a = ap.parse_args()
    t0 = time.perf_counter()
    r = measure(a.gpus, a.reps, a.rounds, a.against)
    line = f"{r['gpus']} GPUs, {r['bytes']} bytes: render {r['current'] * 1e3:.3f} ms"
    if "against" in r:
        line += f"; --against {r['against'] * 1e3:.3f} ms; current/against = {r['current'] / r['against']:.2f}"
        line += "" if r["same_output"] else " (their outputs differ)"
    line += f"\ncollection {r['collect'] * 1e3:.3f} ms; render of a fresh collection"
    for case in ("static", "moving"):
        line += f", {case} values: {r[f'{case}:current'] * 1e3:.3f} ms"
        if "against" in r:
            ratio = r[f"{case}:current"] / r[f"{case}:against"]
            line += f" (--against {r[f'{case}:against'] * 1e3:.3f} ms; {ratio:.2f})"
    line += f"; collection + render {(r['collect'] + r['static:current']) * 1e3:.3f} ms"
    print(line + f" ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
