"""Profiler benchmark: one full cycle over N nodes x 8 GPUs of backfilled history.

Real Prometheus (Debian package) on 127.0.0.1 holding 35 minutes of synthetic history at a
30 s scrape interval (utilisation, memory used/total, gpu_up, gpu_host_info), the fake
Kubernetes API server with N nodes, and the profiler with its defaults (30 min window,
k=2, 16 MiB answer cap). The profiler runs as its own process (``gpu-exporter profile
--once``), so its peak RSS (``VmHWM``, which it logs) is its own, not this script's.
Two cycles are timed: the first one patches every node (nothing was annotated yet) and sets
every node's GPUHealthy condition (one nodes/status patch each), the second one finds nothing
changed and must send no patch and no condition write. ``--periodic-only`` makes every GPU
periodic (every GPU needs its utilisation range: the slowest fleet to read and classify);
``--conditions off`` runs the profiler with ``--health-condition off``.

``--store victoriametrics`` reads the same history from a real VictoriaMetrics (Debian's
``victoria-metrics`` with its defaults, the history imported through its own import API);
``--store both`` runs Prometheus and then VictoriaMetrics on one generated history, each with
a fresh fake API server, so that their rows compare.

``run_bench(nodes)`` returns a dict of figures (``run_stores`` one per store); ``python -m
bench.profiler 100 1000 [--periodic-only] [--conditions off] [--store both]`` prints them as a
markdown table.
"""

from __future__ import annotations

import gc
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from exporter.profiler.plan import annotation_bytes
from tests.fakes.profiler_history import (
    GIB,
    GpuHistory,
    idle_shape,
    markov_shape,
    mem_constant,
    mem_leak,
    periodic_shape,
    sample_times,
    steady_shape,
)
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.prom import OpenMetricsWriter, Prometheus
from tests.harness.victoria import VictoriaMetrics

STORES = ("prometheus", "victoriametrics")

GPUS_PER_NODE = 8
INTERVAL = 30.0
SPAN = 35 * 60.0
WINDOW = 30 * 60.0


def _fleet(nodes: int, end: float, seed: int = 7, periodic_only: bool = False) -> list[GpuHistory]:
    """A plausible cluster mix: 30% idle, 25% steady, 20% periodic, 15% bursty, 10% leaking
    (``periodic_only``: every GPU periodic)."""
    rng = random.Random(seed)
    ts = sample_times(end, SPAN, INTERVAL)
    out = []
    for n in range(nodes):
        node = f"node-{n:04d}"
        for g in range(GPUS_PER_NODE):
            r = 0.6 if periodic_only else rng.random()
            srng = random.Random(rng.getrandbits(32))
            u: Callable[[random.Random, list[float]], list[float]]
            if r < 0.30:
                label, u, m = "idle", idle_shape, mem_constant(0.0)
            elif r < 0.55:
                label, u, m = "steady", steady_shape(rng.uniform(0.4, 0.95), 0.03), mem_constant(rng.uniform(0.2, 0.9))
            elif r < 0.75:
                label, u, m = ("periodic", periodic_shape("square", rng.uniform(120, 420), 0.04),
                               mem_constant(rng.uniform(0.3, 0.9)))
            elif r < 0.90:
                label, u, m = ("bursty", markov_shape(0.9, 0.05, 3, 4, 0.03), mem_constant(rng.uniform(0.1, 0.6)))
            else:
                label, u, m = ("growing", steady_shape(0.6, 0.03),
                               mem_leak(0.2, rng.uniform(0.05, 0.3) * 80 * GIB / WINDOW))
            util, mem = u(srng, ts), m(srng, ts, 80 * GIB)
            out.append(GpuHistory(node=node, gpu=str(g), uuid=f"GPU-{n:04d}-{g}", label=label, name=label,
                                  times=ts, util=list(util), mem_used=list(mem), mem_total=80 * GIB))
    return out


