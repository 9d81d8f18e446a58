"""Exporter faults: each one through the real process and a fake at the lowest seam.

For every fault the test asserts that the process survives, that no wrong or stale value is
published while it lasts, that it shows in a self-metric and in one log line however many
scrapes happen, and that the first collection after the fault clears recovers (collect on
scrape: one scrape is one cycle; rocm-smi is re-read at most every 10 s, pod-resources every
``--pod-resources-interval``).
"""

from __future__ import annotations

import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fakes.fakenvml import DRIVER_NOT_LOADED, GPU_IS_LOST, UNINITIALIZED, UNKNOWN, FakeNvml, symbols
from tests.fakes.kubelet import FakeKubelet, pod, response
from tests.harness.exporter import ExporterProcess, sample
from tests.harness.poll import wait_until
from tests.reliability.support import Result, count_lines

Samples = dict[tuple[str, frozenset], float]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rocm-smi"
DURING = 5  # scrapes while a fault lasts: still one log line


def nvml_exporter(fleet: FakeNvml, tmp_path: Path) -> ExporterProcess:
    return ExporterProcess(["--backend", "nvml", "--sysfs-root", str(tmp_path / "sys"), "--cache-ttl", "0",
                            "--collection-timeout", "10"], env=fleet.env())


def names(s: Samples, **labels: str) -> set[str]:
    return {n for n, ls in s if set(labels.items()) <= set(ls)}


def gpu_readings(s: Samples, gpu: str) -> set[str]:
    """Reading series of one GPU (its identity and up series aside)."""
    return names(s, gpu=gpu) - {"gpu_up", "gpu_info", "gpu_field_unsupported", "gpu_health_state"}


def errors(s: Samples, backend: str, kind: str) -> float:
    return sample(s, "gpu_exporter_collection_errors_total", backend=backend, kind=kind) or 0.0


def recover(ex: ExporterProcess, ok: Callable[[Samples], bool], max_scrapes: int = 20) -> tuple[int, float, Samples]:
    """Scrape until ``ok``: (scrapes it took, seconds, the first good scrape)."""
    t0 = time.monotonic()
    for n in range(1, max_scrapes + 1):
        s = ex.scrape()
        if ok(s):
            return n, round(time.monotonic() - t0, 3), s
    raise AssertionError(f"not recovered after {max_scrapes} scrapes:\n{ex.log()[-2000:]}")


# ---- NVML ----------------------------------------------------------------------------------------


def test_gpu_lost_mid_scrape(tmp_path: Path, result: Result) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=8)
    with nvml_exporter(fleet, tmp_path) as ex:
        before = ex.scrape()
        assert sample(before, "gpu_power_watts", gpu="3") == pytest.approx(fleet.gpus[3]["power_mw"] / 1000)
        # lost half-way through reading GPU 3: utilisation, memory, power ... were read, the p-state call fails
        fleet.fail("nvmlDeviceGetPerformanceState", GPU_IS_LOST, gpu=3)
        s = ex.scrape()
        assert sample(s, "gpu_up", gpu="3") == 0.0
        assert gpu_readings(s, "3") == set(), "half a reading of a lost GPU was published"
        assert all(sample(s, "gpu_up", gpu=str(i)) == 1.0 for i in (0, 1, 2, 4, 5, 6, 7))
        assert errors(s, "nvml", "gpu_lost") == 1
        fleet.clear_fail("nvmlDeviceGetPerformanceState")
        fleet.lose(3)  # then gone for good: every call about it fails
        for _ in range(DURING):
            s = ex.scrape()
            assert sample(s, "gpu_up", gpu="3") == 0.0 and gpu_readings(s, "3") == set()
        lost_errors = errors(s, "nvml", "gpu_lost")
        log_lines = count_lines(ex.log(), "GPU 3 unreadable")
        fleet.restore(3)
        fleet.set(3, power_mw=333_000)  # the GPU comes back with a new value: never the old one
        n, secs, s = recover(ex, lambda x: sample(x, "gpu_up", gpu="3") == 1.0)
        assert sample(s, "gpu_power_watts", gpu="3") == pytest.approx(333.0)
        assert count_lines(ex.log(), "GPU 3 readable again") == 1
        fleet.lose(3)  # a second outage is a new episode: logged again
        ex.scrape()
        second = count_lines(ex.log(), "GPU 3 unreadable")
        assert ex.proc.poll() is None
    result.scenario = "GPU lost mid-scrape"
    result.done = ("8 fake GPUs; GPU 3 starts failing with GPU_IS_LOST (15) half-way through its reads, then on "
                   f"every call for {DURING} scrapes; then it comes back with a new power value")
    result.happened = ("GPU 3: gpu_up 0 and no reading at all (not the half read), the other 7 GPUs untouched; "
                       "errors counted under kind=gpu_lost; one warning per outage; the first scrape after the "
                       "GPU came back served its new value")
    result.figures = {"gpu_lost_errors": lost_errors, "log_lines_per_outage": log_lines,
                      "recovery_scrapes": n, "recovery_s": secs}
    assert lost_errors == 1 + DURING
    assert log_lines == 1 and second == 2
    assert n == 1


