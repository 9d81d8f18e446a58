"""``make demo``: exporter (simulated GPUs) + Prometheus + profiler ``--dry-run --once``.

1. Starts ``gpu-exporter serve --backend simulated --simulated-scenario mixed
   --simulated-gpus 9`` on 127.0.0.1: one GPU in each state the exporter can show (MIG,
   ECC errors, thermal throttling, lost, XIDs, a memory leak, power-capped, busy but
   SM-starved, healthy), so the live page, the dashboards and the alerts have every state.
2. A classification needs 30 minutes of history, so the demo backfills the last 35
   minutes from the simulated backend's own model (:class:`~exporter.backends.simulated.Model`,
   pure functions of time) with the exact labels the live exporter serves: utilisation,
   memory, SM activity (GPM), XID and uncorrectable-ECC counters and the slowdown reasons
   (what the availability score discounts). The model's faults start with the history, so
   the leak is growing over the whole window. It then starts a private Prometheus (Debian's
   binary, temporary directory) that also scrapes the live exporter from then on.
3. Runs ``gpu-exporter profile --once --dry-run --at <end of the history>`` against it (the
   window is the model's history; the live exporter started its faults afresh), with no
   Kubernetes cluster:
   the profiler plans from Prometheus alone and prints the merge patch it would send.
   (``KUBECONFIG=/dev/null`` is the demo's own choice, so the profiler's "dry run without a
   cluster" warning is replaced by one line saying so.)
   The scrape config has no ``node`` relabelling, so the profiler joins GPU series to
   ``gpu_host_info`` on ``instance`` (the fallback path).

Run: ``.venv/bin/python -m demo.run`` (about 15 s), which exits when the patches are printed and
names no address (nothing listens any more); ``make demo`` passes ``--serve``: the exporter and
Prometheus then keep running, their URLs are printed, and Ctrl-C stops them. Nothing is written
anywhere outside a temporary directory; everything listens on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from exporter.backends import simulated
from tests.harness.exporter import REPO, free_port
from tests.harness.poll import wait_until
from tests.harness.prom import OpenMetricsWriter, Prometheus

NODE = "demo-node"
GPUS = 9
SCENARIO = "mixed"
INTERVAL = 15.0
SPAN = 35 * 60.0


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


def backfill(path: Path, instance: str, job: str, end: float, model: simulated.Model) -> None:
    """History of the simulated GPUs up to ``end`` from the backend's model (a reading the
    model does not report at a time, e.g. a MIG GPU's utilisation, is absent there too)."""
    times = [end - SPAN + (i + 1) * INTERVAL for i in range(int(SPAN // INTERVAL))]
    with OpenMetricsWriter(path) as w:
        for i in range(GPUS):
            labels = {"gpu": str(i), "uuid": f"GPU-5140a7ed-0000-4000-8000-{i:012d}", "instance": instance,
                      "job": job}
            for name, read in (("gpu_utilization_ratio", model.utilization), ("gpu_memory_used_bytes",
                                                                             model.memory_used),
                               ("gpu_sm_active_ratio", model.sm_active)):
                samples = [(t, v) for t in times if (v := read(i, t)) is not None]
                if samples:
                    w.add(name, labels, samples)
            w.add("gpu_memory_total_bytes", labels, [(t, float(simulated.MEMORY_TOTAL)) for t in times])
            w.add("gpu_up", labels, [(t, 1.0 if model.up(i, t) else 0.0) for t in times])
            health(w, labels, times, model, i)
        w.add("gpu_host_info", {"node": NODE, "cpu_model": "demo", "kernel": "demo", "instance": instance,
                                "job": job}, [(t, 1.0) for t in times])


def health(w: OpenMetricsWriter, labels: dict[str, str], times: list[float], model: simulated.Model,
           i: int) -> None:
    """The series the availability score reads: XIDs, uncorrectable ECC errors, slowdown reasons."""
    up = [t for t in times if model.up(i, t)]
    codes = sorted({code for t in up for code in model.xid_counts(i, t)})
    for code in codes:
        samples = [(t, float(n)) for t in up if (n := model.xid_counts(i, t).get(code))]
        w.add("gpu_xid_errors_total", {**labels, "xid": code}, samples, type="counter")
    w.add("gpu_ecc_errors_total", {**labels, "error_type": "uncorrected", "counter": "volatile"},
          [(t, float(model.ecc_uncorrected(i, t))) for t in up], type="counter")
    active = simulated.SLOWDOWN.get(model.state(i), ())
    for reason in sorted({r for rs in simulated.SLOWDOWN.values() for r in rs}):
        w.add("gpu_throttle_reason_active", {**labels, "reason": reason},
              [(t, 1.0 if reason in active else 0.0) for t in up])


def without_own_kubeconfig_warning(log: str) -> str:
    """The profiler's log minus its warning about the cluster the demo itself hid (KUBECONFIG=/dev/null)."""
    lines = log.splitlines(keepends=True)
    kept = [line for line in lines if "dry run without a cluster" not in line]
    if len(kept) < len(lines):
        kept.insert(0, "profiler: no cluster on purpose (the demo sets KUBECONFIG=/dev/null): planning from "
                       "Prometheus alone\n")
    return "".join(kept)


def serve_until_interrupted(urls: dict[str, str]) -> None:
    """Print what still listens and wait for Ctrl-C (SIGINT) or SIGTERM."""
    import signal
    import threading

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    lines = "".join(f"  {name}: {url}\n" for name, url in urls.items())
    sys.stderr.write(f"serving until Ctrl-C:\n{lines}")
    sys.stderr.flush()
    stop.wait()


def main(argv: list[str] | None = None) -> int:
    keep = "--serve" in (sys.argv[1:] if argv is None else argv)
    port = free_port()
    env = {**os.environ, "NODE_NAME": NODE, "PYTHONPATH": str(REPO)}
    for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        env.pop(var, None)
    env["KUBECONFIG"] = os.devnull  # never a real cluster: the demo plans from Prometheus alone
    exporter = subprocess.Popen(
        [sys.executable, "-m", "exporter", "serve", "--backend", "simulated", "--simulated-gpus", str(GPUS),
         "--simulated-scenario", SCENARIO, "--address", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=REPO, env=env)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        wait_until(lambda: "gpu_utilization_ratio" in _scrape(url), timeout=30, what="the exporter")
        # history ends a scrape interval ago; its faults start with it (the live exporter's
        # started at its first scrape, just now)
        end = time.time() - INTERVAL
        model = simulated.Model(SCENARIO, GPUS, end - SPAN)
        # no address here: without --serve nothing listens once the patches are printed
        print(f"exporter: {GPUS} simulated GPUs ({SCENARIO}: {', '.join(model.state(i) for i in range(GPUS))})",
              file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="gpu-exporter-demo-") as tmp:
            history = Path(tmp) / "history.om"
            # the job the shipped scrape configs give the exporter: the profiler trusts a target's own
            # node names (gpu_host_info) only from the exporters' jobs (--source-job, docs/profiler.md)
            backfill(history, f"127.0.0.1:{port}", "gpu-exporter", end, model)
            with Prometheus(Path(tmp) / "prometheus", scrape_targets=[f"127.0.0.1:{port}"], job_name="gpu-exporter",
                            scrape_interval="15s", tsdb_blocks_from=history) as prom:
                prom.wait_for_up(f"127.0.0.1:{port}")
                print("prometheus: 35 min backfilled from the simulated model", file=sys.stderr)
                proc = subprocess.run(
                    [sys.executable, "-m", "exporter", "profile", "--once", "--dry-run", "--at", f"{end:.3f}",
                     "--prometheus-url", prom.url, "--log-level", "warning"],
                    cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
                sys.stderr.write(without_own_kubeconfig_warning(proc.stderr))
                if proc.returncode != 0:
                    print(f"profiler exited {proc.returncode}", file=sys.stderr)
                    return proc.returncode
                print_patches(proc.stdout)
                sys.stdout.flush()
                if keep:
                    serve_until_interrupted({"live page": f"http://127.0.0.1:{port}/", "metrics": url,
                                             "prometheus": f"{prom.url}/graph"})
        return 0
    finally:
        exporter.terminate()
        exporter.wait(10)


def print_patches(out: str) -> None:
    """The profiler's dry-run lines as annotations and Node conditions, per node."""
    print("profiler --dry-run --once: the merge patches it would send\n")
    for line in out.splitlines():
        doc = json.loads(line)
        patch = doc["patch"]
        if "metadata" in patch:  # the annotations (docs/annotations.md)
            print(f"node {doc['node']}:")
            for key, value in patch["metadata"]["annotations"].items():
                print(f"  {key}: {value}")
        for cond in patch.get("status", {}).get("conditions", []):  # the GPUHealthy Node condition
            print(f"node {doc['node']} condition {cond.get('type')}={cond.get('status')} "
                  f"({cond.get('reason')}): {cond.get('message')}")


if __name__ == "__main__":
    sys.exit(main())