def _write(path: Path, hist: list[GpuHistory]) -> int:
    """Exporter-shaped series (node label on every series, as the shipped scrape configs do)."""
    with OpenMetricsWriter(path) as w:
        hosts: dict[str, list[float]] = {}
        for h in hist:
            labels = {"node": h.node, "gpu": h.gpu, "uuid": h.uuid, "instance": f"{h.node}:9400",
                      "job": "gpu-exporter"}
            w.add("gpu_utilization_ratio", labels, zip(h.times, h.util, strict=True))  # type: ignore[arg-type]
            w.add("gpu_memory_used_bytes", labels, zip(h.times, h.mem_used, strict=True))  # type: ignore[arg-type]
            w.add("gpu_memory_total_bytes", labels, [(t, h.mem_total) for t in h.times])
            w.add("gpu_up", labels, [(t, 1.0) for t in h.times])
            hosts.setdefault(h.node, h.times)
        for node, ts in hosts.items():
            w.add("gpu_host_info", {"node": node, "instance": f"{node}:9400", "job": "gpu-exporter",
                                    "cpu_model": "bench", "kernel": "6.1"}, [(t, 1.0) for t in ts])
        samples = w.sample_count
    return samples


def run_bench(nodes: int, periodic_only: bool = False, conditions: bool = True) -> dict[str, Any]:
    """One profiler cycle (and a no-change second cycle) for ``nodes`` x 8 GPUs on Prometheus."""
    return run_stores(nodes, periodic_only, conditions, ("prometheus",))[0]


@contextmanager
def _store(name: str, tmp: Path, history: Path) -> Iterator[tuple[str, int | None]]:
    """A started store holding ``history``: (its URL, its pid)."""
    if name == "prometheus":
        with Prometheus(tmp / "prom", tsdb_blocks_from=history) as prom:
            yield prom.url, prom.pid
    else:
        with VictoriaMetrics(tmp / "vm") as vm:
            vm.import_openmetrics(history)
            yield vm.url, vm.pid


def run_stores(nodes: int, periodic_only: bool = False, conditions: bool = True,
               stores: tuple[str, ...] = STORES) -> list[dict[str, Any]]:
    """:func:`run_bench`'s figures for each store, on one generated history."""
    end = float(int(time.time()) - 30)
    rows = []
    with tempfile.TemporaryDirectory(prefix="profiler-bench-") as tmp:
        t0 = time.perf_counter()
        hist = _fleet(nodes, end, periodic_only=periodic_only)
        history = Path(tmp) / "history.om"
        samples = _write(history, hist)
        gen_s = time.perf_counter() - t0
        # Keep only what the check needs. The fake API server runs in this process: with
        # 80,000 histories alive, its every request paid for garbage-collector passes over them
        # (0.7 ms of CPU a request at 10,000 nodes against 0.3 ms), on the cores the profiler
        # and Prometheus share. A real API server does not run beside the profiler.
        expected = {(h.node, h.gpu): h.label for h in hist}
        node_names = sorted({h.node for h in hist})
        del hist
        gc.collect()
        gc.freeze()
        for store in stores:
            t0 = time.perf_counter()
            with _store(store, Path(tmp) / store, history) as (url, pid), FakeKubeAPI() as api:
                row = _cycles(url, pid, api, node_names, expected, Path(tmp) / store, end, conditions)
                row["setup_s"] = round(time.perf_counter() - t0 - row.pop("cycles_s"), 1)
            rows.append({"nodes": nodes, "store": store,
                         "fleet": ("periodic only" if periodic_only else "mix") + ("" if conditions else
                                                                                   ", conditions off"),
                         "gpus": nodes * GPUS_PER_NODE, "samples": samples, "history_s": round(gen_s, 1), **row})
        gc.unfreeze()
    return rows


