"""amdsmi per-process readings for the per-pod families (--per-process): the real amdsmi over the fake libamd_smi."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.backends import create
from exporter.backends.amdsmi import AmdSmiBackend
from exporter.core.options import BackendOptions
from exporter.core.readings import Collection
from tests.fakes.fakeamdsmi import FakeAmdSmi, two_gpu_fleet
from tests.harness.exporter import ExporterProcess
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.pods import add_pods, make_proc, pod_series
from tests.harness.poll import wait_until

GIB = 2**30


@pytest.fixture
def per_process(fake: FakeAmdSmi) -> Iterator[AmdSmiBackend]:
    b = create("amdsmi", BackendOptions(per_process=True))
    assert isinstance(b, AmdSmiBackend)
    b.init()
    yield b
    b.shutdown()


def _write(fake: FakeAmdSmi, processes: str) -> None:
    gpus = two_gpu_fleet()
    gpus[0]["processes"] = processes
    fake.write(gpus, rocm_version="6.2.1")


def _collect(b: AmdSmiBackend) -> Collection:
    out = Collection("amdsmi")
    b.collect(out)
    return out


def test_memory_at_once_engine_share_from_the_second_collection(fake: FakeAmdSmi,
                                                                per_process: AmdSmiBackend) -> None:
    _write(fake, f"4242:{8 * GIB}:python3:1000000000,4343:{GIB}:rccl-tests:5000")
    g0 = _collect(per_process).gpus[0]
    assert g0.process_pids == (4242, 4343)
    assert g0.process_memory_by_pid == {4242: 8.0 * GIB, 4343: 1.0 * GIB}
    assert g0.process_utilization_by_pid is None  # one sample of a cumulative counter: no rate yet
    # 4242 ran 10^15 ns more (capped: the share of wall time is at most 1), 4343 nothing, 4444 is new
    _write(fake, f"4242:{8 * GIB}:python3:1000001000000000,4343:{GIB}:rccl-tests:5000,4444:{GIB}:new:7")
    g0 = _collect(per_process).gpus[0]
    assert g0.process_utilization_by_pid == {4242: 1.0, 4343: 0.0}  # 4444: no rate yet, absent


def test_off_without_per_process(fake: FakeAmdSmi, fake_rocm: object) -> None:
    b = create("amdsmi", BackendOptions())
    b.init()
    try:
        _write(fake, f"4242:{GIB}:python3:10")
        g0 = _collect(b).gpus[0]  # type: ignore[arg-type]
        assert g0.process_pids is None and g0.process_utilization_by_pid is None
    finally:
        b.shutdown()


def test_serve_publishes_per_pod_readings_on_amd(fake: FakeAmdSmi, tmp_path: Path,
                                                 kubeapi: FakeKubeAPI) -> None:
    """The whole path on AMD: amdsmi's process list -> the host /proc cgroup -> the pods watch -> /metrics."""
    proc_root = make_proc(tmp_path / "proc")
    add_pods(kubeapi)
    _write(fake, f"1001:{2 * GIB}:python3:1000,1002:{GIB}:python3:1000,3001:{GIB}:jupyter:1000")
    env = {**fake.env(), "PROC_ROOT": str(proc_root), "NODE_NAME": "node-1",
           "KUBECONFIG": str(kubeapi.kubeconfig(tmp_path / "kc"))}
    with ExporterProcess(["--backend", "amdsmi", "--cache-ttl", "0", "--per-process", "--pod-attribution", "off"],
                         env=env) as ex:
        # 60 s bounds, not 20: the pods watch and the first collections under the full suite's load on
        # 2 cores once took longer than 20 s (a bound, not a wait: each returns as soon as it holds)
        s = wait_until(lambda: (s := ex.scrape()) and len(pod_series(s, "gpu_pod_memory_used_bytes")) >= 2 and s,
                       timeout=60, what="per-pod memory on AMD")
        assert pod_series(s, "gpu_pod_memory_used_bytes") == {("0", "ml", "train-a", "trainer"): 3.0 * GIB,
                                                               ("0", "", "", ""): 1.0 * GIB}
        key = ("0", "ml", "train-a", "trainer")
        # from the second collection: no engine time added, 0
        wait_until(lambda: pod_series(ex.scrape(), "gpu_pod_utilization_ratio").get(key) == 0.0, timeout=60,
                   what="per-pod utilisation 0")
        # engine time grows by far more than the wall time between two collections: capped at 1
        _write(fake, f"1001:{2 * GIB}:python3:{10**15},1002:{GIB}:python3:1000,3001:{GIB}:jupyter:1000")
        wait_until(lambda: pod_series(ex.scrape(), "gpu_pod_utilization_ratio").get(key) == 1.0, timeout=60,
                   what="per-pod utilisation 1")
