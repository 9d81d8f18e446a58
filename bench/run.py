"""``make bench``: the exporter over the fake NVML library, against the Python peer.

Measures, for 1, 8 and 64 fake GPUs:
- collection time per cycle (backend only, and backend + render), in-process;
- scrape latency p50/p99 with 1 scraper and with 50 concurrent scrapers (keep-alive
  connections, as Prometheus uses), and errors;
- exporter RSS before and after 10,000 scrapes;
- CPU seconds per scrape (utime + stime of the server process / scrapes).

The peer is nvitop-exporter (PyPI, bench extra) over the same fake library and fleet.
Everything talks to 127.0.0.1 only. Results go to a markdown table (``--write FILE``
replaces the section between the bench markers).

The fake fleet supports GPM (``gpm_supported=1``, as a Hopper GPU) unless ``--no-gpm``.
``--gpm-compare N`` measures only our exporter at N GPUs, with GPM on and off side by side
(collection, and scrapes in the default configuration), into its own section.
``--per-pod GxP`` measures only per-pod attribution on shared GPUs (``--per-process``) at G GPUs
with P processes each, into its own section.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fakes.fakenvml import FakeNvml, build_library
from tests.harness.exporter import REPO, free_port
from tests.harness.poll import wait_until

BEGIN, END = "<!-- bench:exporter:begin -->", "<!-- bench:exporter:end -->"
GPM_BEGIN, GPM_END = "<!-- bench:gpm:begin -->", "<!-- bench:gpm:end -->"
CLK_TCK = os.sysconf("SC_CLK_TCK")

COLLECT_SCRIPT = r"""
import json, sys, time
from exporter.core.options import BackendOptions
from exporter.backends.nvml import NvmlBackend
from exporter.core.readings import Collection, HostInfo
from exporter.core.snapshot import BackendStats, Snapshot
from exporter.serve.render import render
from exporter.core.options import FieldFilter
n = int(sys.argv[1])
b = NvmlBackend(BackendOptions())
b.init()
for _ in range(20):
    b.collect(Collection("nvml"))
t0 = time.perf_counter()
for _ in range(n):
    b.collect(Collection("nvml"))
collect = (time.perf_counter() - t0) / n
host = HostInfo("bench", "cpu", "kernel")
t0 = time.perf_counter()
for _ in range(n):
    c = Collection("nvml")
    b.collect(c)
    render(Snapshot([c], host, {"nvml": BackendStats(success=True)}, 0.0), FieldFilter())
both = (time.perf_counter() - t0) / n
print(json.dumps({"collect_s": collect, "collect_render_s": both, "gpus": len(c.gpus)}))
"""


PER_POD_BEGIN, PER_POD_END = "<!-- bench:per-pod:begin -->", "<!-- bench:per-pod:end -->"
# --per-pod: what per-pod attribution on shared GPUs adds (issue 25), measured alone, in-process:
# the backend's per-process vendor calls (collection with --per-process minus without), the
# background build (a /proc/<pid>/cgroup read per process, the pod lookup, the sums) and the
# rendering of its families on the scrape path.
PER_POD_SCRIPT = r"""
import json, sys, time
from pathlib import Path
from exporter.backends.nvml import NvmlBackend
from exporter.core.options import BackendOptions
from exporter.core.readings import Collection
from exporter.k8s.processes import build, index_pods, render
n, proc_root = int(sys.argv[1]), sys.argv[2]
pods = json.loads(Path(sys.argv[3]).read_text())

def batch(fn, reps):
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps

