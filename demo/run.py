"""``make demo``: exporter (simulated GPUs) + Prometheus + profiler ``--dry-run --once``.

1. Starts ``gpu-exporter serve --backend simulated --simulated-gpus 5`` on 127.0.0.1
   (GPUs: idle, steady, periodic 60 s, bursty, leaking memory).
2. A classification needs 30 minutes of history, so the demo backfills the last 35
   minutes from the simulated backend's own model (``utilization_at``/``memory_used_at``,
   pure functions of time) with the exact labels the live exporter serves, then starts a
   private Prometheus (Debian's binary, temporary directory) that also scrapes the live
   exporter from then on.
3. Runs ``gpu-exporter profile --once --dry-run`` against it, with no Kubernetes cluster:
   the profiler plans from Prometheus alone and prints the merge patch it would send.
   The scrape config has no ``node`` relabelling, so the profiler joins GPU series to
   ``gpu_host_info`` on ``instance`` (the fallback path).

Run: ``.venv/bin/python -m demo.run`` (about 15 s). Nothing is written anywhere outside
a temporary directory; everything listens on 127.0.0.1.
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
GPUS = 5
INTERVAL = 15.0
SPAN = 35 * 60.0


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


def backfill(path: Path, instance: str, job: str, end: float) -> None:
    """History of the simulated GPUs up to ``end`` from the backend's model."""
    times = [end - SPAN + i * INTERVAL for i in range(int(SPAN // INTERVAL))]
    with OpenMetricsWriter(path) as w:
        for i in range(GPUS):
            labels = {"gpu": str(i), "uuid": f"GPU-5140a7ed-0000-4000-8000-{i:012d}", "instance": instance,
                      "job": job}
            util = [(t, simulated.utilization_at(i, t)) for t in times]
            used = [(t, simulated.memory_used_at(i, t)) for t in times]
            w.add("gpu_utilization_ratio", labels, util)
            w.add("gpu_memory_used_bytes", labels, used)
            w.add("gpu_memory_total_bytes", labels, [(t, float(simulated.MEMORY_TOTAL)) for t in times])
            w.add("gpu_up", labels, [(t, 1.0) for t in times])
        w.add("gpu_host_info", {"node": NODE, "cpu_model": "demo", "kernel": "demo", "instance": instance,
                                "job": job}, [(t, 1.0) for t in times])


def main() -> int:
    port = free_port()
    env = {**os.environ, "NODE_NAME": NODE, "PYTHONPATH": str(REPO)}
    for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        env.pop(var, None)
    env["KUBECONFIG"] = os.devnull  # never a real cluster: the demo plans from Prometheus alone
    exporter = subprocess.Popen(
        [sys.executable, "-m", "exporter", "serve", "--backend", "simulated", "--simulated-gpus", str(GPUS),
         "--address", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=REPO, env=env)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        wait_until(lambda: "gpu_utilization_ratio" in _scrape(url), timeout=30, what="the exporter")
        print(f"exporter: simulated GPUs on {url}", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="gpu-exporter-demo-") as tmp:
            history = Path(tmp) / "history.om"
            # history ends a scrape interval ago; the live scrapes continue the same series
            backfill(history, f"127.0.0.1:{port}", "targets", time.time() - INTERVAL)
            with Prometheus(Path(tmp) / "prometheus", scrape_targets=[f"127.0.0.1:{port}"],
                            scrape_interval="15s", tsdb_blocks_from=history) as prom:
                prom.wait_for_up(f"127.0.0.1:{port}")
                print(f"prometheus: {prom.url} (35 min backfilled from the simulated model)", file=sys.stderr)
                proc = subprocess.run(
                    [sys.executable, "-m", "exporter", "profile", "--once", "--dry-run",
                     "--prometheus-url", prom.url, "--log-level", "warning"],
                    cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        sys.stderr.write(proc.stderr)
        if proc.returncode != 0:
            print(f"profiler exited {proc.returncode}", file=sys.stderr)
            return proc.returncode
        print("profiler --dry-run --once: the merge patch it would send\n")
        for line in proc.stdout.splitlines():
            doc = json.loads(line)
            print(f"node {doc['node']}:")
            for key, value in doc["patch"]["metadata"]["annotations"].items():
                print(f"  {key}: {value}")
        return 0
    finally:
        exporter.terminate()
        exporter.wait(10)


if __name__ == "__main__":
    sys.exit(main())