def test_driver_unloaded_and_reloaded(tmp_path: Path, result: Result) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=8)
    with nvml_exporter(fleet, tmp_path) as ex:
        assert sample(ex.scrape(), "gpu_up", gpu="0") == 1.0
        # unload: the next call says uninitialised and every init says the driver is not loaded
        fleet.fail("nvmlDeviceGetCount_v2", UNINITIALIZED)
        fleet.fail("nvmlInitWithFlags", DRIVER_NOT_LOADED)
        fleet.fail("nvmlInit_v2", DRIVER_NOT_LOADED)
        for _ in range(DURING):
            s = ex.scrape()
            assert sample(s, "gpu_exporter_collector_success", backend="nvml") == 0.0
            assert not names(s) & {"gpu_power_watts", "gpu_temperature_celsius"}, "stale readings during the outage"
            assert {v for (n, _), v in s.items() if n == "gpu_up"} == {0.0}  # known GPUs shown down
        ready = ex.get("/readyz")[0]
        driver_errors = errors(s, "nvml", "driver")
        log_lines = count_lines(ex.log(), "collection failed")
        # reload: a new driver version, new values
        fleet.set_global(driver_version="555.42.02")
        fleet.set(0, power_mw=123_000)
        fleet.clear_fail()
        n, secs, s = recover(ex, lambda x: sample(x, "gpu_exporter_collector_success", backend="nvml") == 1.0)
        assert sample(s, "gpu_info", gpu="0", driver_version="555.42.02") == 1.0
        assert sample(s, "gpu_power_watts", gpu="0") == pytest.approx(123.0)
        assert all(sample(s, "gpu_up", gpu=str(i)) == 1.0 for i in range(8))
        assert count_lines(ex.log(), "collection recovered") == 1
        assert ex.get("/readyz")[0] == 200
        assert ex.proc.poll() is None
    result.scenario = "driver unloaded and reloaded"
    result.done = ("NVML calls answer UNINITIALIZED and nvmlInit DRIVER_NOT_LOADED (9) for "
                   f"{DURING} scrapes; then the driver comes back with another version and new values")
    result.happened = ("no reading during the outage (no stale values), the GPUs last seen as gpu_up 0, "
                       "gpu_exporter_collector_success 0, one warning (/readyz turns 503 only after --ready-max-age); "
                       "the first scrape after the "
                       "reload re-initialised NVML and served the new driver version and values")
    result.figures = {"driver_errors": driver_errors, "readyz_during": ready, "log_lines_per_outage": log_lines,
                      "recovery_scrapes": n, "recovery_s": secs}
    assert driver_errors >= DURING
    assert log_lines == 1
    assert n == 1


def test_nvml_unknown_error_on_every_call(tmp_path: Path, result: Result) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=8)
    with nvml_exporter(fleet, tmp_path) as ex:
        assert sample(ex.scrape(), "gpu_up", gpu="0") == 1.0
        for fn in symbols():
            fleet.fails[(fn, None)] = UNKNOWN
        fleet.write()
        kinds: set[str] = set()
        for _ in range(DURING):
            s = ex.scrape()
            assert sample(s, "gpu_exporter_collector_success", backend="nvml") == 0.0
            assert not names(s) & {"gpu_power_watts", "gpu_temperature_celsius"}  # nothing stale
            # the GPUs last seen stay visible, down, so alerts see them go
            assert {v for (n, _), v in s.items() if n == "gpu_up"} == {0.0}
            kinds |= {dict(ls)["kind"] for n, ls in s if n == "gpu_exporter_collection_errors_total"}
        log_lines = count_lines(ex.log(), "collection failed")
        fleet.set(5, temp_gpu=77)
        fleet.clear_fail()
        n, secs, s = recover(ex, lambda x: sample(x, "gpu_exporter_collector_success", backend="nvml") == 1.0)
        assert sample(s, "gpu_temperature_celsius", gpu="5", sensor="gpu") == 77.0
        assert ex.proc.poll() is None
    result.scenario = "NVML \"unknown error\" on every call"
    result.done = f"every NVML function of the fake library returns 999 for {DURING} scrapes, then none does"
    result.happened = ("the collection fails as a whole (every GPU gpu_up 0, no readings, collector_success 0), "
                       "one warning for "
                       "the outage; the first scrape after the fault re-initialised NVML and served fresh values")
    result.figures = {"error_kinds": sorted(kinds), "log_lines_per_outage": log_lines, "recovery_scrapes": n,
                      "recovery_s": secs}
    assert log_lines == 1
    assert n == 1


