"""The profiler's memory under hostile Prometheus answers, measured on the real process (issue 26).

Answers of 15 MiB of ``[{},{},...]``, under the 16 MiB byte cap, took the profiler to 2.3 GiB
resident with six answers in flight, while its Deployment allows 256 MiB. Here a fake
Prometheus on 127.0.0.1 answers the two discovery queries with a large fleet (so that a cycle
has its three aggregates and the next shard's three in flight at once) and every other query
with a hostile answer just under the byte cap. The real ``gpu-exporter profile`` process runs
its loop against it and a fake API server; its peak resident set (``VmHWM``) must stay below
the memory limit that deploy/base/profiler-deployment.yaml and the Helm chart give it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.harness.httpfake import Reply, Request, json_reply
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.poll import wait_until
from tests.harness.prom import FakePrometheus, free_port

ROOT = Path(__file__).resolve().parents[3]
CAP = 16 * 1024 * 1024
SIZE = 15 * 1024 * 1024  # under the cap, as in the finding
NODES = 600  # several shards: a shard's aggregates and the next shard's are in flight together (6 at most)


def _fill(unit: bytes, head: bytes, tail: bytes) -> bytes:
    n = (SIZE - len(head) - len(tail)) // (len(unit) + 1)
    return head + b",".join([unit] * n) + tail


def _vector_sample(i: int) -> bytes:
    return (b'{"metric":{"node":"n-%d","gpu":"%d","uuid":"GPU-5140a7ed-0000-4000-8000-%012d","stat":"mean"},'
            b'"value":[1700000000.123,"0.5"]}' % (i // 8, i % 8, i))


RESULT = b'{"status":"success","data":{"resultType":"vector","result":'
HOSTILE: dict[str, Callable[[], bytes]] = {
    # the finding: the document is an array of empty objects
    "empty objects": lambda: _fill(b"{}", b"[", b"]"),
    # one-key objects where the result list belongs: the most memory per byte of the shapes
    # measured (ParseCost; the others are refused in tests/unit/profiler/test_prom.py)
    "one-key objects": lambda: _fill(b'{"":0}', RESULT + b"[", b"]}}"),
    # a well-formed vector, as a real Prometheus could send for a huge shard
    "valid vector": lambda: RESULT + b"[" + b",".join(_vector_sample(i) for i in range(SIZE // 140)) + b"]}}",
    # a valid answer padded with whitespace: cheap to parse, so every one in flight is read whole
    "padded": lambda: RESULT + b"[" + _vector_sample(0) + b" " * (SIZE - 400) + b"]}}",
}


class HostileProm(FakePrometheus):
    """Discovery queries get a fleet of NODES nodes; every other query gets ``body`` (``answered`` counts
    those, under ``lock``)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.answered = 0
        nodes = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"node": f"n-{i}", "source": "gpu-exporter"}, "value": [1700000000, "8"]}
            for i in range(NODES)]}}).encode()
        zero = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {}, "value": [1700000000, "0"]}]}}).encode()

        def answer(req: Request, query: str) -> Reply:
            if 'node=""' in query:
                return json_reply(zero)
            if "count by" in query and '"source"' in query:
                return json_reply(nodes)
            with self.lock:
                self.answered += 1
            return json_reply(self.body)

        super().__init__(answer)


def _mebibytes(quantity: str) -> float:
    m = re.fullmatch(r"(\d+)(Mi|Gi)", quantity)
    assert m, quantity
    return int(m.group(1)) * (1024 if m.group(2) == "Gi" else 1)


def profiler_memory_limits() -> dict[str, float]:
    """The profiler container's memory limit in MiB, as each shipped manifest sets it."""
    dep = next(d for d in yaml.safe_load_all((ROOT / "deploy" / "base" / "profiler-deployment.yaml").read_text())
               if d and d.get("kind") == "Deployment")
    (container,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if "profile" in c.get("args", [])]
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "gpu-exporter" / "values.yaml").read_text())
    return {"kustomize": _mebibytes(container["resources"]["limits"]["memory"]),
            "helm": _mebibytes(values["profiler"]["resources"]["limits"]["memory"])}


def _status(pid: int, field: str) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    assert m, text
    return int(m.group(1)) / 1024


def test_the_limits_are_the_same_in_both_manifests() -> None:
    limits = profiler_memory_limits()
    assert limits["kustomize"] == limits["helm"], limits


@pytest.mark.parametrize("shape", list(HOSTILE))
def test_profiler_memory_stays_under_its_limit_with_hostile_answers(shape: str, tmp_path: Path) -> None:
    limit = min(profiler_memory_limits().values())
    fake = HostileProm(HOSTILE[shape]())
    assert SIZE - 1024 * 1024 < len(fake.body) <= CAP
    port = free_port()
    with FakeKubeAPI() as api:
        for i in range(3):
            api.add_node(f"n-{i}")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "profile", "--prometheus-url", fake.url,
             "--kubeconfig", str(api.kubeconfig(tmp_path / "kc")), "--interval", "1s", "--listen-port", str(port),
             "--prometheus-timeout", "60s", "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        peak = 0.0
        try:
            def enough() -> str | None:
                nonlocal peak
                if proc.poll() is not None:
                    return "exited"
                peak = max(peak, _status(proc.pid, "VmHWM"))
                if peak >= limit:
                    return "over the limit"  # stop at once: the old code went on to gigabytes
                with fake.lock:  # two cycles of six answers in flight, or their halves
                    return "read" if fake.answered >= 12 else None

            outcome = wait_until(enough, 240, interval=0.05, what="the profiler to read hostile answers")
            if outcome == "read":
                peak = max(peak, _status(proc.pid, "VmHWM"))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                out = proc.communicate(timeout=20)[0].decode()
            except subprocess.TimeoutExpired:
                proc.kill()
                out = proc.communicate()[0].decode()
            fake.close()
    assert outcome == "read" and peak < limit, (
        f"{shape}: {outcome}; peak RSS {peak:.0f} MiB, limit {limit:.0f} MiB\n{out[-2000:]}")
    assert "Traceback" not in out, out[-3000:]
    print(f"{shape}: peak RSS {peak:.0f} MiB (limit {limit:.0f} MiB)")