def timed(*fns, reps=n):
    # the best of 5 batches, the functions' batches interleaved: on a busy machine the minimum
    # is the least disturbed figure, and interleaving exposes both to the same load
    for fn in fns:
        batch(fn, 20)
    best = [float("inf")] * len(fns)
    for _ in range(5):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], batch(fn, max(1, reps // 5)))
    return best if len(fns) > 1 else best[0]

off, on = NvmlBackend(BackendOptions()), NvmlBackend(BackendOptions(per_process=True))
off.init()
on.init()
c_off, c_on = timed(lambda: off.collect(Collection("nvml")), lambda: on.collect(Collection("nvml")))
coll = Collection("nvml")
on.collect(coll)
index = index_pods(pods)
view = build(coll.gpus, index, proc_root)
b = timed(lambda: build(coll.gpus, index, proc_root))
r = timed(lambda: render(view))
series = sum(len(rows) for _, _, rows in view.gpus)
print(json.dumps({"collect_off_s": c_off, "collect_on_s": c_on, "build_s": b, "render_s": r,
                  "processes": sum(len(g.process_pids or ()) for g in coll.gpus), "pod_series": series,
                  "mapped": view.processes["in_pod"]}))
"""


@dataclass
class ServerFigures:
    p50_1: float = 0.0
    p99_1: float = 0.0
    p50_50: float = 0.0
    p99_50: float = 0.0
    errors_50: int = 0
    rss_before_mib: float = 0.0
    rss_after_mib: float = 0.0
    cpu_per_scrape_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def _proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _proc_cpu_s(pid: int) -> float:
    fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields_[11]) + int(fields_[12])) / CLK_TCK


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def _scraper(port: int, path: str, n: int, lat: list[float], errors: list[str]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                errors.append(str(resp.status))
        except (OSError, http.client.HTTPException) as exc:
            errors.append(type(exc).__name__)
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        lat.append(time.perf_counter() - t0)
    conn.close()


def measure_server(cmd: list[str], env: dict[str, str], port: int, path: str, scrapes: int) -> ServerFigures:
    log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process it logs
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    fig = ServerFigures()
    try:
        def up() -> bool:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"{cmd[0]} exited: {log.read().decode(errors='replace')[-2000:]}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", path)
                r = c.getresponse()
                body = r.read()
                return r.status == 200 and b"gpu" in body.lower()
            except OSError:
                return False

        wait_until(up, 60, what=f"{cmd[0]} serving")
        warm: list[float] = []
        _scraper(port, path, 200, warm, [])
        lat1: list[float] = []
        _scraper(port, path, 1000, lat1, [])
        fig.p50_1, fig.p99_1 = _pct(lat1, 50), _pct(lat1, 99)

        lat50: list[float] = []
        errs: list[str] = []
        threads = [threading.Thread(target=_scraper, args=(port, path, 40, lat50, errs)) for _ in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        fig.p50_50, fig.p99_50, fig.errors_50 = _pct(lat50, 50), _pct(lat50, 99), len(errs)

        fig.rss_before_mib = _proc_rss_mib(proc.pid)
        cpu0 = _proc_cpu_s(proc.pid)
        _scraper(port, path, scrapes, [], errs)
        fig.cpu_per_scrape_s = (_proc_cpu_s(proc.pid) - cpu0) / scrapes
        fig.rss_after_mib = _proc_rss_mib(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    return fig


def measure_collection(env: dict[str, str], n: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", COLLECT_SCRIPT, str(n)], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=600, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _fleet(tmp: str, n: int, gpm: bool) -> FakeNvml:
    """``n`` fake GPUs; ``gpm`` False: nvmlGpmQueryDeviceSupport says no on every GPU (pre-Hopper)."""
    path = Path(tmp) / "fleet.conf"
    return FakeNvml(path, gpus=n) if gpm else FakeNvml(path, gpus=n, gpm_supported=0)


def _serve_cmd(port: int, tmp: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "exporter", "serve", "--backend", "nvml", "--address", "127.0.0.1",
            "--port", str(port), "--sysfs-root", tmp, *extra]


def run_gpm(n: int, scrapes: int) -> list[dict[str, object]]:
    """Our exporter at ``n`` GPUs with GPM on, then off: collection and default-configuration scrapes."""
    rows: list[dict[str, object]] = []
    build_library()
    for gpm in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, **_fleet(tmp, n, gpm).env(), "PYTHONUNBUFFERED": "1"}
            coll = measure_collection(env, 500)
            assert coll["gpus"] == n, coll
            port = free_port()
            ours = measure_server(_serve_cmd(port, tmp), env, port, "/metrics", scrapes)
            row: dict[str, object] = {"gpus": n, "gpm": gpm, "collect": coll, "ours": ours}
            rows.append(row)
            print(json.dumps(row, default=vars), flush=True)
    return rows


def run(gpu_counts: list[int], scrapes: int, peer: bool, gpm: bool = True) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    build_library()
    for n in gpu_counts:
        with tempfile.TemporaryDirectory() as tmp:
            fleet = _fleet(tmp, n, gpm)
            env = {**os.environ, **fleet.env(), "PYTHONUNBUFFERED": "1"}
            coll = measure_collection(env, 500 if n <= 8 else 100)
            assert coll["gpus"] == n, coll
            port = free_port()
            ours = measure_server(_serve_cmd(port, tmp), env, port, "/metrics", scrapes)
            port = free_port()
            nocache = measure_server(_serve_cmd(port, tmp, "--cache-ttl", "0"), env, port, "/metrics", scrapes)
            row: dict[str, object] = {"gpus": n, "collect": coll, "ours": ours, "ours_nocache": nocache}
            if peer and shutil.which("nvitop-exporter", path=str(Path(sys.executable).parent)):
                port = free_port()
                exe = str(Path(sys.executable).parent / "nvitop-exporter")
                try:
                    row["peer"] = measure_server([exe, "--bind-address", "127.0.0.1", "--port", str(port)],
                                                 env, port, "/metrics", scrapes)
                except RuntimeError as exc:
                    row["peer_error"] = str(exc).splitlines()[0][:200]
            rows.append(row)
            print(json.dumps(row, default=vars), flush=True)
    return rows


def run_per_pod(gpus: int, procs: int, reps: int = 500) -> dict[str, float]:
    """Per-pod attribution at ``gpus`` GPUs with ``procs`` time-slicing processes each, two per pod."""
    from tests.fakes.fakenvml import time_slicing

    build_library()
    with tempfile.TemporaryDirectory() as tmp:
        fleet = FakeNvml(Path(tmp) / "fleet.conf", gpus=gpus)
        proc = Path(tmp) / "proc"
        pods: dict[str, Any] = {}
        (proc / "self").mkdir(parents=True)
        for g in range(gpus):
            rows = []
            for k in range(procs):
                pid = 10_000 + g * procs + k
                pod_uid = f"{g:08x}-0000-4000-8000-{k // 2:012x}"
                cid = f"{pid:064x}"
                (proc / str(pid)).mkdir()
                (proc / str(pid) / "cgroup").write_text(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                    f"{pod_uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n")
                entry = pods.setdefault(pod_uid, {"metadata": {"name": f"p{g}-{k // 2}", "namespace": "ml",
                                                                "uid": pod_uid}, "status": {"containerStatuses": []}})
                entry["status"]["containerStatuses"].append({"name": f"c{k % 2}", "containerID": f"containerd://{cid}"})
                rows.append((pid, (k + 1) << 28, k % 7 * 5))
            time_slicing(fleet, g, rows)
        (Path(tmp) / "pods.json").write_text(json.dumps(pods))
        env = {**os.environ, **fleet.env(), "PYTHONUNBUFFERED": "1"}
        out = subprocess.run([sys.executable, "-c", PER_POD_SCRIPT, str(reps), str(proc), str(Path(tmp) / "pods.json")],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=600, check=True)
    row = dict(json.loads(out.stdout.strip().splitlines()[-1]))
    assert row["processes"] == gpus * procs and row["mapped"] == gpus * procs, row
    return row


def per_pod_markdown(gpus: int, procs: int, row: dict[str, float]) -> str:
    extra = row["collect_on_s"] - row["collect_off_s"]
    return "\n".join([
        PER_POD_BEGIN,
        f"{_machine()}; fake `libnvidia-ml.so.1`, {gpus} GPUs time-sliced by {procs} processes each "
        f"({gpus * procs} processes, two per pod, {int(row['pod_series'])} pod series per family), cgroup v2 "
        "systemd/containerd paths in a fake `/proc`. Measured alone, in-process: the best of 5 batches of 100, "
        "with and without `--per-process` interleaved.",
        *_load_warning(),
        "",
        "| part | where it runs | time (ms) |",
        "|---|---|---|",
        f"| per-process vendor calls (collection with `--per-process` {_ms(row['collect_on_s'])} minus without "
        f"{_ms(row['collect_off_s'])}) | collection | {_ms(extra)} |",
        f"| per-pod build: {gpus * procs} `/proc/<pid>/cgroup` reads, pod lookups, sums | background thread "
        f"| {_ms(row['build_s'])} |",
        f"| rendering the per-pod families | scrape | {_ms(row['render_s'])} |",
        PER_POD_END,
    ])


def _ms(x: float) -> str:
    return f"{x * 1000:.2f}"


def _machine() -> str:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"Run {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores ({cpu}), Linux {platform.release()}, "
            f"Python {platform.python_version()}, load average (1/5/15 min) {load} at the end")


def _load_warning() -> list[str]:
    """A line saying the figures are inflated when other work kept the machine busier than its cores."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    if load <= cores:
        return []
    return ["", f"**Loaded machine**: a 1-minute load average of {load:.1f} on {cores} cores at the end of the "
                "run (other processes competing for the CPU): the figures are inflated by waiting for a core and "
                "say nothing about the targets; compare rows of the same run only, and rerun on an idle machine."]


def gpm_markdown(rows: list[dict[str, object]], scrapes: int) -> str:
    """The GPM on/off comparison (``--gpm-compare``) as its own marked section."""
    lines = [
        GPM_BEGIN,
        f"{_machine()}; fake `libnvidia-ml.so.1`, all default fields, default configuration (cache-ttl 1 s). "
        f"GPM on: two GPM samples per GPU per collection (nvmlGpmSampleGet, nvmlGpmMetricsGet) and the "
        f"activity families on /metrics; off: `gpm_supported=0` (nvmlGpmQueryDeviceSupport says no). "
        f"CPU per scrape over {scrapes:,} scrapes.",
        *_load_warning(),
        "",
        "| GPUs | GPM | collection (ms) | collection + render (ms) | p50 1 scraper (ms) | p99 1 scraper (ms) "
        "| p50 50 scrapers (ms) | p99 50 scrapers (ms) | errors (50) | RSS end (MiB) | CPU per scrape (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        coll, fig = row["collect"], row["ours"]
        assert isinstance(coll, dict) and isinstance(fig, ServerFigures)
        lines.append(
            f"| {row['gpus']} | {'on' if row['gpm'] else 'off'} | {_ms(coll['collect_s'])} "
            f"| {_ms(coll['collect_render_s'])} | {_ms(fig.p50_1)} | {_ms(fig.p99_1)} | {_ms(fig.p50_50)} "
            f"| {_ms(fig.p99_50)} | {fig.errors_50} | {fig.rss_after_mib:.1f} | {_ms(fig.cpu_per_scrape_s)} |")
    lines.append(GPM_END)
    return "\n".join(lines)


def to_markdown(rows: list[dict[str, object]], scrapes: int, gpm: bool = True) -> str:
    lines = [
        BEGIN,
        f"{_machine()}; fake `libnvidia-ml.so.1` (tests/fakes/fake_nvml), all default fields, GPM "
        f"{'supported (Hopper-like)' if gpm else 'off (gpm_supported=0)'}. "
        f"RSS after {scrapes:,} scrapes. Latencies are client-side over keep-alive connections on 127.0.0.1.",
        *_load_warning(),
        "",
        "| GPUs | exporter | collection (ms) | collection + render (ms) | p50 1 scraper (ms) | p99 1 scraper (ms) "
        "| p50 50 scrapers (ms) | p99 50 scrapers (ms) | errors (50) | RSS start (MiB) | RSS end (MiB) "
        "| CPU per scrape (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        n = row["gpus"]
        coll = row["collect"]
        assert isinstance(coll, dict)
        for who in ("ours", "ours_nocache", "peer"):
            fig = row.get(who)
            if not isinstance(fig, ServerFigures):
                continue
            name = {"ours": "gpu-exporter (default, cache-ttl 1 s)",
                    "ours_nocache": "gpu-exporter (cache-ttl 0: collect on every scrape)",
                    "peer": "nvitop-exporter 1.7 (peer)"}[who]
            c1 = _ms(coll["collect_s"]) if who != "peer" else "n/a (1 s loop)"
            c2 = _ms(coll["collect_render_s"]) if who != "peer" else "n/a"
            lines.append(
                f"| {n} | {name} | {c1} | {c2} | {_ms(fig.p50_1)} | {_ms(fig.p99_1)} | {_ms(fig.p50_50)} "
                f"| {_ms(fig.p99_50)} | {fig.errors_50} | {fig.rss_before_mib:.1f} | {fig.rss_after_mib:.1f} "
                f"| {_ms(fig.cpu_per_scrape_s)} |"
            )
        if "peer_error" in row:
            lines.append(f"| {n} | nvitop-exporter (peer) | failed: {row['peer_error']} |||||||||| |")
    lines += ["", "Ratios (peer / ours; above 1 means we are better):", ""]
    lines.append("| GPUs | p50 1 | p99 1 | p99 50 | RSS end | CPU per scrape |")
    lines.append("|---|---|---|---|---|---|")
    for row in rows:
        ours, peer = row.get("ours"), row.get("peer")
        if isinstance(ours, ServerFigures) and isinstance(peer, ServerFigures):
            def ratio(f: Callable[[ServerFigures], float], o: ServerFigures = ours, p: ServerFigures = peer) -> str:
                a, b = f(o), f(p)
                return f"{b / a:.1f}x" if a > 0 else "n/a"

            lines.append(
                f"| {row['gpus']} | {ratio(lambda f: f.p50_1)} | {ratio(lambda f: f.p99_1)} "
                f"| {ratio(lambda f: f.p99_50)} | {ratio(lambda f: f.rss_after_mib)} "
                f"| {ratio(lambda f: f.cpu_per_scrape_s)} |"
            )
    lines.append(END)
    return "\n".join(lines)


def write_section(path: Path, section: str, begin: str = BEGIN, end: str = END, title: str = "Exporter") -> None:
    """Replace the text between ``begin`` and ``end`` in ``path`` (``section`` includes the markers)."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        text = head + section + tail
    else:
        text = text.rstrip() + f"\n\n## {title}\n\n" + section + "\n"
    path.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gpus", default="1,8,64")
    ap.add_argument("--scrapes", type=int, default=10_000)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--no-gpm", action="store_true", help="fake GPUs without GPM (gpm_supported=0)")
    ap.add_argument("--gpm-compare", type=int, metavar="N",
                    help="only our exporter at N GPUs, GPM on and off side by side (its own section)")
    ap.add_argument("--per-pod", metavar="GPUSxPROCS",
                    help="only the cost of per-pod attribution on shared GPUs, e.g. 8x16 (its own section)")
    ap.add_argument("--write", type=Path)
    a = ap.parse_args()
    if a.per_pod is not None:
        try:
            g, n = (int(x) for x in a.per_pod.lower().split("x"))
        except ValueError:
            ap.error(f"--per-pod takes GPUSxPROCESSES, e.g. 8x16, not {a.per_pod!r}")
        if not (1 <= g <= 64 and 1 <= n <= 64):
            ap.error("--per-pod: 1-64 GPUs and 1-64 processes per GPU (the fake's limits)")
        md = per_pod_markdown(g, n, run_per_pod(g, n))
        print(md)
        if a.write:
            write_section(a.write, md, PER_POD_BEGIN, PER_POD_END, "Per-pod attribution on shared GPUs")
        return 0
    if a.gpm_compare is not None:
        if a.no_gpm or not 1 <= a.gpm_compare <= 64:
            ap.error("--gpm-compare takes a GPU count of 1 to 64 and measures both states: drop --no-gpm")
        md = gpm_markdown(run_gpm(a.gpm_compare, a.scrapes), a.scrapes)
        print(md)
        if a.write:
            write_section(a.write, md, GPM_BEGIN, GPM_END, "GPM on and off")
        return 0
    rows = run([int(x) for x in a.gpus.split(",")], a.scrapes, not a.no_peer, gpm=not a.no_gpm)
    md = to_markdown(rows, a.scrapes, gpm=not a.no_gpm)
    print(md)
    if a.write:
        write_section(a.write, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