# ---- rocm-smi ------------------------------------------------------------------------------------


def test_rocm_smi_hanging(tmp_path: Path, result: Result) -> None:
    hang, child, fixture = tmp_path / "hang", tmp_path / "child.pid", tmp_path / "fixture"
    fixture.write_text(str(FIXTURES / "mi100_rocm602.json"))
    script = tmp_path / "rocm-smi"
    script.write_text(f'#!/bin/sh\nif [ -e "{hang}" ]; then echo $$ > "{child}"; exec sleep 120; fi\n'
                      f'cat "$(cat "{fixture}")"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    timeout = 1.0
    with ExporterProcess(["--backend", "rocm-smi", "--rocm-smi-path", str(script), "--command-timeout",
                          f"{timeout:g}", "--collection-timeout", "5", "--cache-ttl", "0",
                          "--sysfs-root", str(tmp_path / "sys")]) as ex:
        s = ex.scrape()
        assert sorted(dict(ls)["gpu"] for n, ls in s if n == "gpu_up") == ["0", "1", "2", "3"]
        hang.touch()
        # rocm-smi is re-read at most every 10 s: the first read after that hangs
        t0 = time.monotonic()
        s = wait_until(lambda: (x := ex.scrape()) and
                       sample(x, "gpu_exporter_collector_success", backend="rocm-smi") == 0.0 and x,
                       30, interval=0.5, what="a collection that meets the hung rocm-smi")
        noticed = time.monotonic() - t0
        assert not names(s) & {"gpu_power_watts", "gpu_temperature_celsius"}, "stale readings while rocm-smi hangs"
        assert {v for (n, _), v in s.items() if n == "gpu_up"} == {0.0}  # known GPUs shown down
        durations = []
        for _ in range(DURING - 1):
            t1 = time.monotonic()
            s = ex.scrape()
            durations.append(time.monotonic() - t1)
            assert sample(s, "gpu_exporter_collector_success", backend="rocm-smi") == 0.0
        timeouts = errors(s, "rocm-smi", "stalled")
        # after a failed collection the backend is initialised again, and that init meets the hang too
        failed = timeouts + errors(s, "rocm-smi", "unavailable")
        log_lines = count_lines(ex.log(), "collection failed")
        pid = int(child.read_text())
        fixture.write_text(str(FIXTURES / "vega-10-XT.json"))  # it comes back reporting another card
        hang.unlink()
        n, secs, s = recover(ex, lambda x: sample(x, "gpu_exporter_collector_success", backend="rocm-smi") == 1.0)
        assert sorted(dict(ls)["pci_bus_id"] for n_, ls in s if n_ == "gpu_info") == ["0000:04:00.0"]
        assert ex.proc.poll() is None
    gone = not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] in "ZX"
    result.scenario = "rocm-smi hanging"
    result.done = (f"the rocm-smi binary stops answering (`--command-timeout {timeout:g}`); {DURING} scrapes; "
                   "then it answers again, with a different card")
    result.happened = ("each hung run was killed at the command timeout (with its process group); no reading "
                       "while it hung, the GPUs last seen as gpu_up 0; failures counted (kind stalled, then "
                       "unavailable for the re-init); "
                       "one warning; the first scrape after it answered "
                       "served the new card only")
    result.figures = {"timeouts": timeouts, "failed_collections": failed, "max_scrape_s": round(max(durations), 2),
                      "log_lines_per_outage": log_lines, "recovery_scrapes": n, "recovery_s": secs,
                      "hung_noticed_after_s": round(noticed, 1)}
    assert gone, f"hung rocm-smi {pid} still running"
    assert timeouts >= 1 and failed >= DURING and max(durations) < timeout + 2.0
    assert log_lines == 1
    assert n == 1


# ---- kubelet pod-resources -----------------------------------------------------------------------

GPU0 = "GPU-5140a7ed-0000-4000-8000-000000000000"  # the simulated backend's GPU 0


def pods_of(s: Samples, metric: str = "gpu_power_watts") -> dict[str, str]:
    return {dict(ls)["gpu"]: dict(ls)["pod"] for n, ls in s if n == metric and "pod" in dict(ls)}


