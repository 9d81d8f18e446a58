"""Issue 28, finding 4: ``make demo`` prints what it advertises, and docs/annotations.md shows the
block it really prints.

The demo runs the simulated ``mixed`` fleet (one GPU per state) through a real Prometheus and the
profiler. The leaking GPU must come out ``growing``, the SM-starved one ``underused`` (the backfill
has SM activity), and the XID GPU neither leaking nor the best GPU: the availability score
discounts XIDs, uncorrectable ECC errors and throttling, so the best GPU is a healthy one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.harness.exporter import REPO

PREFIX = "gpu-exporter.io/"


@pytest.fixture(scope="module")
def demo() -> tuple[dict[int, str], dict[str, str]]:
    """(GPU index -> simulated state, annotation key -> value) from one real ``make demo`` run."""
    proc = subprocess.run([sys.executable, "-m", "demo.run"], cwd=REPO, env=dict(os.environ), capture_output=True,
                          text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # issue 38, item 16: once it has exited nothing listens, so it names no address to visit
    assert "http://" not in proc.stdout + proc.stderr, proc.stderr
    states = re.search(r"simulated GPUs \(mixed: ([a-z_, ]+)\)", proc.stderr)
    assert states, proc.stderr
    by_index = dict(enumerate(s.strip() for s in states.group(1).split(",")))
    annotations = dict(re.findall(rf"^  ({re.escape(PREFIX)}\S+): (.*)$", proc.stdout, re.M))
    assert annotations, proc.stdout
    return by_index, annotations


def _gpu_in(states: dict[int, str], state: str) -> int:
    (index,) = [i for i, s in states.items() if s == state]
    return index


@pytest.mark.prometheus
def test_demo_patterns_are_the_states_it_advertises(demo: tuple[dict[int, str], dict[str, str]]) -> None:
    states, ann = demo
    pattern = {i: ann.get(f"{PREFIX}gpu-{i}.pattern") for i in states}
    assert pattern[_gpu_in(states, "leak")] == "growing", pattern
    assert pattern[_gpu_in(states, "starved")] == "underused", pattern
    assert pattern[_gpu_in(states, "xid")] != "growing", pattern
    assert pattern[_gpu_in(states, "lost")] == "unknown", pattern
    growing = [i for i, p in pattern.items() if p == "growing"]
    assert growing == [_gpu_in(states, "leak")], pattern


@pytest.mark.prometheus
def test_best_gpu_is_a_healthy_one(demo: tuple[dict[int, str], dict[str, str]]) -> None:
    states, ann = demo
    best = int(ann[f"{PREFIX}best-gpu"])
    assert states[best] == "healthy", f"best-gpu {best} is {states[best]}"


@pytest.mark.prometheus
def test_docs_show_the_block_the_demo_prints(demo: tuple[dict[int, str], dict[str, str]]) -> None:
    """docs/annotations.md's `kubectl describe node` block holds the demo's annotations: the same
    keys and values; the score, a window mean of random bursts, within 0.08."""
    states, ann = demo
    text = (REPO / "docs" / "annotations.md").read_text()
    block = re.search(r"## What `kubectl describe node` shows\n\n```\n(.*?)```", text, re.S)
    assert block
    documented = dict(re.findall(rf"({re.escape(PREFIX)}\S+): (.*)$", block.group(1), re.M))
    # The healthy GPU runs the simulator's random bursts: a run may (rarely) find a period in them,
    # which adds its period-seconds key. Everything else is the same in every run.
    healthy = f"gpu-{_gpu_in(states, 'healthy')}."
    chance = {f"{PREFIX}{healthy}pattern", f"{PREFIX}{healthy}period-seconds", f"{PREFIX}owned-keys"}
    ann = {k: v for k, v in ann.items() if k not in chance}
    assert documented[f"{PREFIX}{healthy}pattern"] == "bursty"
    documented = {k: v for k, v in documented.items() if k not in chance}
    assert set(documented) == set(ann), sorted(set(documented) ^ set(ann))
    for key, value in ann.items():
        if key.endswith("best-gpu-score"):
            # a window mean of the healthy GPU's bursts, which the simulator draws per 5 s slot of the
            # wall clock: over 400 windows of its model the score spread 0.62-0.72 (median 0.67, standard
            # deviation 0.017), and real runs gave 0.61 to 0.69; 0.05 failed about one run in three
            assert abs(float(documented[key]) - float(value)) <= 0.08, (key, documented[key], value)
        else:
            assert documented[key] == value, (key, documented[key], value)
    assert f"its {len(demo[0])} simulated GPUs" in text


@pytest.mark.prometheus
def test_make_demo_serves_what_it_prints_until_ctrl_c() -> None:
    """Issue 38, item 16: `make demo` (demo.run --serve) printed URLs that were dead once it exited.
    It now keeps the exporter and Prometheus up, prints their URLs, each answers, and Ctrl-C stops it."""
    import signal
    import urllib.request

    assert "-m demo.run --serve" in (REPO / "Makefile").read_text()
    proc = subprocess.Popen([sys.executable, "-m", "demo.run", "--serve"], cwd=REPO, env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:  # the line that says it serves, then one line per URL
            lines.append(line)
            if line.startswith("serving until Ctrl-C"):
                break
        urls = [proc.stderr.readline().split(": ", 1)[1].strip() for _ in range(3)]
        assert len(urls) == 3 and all(u.startswith("http://127.0.0.1:") for u in urls), "".join(lines)
        for url in urls:
            with urllib.request.urlopen(url, timeout=10) as r:
                assert r.status == 200, url
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