def _cycles(url: str, pid: int | None, api: FakeKubeAPI, node_names: list[str], expected: dict[tuple[str, str], str],
            tmp: Path, end: float, conditions: bool) -> dict[str, Any]:
    """The first and the no-change cycle against one store; their figures."""
    t0 = time.perf_counter()
    # The fake server writes headers and body in two segments; with Nagle on, each
    # keep-alive response then waits for a delayed ACK (40 ms). A real API server does
    # not, so switch Nagle off here to time the profiler rather than that artefact.
    api._server.RequestHandlerClass.disable_nagle_algorithm = True  # type: ignore[attr-defined]
    for n in node_names:
        api.add_node(n, annotations={"example.com/owner": "team-a"})
    kubeconfig = api.kubeconfig(tmp / "kubeconfig")
    # evaluated at the history's end: generating 10,000 nodes' history takes minutes
    extra = [] if conditions else ["--health-condition", "off"]
    first = _once(url, kubeconfig, tmp / "first.log", end, pid, extra)
    patches_first, status_first, events_first = _writes(api)
    api.clear_requests()
    second = _once(url, kubeconfig, tmp / "second.log", end, pid, extra)
    patches_second, status_second, events_second = _writes(api)
    got = {(n, k[len("gpu-exporter.io/gpu-"):-len(".pattern")]): v
           for n in api.nodes() for k, v in api.node(n)["metadata"]["annotations"].items()
           if k.startswith("gpu-exporter.io/gpu-") and k.endswith(".pattern")}
    correct = sum(1 for key, label in expected.items() if got.get(key) == label)
    # the GPUs classified otherwise than generated (the first ten): a store's difference shows here
    wrong = sorted(f"{n}/{g}: {label} -> {got.get((n, g))}" for (n, g), label in expected.items()
                   if got.get((n, g)) != label)
    sizes = [annotation_bytes(api.node(n)["metadata"]["annotations"], "gpu-exporter.io") for n in api.nodes()]
    return {
        "cycles_s": time.perf_counter() - t0,
        "cycle_first_s": first["cycle_s"],
        "cycle_steady_s": second["cycle_s"],
        "first_read_classify_write_s": [first["read_s"], first["classify_s"], first["write_s"]],
        "steady_read_classify_write_s": [second["read_s"], second["classify_s"], second["write_s"]],
        "first_cpu_profiler_prometheus_fake_s": [first["cpu_profiler_s"], first["cpu_prometheus_s"],
                                                 first["cpu_fake_api_s"]],
        "steady_cpu_profiler_prometheus_fake_s": [second["cpu_profiler_s"], second["cpu_prometheus_s"],
                                                  second["cpu_fake_api_s"]],
        "queries_per_cycle": first["queries"],
        "shards": first["shards"],
        "queries_second_cycle": second["queries"],
        "patches_first": patches_first,
        "patches_second": patches_second,
        "condition_writes": [first["condition_writes"], second["condition_writes"]],
        "status_writes": [status_first, status_second],
        "events": [events_first, events_second],
        "errors": [first["errors"], second["errors"]],
        "peak_rss_mib": max(first["peak_rss_mib"], second["peak_rss_mib"]),
        "largest_answer_mib": round(max(first["largest_answer"], second["largest_answer"]) / 2**20, 2),
        "classified_as_generated": round(correct / len(expected), 6),  # one GPU in 80,000 shows
        "misclassified": wrong[:10] + ([f"and {len(wrong) - 10} more"] if len(wrong) > 10 else []),
        "max_annotation_bytes": max(sizes) if sizes else 0,
    }


def _writes(api: FakeKubeAPI) -> tuple[int, int, int]:
    """Requests the fake API server received: (Node patches, ``nodes/status`` patches, Event
    writes), counted on the server's side, not from the profiler's log."""
    reqs = api.requests
    return (sum(1 for r in reqs if r.method == "PATCH" and r.resource == "nodes"),
            sum(1 for r in reqs if r.method == "PATCH" and r.resource == "nodes/status"),
            sum(1 for r in reqs if r.method in ("POST", "PATCH") and r.resource == "events"))


_CYCLE = re.compile(r"cycle: ([0-9.]+)s \(read ([0-9.]+)s, classify ([0-9.]+)s, write ([0-9.]+)s\), (\d+) queries "
                    r"in (\d+) shards, largest answer (\d+) bytes, peak RSS ([0-9.]+) MiB, .* (\d+) condition writes, "
                    r"errors: (\S+)")