def attribution_exporter(kubelet: FakeKubelet, interval: float) -> ExporterProcess:
    return ExporterProcess(["--backend", "simulated", "--simulated-gpus", "2", "--cache-ttl", "0",
                            "--pod-attribution", "on", "--pod-resources-socket", kubelet.path,
                            "--pod-resources-interval", f"{interval:g}"])


def test_kubelet_socket_vanishing(result: Result) -> None:
    interval = 1.0
    with FakeKubelet() as kubelet:
        kubelet.set_response(response([pod("ml", "before", {"c": [("nvidia.com/gpu", [GPU0])]})]))
        with attribution_exporter(kubelet, interval) as ex:
            wait_until(lambda: pods_of(ex.scrape()) == {"0": "before"}, 20, what="pod labels")
            kubelet.die()  # the kubelet goes away and its socket file with it
            t0 = time.monotonic()
            s = wait_until(lambda: (x := ex.scrape()) and not pods_of(x) and x, 20, what="stale labels dropped")
            dropped = time.monotonic() - t0
            assert sample(s, "gpu_exporter_pod_attribution_up") == 0.0
            assert sample(s, "gpu_power_watts", gpu="0") is not None, "GPU metrics must go on without the kubelet"
            for _ in range(DURING):
                s = ex.scrape()
                assert not pods_of(s) and not names(s) & {"gpu_allocation_info"}
            missing = sample(s, "gpu_exporter_pod_resources_errors_total", kind="socket_missing") or 0.0
            log_lines = count_lines(ex.log(), "pod attribution off")
            kubelet.set_response(response([pod("ml", "after", {"c": [("nvidia.com/gpu", [GPU0])]})]))
            kubelet.start()
            t1 = time.monotonic()
            wait_until(lambda: pods_of(ex.scrape()) == {"0": "after"}, 20, interval=0.1, what="labels back")
            back = time.monotonic() - t1
            assert "before" not in str(pods_of(ex.scrape()))
            assert count_lines(ex.log(), "pod attribution back") == 1
            assert ex.proc.poll() is None
    result.scenario = "kubelet socket vanishing"
    result.done = (f"the fake kubelet stops and its socket file disappears (`--pod-resources-interval "
                   f"{interval:g}`), then it comes back with a different pod on GPU 0")
    result.happened = ("GPU metrics kept flowing; pod labels and gpu_allocation_info dropped once older than the "
                       "staleness limit; socket_missing counted; one warning; the new pod appeared within one "
                       "List interval of the kubelet's return")
    result.figures = {"labels_dropped_after_s": round(dropped, 1), "socket_missing_errors": missing,
                      "log_lines_per_outage": log_lines, "recovery_s": round(back, 2)}
    assert missing >= 1 and log_lines == 1
    assert back <= interval + 1.5


def test_pod_resources_answer_over_4mib(result: Result) -> None:
    busy = [pod(f"ns-{i % 50}", f"worker-{i:05d}", {"app": [("example.com/sriov-vf", [
        f"0000:{i % 256:02x}:{j:02x}.{k}" for j in range(4) for k in range(2)])]}) for i in range(30000)]
    resp = response([*busy, pod("ml", "big-model", {"main": [("nvidia.com/gpu", [GPU0])]})])
    size = resp.ByteSize()
    assert size > 4 * 2**20, "the answer must exceed gRPC's 4 MiB default"
    with FakeKubelet() as kubelet:
        kubelet.set_response(resp)
        with attribution_exporter(kubelet, 2.0) as ex:
            s = wait_until(lambda: (x := ex.scrape()) and pods_of(x) == {"0": "big-model"} and x, 30,
                           what="pod labels from the big answer")
            duration = sample(s, "gpu_exporter_pod_resources_list_duration_seconds")
            errs = sum(v for (n, _), v in s.items() if n == "gpu_exporter_pod_resources_errors_total")
            ignored = sample(s, "gpu_exporter_pod_resources_devices", status="ignored")
            assert ex.proc.poll() is None
    result.scenario = "pod-resources answer over 4 MiB"
    result.done = f"the kubelet's List answer is {size / 2**20:.1f} MiB (30,000 pods with other devices, one GPU pod)"
    result.happened = "accepted (the client allows 64 MiB); the GPU pod got its labels; no error"
    result.figures = {"answer_mib": round(size / 2**20, 1), "list_duration_s": duration, "errors": errs,
                      "ignored_devices": ignored}
    result.see_also = ["tests/unit/k8s/test_podresources.py::test_answer_larger_than_grpc_default_limit"]
    assert errs == 0 and ignored == 30000 * 8