def _cpu_s(pid: int | None) -> float:
    """User + system CPU seconds a process has used so far (``/proc/PID/stat``); 0 if unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _once(prom_url: str, kubeconfig: Path, log: Path, at: float, prom_pid: int | None = None,
          extra: list[str] | None = None) -> dict[str, Any]:
    """One ``gpu-exporter profile --once`` process: its cycle figures and peak RSS (``VmHWM`` of its own
    image, from its log line; ``ru_maxrss`` would count this large process it was forked from).

    CPU seconds while it ran, per party (the three share this machine's cores): the profiler
    process (start-up included), Prometheus, and this process, which does nothing but serve
    the fake API server meanwhile."""
    argv = [sys.executable, "-m", "exporter", "profile", "--prometheus-url", prom_url, "--kubeconfig",
            str(kubeconfig), "--once", "--at", str(at), "--prometheus-timeout", "60s", *(extra or [])]
    prom0, self0 = _cpu_s(prom_pid), time.process_time()
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # its rusage: CPU of that process alone
        proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = {"cpu_profiler_s": round(usage.ru_utime + usage.ru_stime, 1),
           "cpu_prometheus_s": round(_cpu_s(prom_pid) - prom0, 1),
           "cpu_fake_api_s": round(time.process_time() - self0, 1)}
    text = log.read_text(errors="replace")
    m = _CYCLE.search(text)
    if m is None:
        raise RuntimeError(f"profiler exited {proc.returncode} without a cycle line:\n{text[-2000:]}")
    return {"cycle_s": float(m[1]), "read_s": float(m[2]), "classify_s": float(m[3]), "write_s": float(m[4]),
            "queries": int(m[5]), "shards": int(m[6]), "largest_answer": int(m[7]), "errors": m[10],
            "condition_writes": int(m[9]), "peak_rss_mib": float(m[8]), **cpu}


def to_markdown(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("nodes", "nodes"), ("store", "store"), ("fleet", "fleet"), ("gpus", "GPUs"), ("samples", "samples backfilled"),
        ("cycle_first_s", "first cycle (s)"), ("cycle_steady_s", "no-change cycle (s)"),
        ("queries_per_cycle", "queries / cycle"), ("shards", "shards"), ("patches_first", "patches, first cycle"),
        ("patches_second", "patches, no-change cycle"),
        ("status_writes", "status writes (nodes/status PATCH): first / no-change cycle"),
        ("events", "Events written: first / no-change cycle"),
        ("classified_as_generated", "classified as generated"),
        ("max_annotation_bytes", "largest node annotations (bytes)"),
        ("peak_rss_mib", "profiler peak RSS (MiB)"), ("largest_answer_mib", "largest answer (MiB)"),
    ]
    cols.insert(6, ("first_read_classify_write_s", "first cycle: read / classify / write (s)"))
    cols.insert(7, ("first_cpu_profiler_prometheus_fake_s", "first cycle CPU: profiler / store / fake API (s)"))
    cols.insert(9, ("steady_cpu_profiler_prometheus_fake_s", "no-change cycle CPU: profiler / store / fake API (s)"))

    def cell(v: Any) -> str:
        return " / ".join(str(x) for x in v) if isinstance(v, list) else str(v)

    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(cell(r[k]) for k, _ in cols) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    from bench.run import write_section

    ap = argparse.ArgumentParser(prog="python -m bench.profiler", description="One profiler cycle (first, then "
                                 "no-change) against the real Prometheus and the fake API server, per fleet size.")
    ap.add_argument("nodes", nargs="*", type=int, default=[100, 1000], help="fleet sizes (default: 100 1000)")
    ap.add_argument("--write", type=Path, help="replace the profiler section of this Markdown file")
    ap.add_argument("--periodic-only", action="store_true", help="every GPU periodic (the slowest fleet)")
    ap.add_argument("--conditions", choices=("on", "off"), default="on", help="the GPUHealthy condition")
    ap.add_argument("--store", choices=(*STORES, "both"), default="prometheus",
                    help="where the history is read from (both: Prometheus, then VictoriaMetrics, same history)")
    opts = ap.parse_args()
    target, periodic, conds, counts = opts.write, opts.periodic_only, opts.conditions == "on", opts.nodes
    stores = STORES if opts.store == "both" else (opts.store,)
    rows = []
    for c in counts:
        for row in run_stores(c, periodic_only=periodic, conditions=conds, stores=stores):
            print(row, file=sys.stderr)
            rows.append(row)
    md = to_markdown(rows)
    print(md)
    if target is not None:
        begin, end = "<!-- bench:profiler:begin -->", "<!-- bench:profiler:end -->"
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
        section = (f"{begin}\nRun {time.strftime('%Y-%m-%d %H:%M')} on this machine ({os.cpu_count()} cores, load "
                   f"average {load} at the end), one full cycle against the real store and the fake API server:"
                   f"\n\n{md}\n{end}")
        write_section(target, section, begin, end, "Profiler")
