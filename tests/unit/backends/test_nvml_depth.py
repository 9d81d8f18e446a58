"""NVIDIA depth readings through the real pynvml and the fake libnvidia-ml.so.1: ECC, XID, throttling,
topology, NVLink, processes, MIG and the "fell off the bus" comparison."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.fakenvml import GPU_IS_LOST, NOT_SUPPORTED, FakeNvml, make_sysfs, sysfs_address
from tests.harness.exporter import ExporterProcess, parse_samples, sample
from tests.harness.poll import wait_until
from tests.harness.prom import check_metrics


def start(fleet: FakeNvml, sysfs: Path, *args: str) -> ExporterProcess:
    return ExporterProcess(["--backend", "nvml", "--sysfs-root", str(sysfs), "--cache-ttl", "0",
                            "--collection-timeout", "30", *args], env=fleet.env())


pytestmark = pytest.mark.fleet(gpus=4)  # the `fleet` fixture (tests/conftest.py)


@pytest.fixture
def sysfs(tmp_path: Path, fleet: FakeNvml) -> Path:
    root = tmp_path / "sys"
    devices = [(sysfs_address(g["bus_id"]), 0x10DE, 0x030200) for g in fleet.gpus]
    devices += [("0000:c1:00.1", 0x10DE, 0x040300),  # the GPU's HDMI audio function: not a GPU
                ("0000:e1:00.0", 0x10DE, 0x068000),  # an NVSwitch bridge: not a GPU
                ("0000:05:00.0", 0x1A03, 0x030000)]  # the BMC's VGA (ASPEED): another vendor
    make_sysfs(root, devices)
    return root


@pytest.fixture
def exporter(fleet: FakeNvml, sysfs: Path) -> Iterator[ExporterProcess]:
    with start(fleet, sysfs) as ex:
        yield ex


def test_ecc_remap_and_retired_pages(fleet: FakeNvml, exporter: ExporterProcess) -> None:
    fleet.set(1, ecc_corrected_volatile=7, ecc_uncorrected_aggregate=2, remap_corr=3, remap_unc=1,
              remap_pending=1, remap_failure=0, retired_sbe=[(0x1000, 111), (0x2000, 222), (0x3000, 333)],
              retired_dbe=[])
    s = exporter.scrape()
    lab = {"gpu": "1", "uuid": fleet.gpus[1]["uuid"]}
    assert sample(s, "gpu_ecc_mode_enabled", **lab) == 1.0
    assert sample(s, "gpu_ecc_errors_total", error_type="corrected", counter="volatile", **lab) == 7.0
    assert sample(s, "gpu_ecc_errors_total", error_type="uncorrected", counter="aggregate", **lab) == 2.0
    assert sample(s, "gpu_remapped_rows", error_type="corrected", **lab) == 3.0
    assert sample(s, "gpu_remapped_rows", error_type="uncorrected", **lab) == 1.0
    assert sample(s, "gpu_remapped_rows_pending", **lab) == 1.0
    assert sample(s, "gpu_remapped_rows_failed", **lab) == 0.0
    assert sample(s, "gpu_retired_pages", cause="double_bit", **lab) == 0.0
    # a count above zero: NVML answers the size query with INSUFFICIENT_SIZE and the count
    assert sample(s, "gpu_retired_pages", cause="single_bit", **lab) == 3.0
    assert sample(s, "gpu_retired_pages", cause="single_bit", gpu="0", uuid=fleet.gpus[0]["uuid"]) == 0.0


def test_ecc_absent_when_unsupported(fleet: FakeNvml, sysfs: Path) -> None:
    fleet.unsupported(0, "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPages")
    with start(fleet, sysfs) as ex:
        s = ex.scrape()
        for name in ("gpu_ecc_errors_total", "gpu_remapped_rows", "gpu_remapped_rows_pending", "gpu_retired_pages"):
            assert not any(n == name and ("gpu", "0") in ls for n, ls in s), name
            assert any(n == name and ("gpu", "1") in ls for n, ls in s), name
        assert sample(s, "gpu_field_unsupported", gpu="0", field="gpu_remapped_rows") == 1.0


def test_throttle_reasons_decoded(fleet: FakeNvml, exporter: ExporterProcess) -> None:
    fleet.set(2, clocks_event_reasons=0x4 | 0x40, supported_clocks_event_reasons=0x1FF)
    s = exporter.scrape()
    active = {dict(ls)["reason"] for (n, ls), v in s.items()
              if n == "gpu_throttle_reason_active" and ("gpu", "2") in ls and v == 1.0}
    assert active == {"sw_power_cap", "hw_thermal_slowdown"}
    reasons = {dict(ls)["reason"] for n, ls in s if n == "gpu_throttle_reason_active" and ("gpu", "2") in ls}
    assert len(reasons) == 9
    v = fleet.gpus[2]["violation"]
    assert sample(s, "gpu_violation_seconds_total", gpu="2", reason="thermal") == pytest.approx(v[1] / 1e9)


def test_xid_between_scrapes_is_a_counter(fleet: FakeNvml, exporter: ExporterProcess) -> None:
    s = exporter.scrape()
    assert not any(n == "gpu_xid_errors_total" for n, _ in s)
    fleet.queue_xid(1, 79)
    s = wait_until(lambda: (x := exporter.scrape()) and sample(x, "gpu_xid_errors_total", gpu="1", xid="79") and x,
                   10, what="XID 79 counted")
    assert sample(s, "gpu_xid_errors_total", gpu="1", xid="79", uuid=fleet.gpus[1]["uuid"]) == 1.0
    assert (sample(s, "gpu_xid_last_timestamp_seconds", gpu="1") or 0) > 1.7e9
    fleet.queue_xid(1, 79)
    fleet.queue_xid(1, 48)
    wait_until(lambda: sample(exporter.scrape(), "gpu_xid_errors_total", gpu="1", xid="79") == 2.0, 10,
               what="second XID 79")
    s = wait_until(lambda: (x := exporter.scrape()) and sample(x, "gpu_xid_errors_total", gpu="1", xid="48") and x,
                   10, what="XID 48")
    assert sample(s, "gpu_xid_errors_total", gpu="1", xid="79") == 2.0  # never a "last value" gauge
    assert check_metrics(exporter.scrape_text()) == []


def test_event_watcher_survives_lost_gpu_and_driver_reload(fleet: FakeNvml, exporter: ExporterProcess) -> None:
    exporter.scrape()
    fleet.lose(2)
    assert sample(exporter.scrape(), "gpu_up", gpu="2") == 0.0
    fleet.queue_xid(0, 31)
    wait_until(lambda: sample(exporter.scrape(), "gpu_xid_errors_total", gpu="0", xid="31") == 1.0, 10,
               what="XID on a healthy GPU while another is lost")
    fleet.restore(2)
    # driver reload: NVML fails once, the backend re-initialises and restarts the watcher
    fleet.fail("nvmlDeviceGetCount_v2", 1)
    assert sample(exporter.scrape(), "gpu_exporter_collector_success", backend="nvml") == 0.0
    fleet.clear_fail("nvmlDeviceGetCount_v2")
    wait_until(lambda: sample(exporter.scrape(), "gpu_exporter_collector_success", backend="nvml") == 1.0, 10,
               what="re-init")
    fleet.queue_xid(3, 94)
    s = wait_until(lambda: (x := exporter.scrape()) and sample(x, "gpu_xid_errors_total", gpu="3", xid="94") and x,
                   10, what="XID after re-init")
    assert sample(s, "gpu_xid_errors_total", gpu="0", xid="31") == 1.0  # counts survive the reload
    assert exporter.proc.poll() is None


def test_topology_and_p2p(fleet: FakeNvml, sysfs: Path) -> None:
    fleet.set_topology(0, 1, 10)  # same PCIe switch
    fleet.set_p2p(0, 3, 2, index=2)  # no NVLink P2P between 0 and 3
    with start(fleet, sysfs) as ex:  # off /metrics by default (N x (N-1) series) ...
        assert not [n for n, _ in ex.scrape() if n in ("gpu_topology_level", "gpu_p2p_supported")]
        status, body, _ = ex.get("/stats")  # ... but collected for the JSON API
        assert status == 200
        pair = next(p for p in json.loads(body)["p2p"] if p["gpu"] == 0 and p["peer"] == 1)
        assert pair["topology_level"] == "single" and pair["p2p"]["read"] is True
    with start(fleet, sysfs, "--fields-include", "gpu_*") as ex:  # selected: back on /metrics
        s = ex.scrape()
        assert sample(s, "gpu_topology_level", gpu="0", peer="1") == 10.0
        assert sample(s, "gpu_topology_level", gpu="0", peer="1", level="single") == 10.0
        assert sample(s, "gpu_topology_level", gpu="0", peer="3", level="system") == 50.0  # across NUMA halves
        assert sample(s, "gpu_topology_level", gpu="2", peer="3", level="node") == 40.0  # same NUMA half
        assert sample(s, "gpu_p2p_supported", gpu="0", peer="3", capability="nvlink") == 0.0
        assert sample(s, "gpu_p2p_supported", gpu="0", peer="3", capability="read") == 1.0
        pairs = {(dict(ls)["gpu"], dict(ls)["peer"]) for n, ls in s if n == "gpu_topology_level"}
        assert len(pairs) == 4 * 3


def test_nvlink_codecs_and_processes(fleet: FakeNvml, sysfs: Path) -> None:
    active = [1] * 18
    active[5] = 0
    fleet.set(0, nvlink_active=active, nvlink_err={(5, 2): 11, (6, 2): 4, (1, 0): 2}, enc_util=12, dec_util=34,
              procs=[(1234, 2 * 2**30), (5678, 3 * 2**30)])
    with start(fleet, sysfs, "--per-process") as ex:
        s = ex.scrape()
        assert sample(s, "gpu_link_up", gpu="0", link="5") == 0.0
        assert sample(s, "gpu_link_up", gpu="0", link="4") == 1.0
        assert len([1 for n, ls in s if n == "gpu_link_up" and ("gpu", "0") in ls]) == 18
        assert sample(s, "gpu_link_errors_total", gpu="0", counter="crc_flit", link="5") == 11.0
        assert sample(s, "gpu_link_errors_total", gpu="0", counter="crc_flit", link="6") == 4.0
        assert sample(s, "gpu_link_errors_total", gpu="0", counter="replay", link="1") == 2.0
        assert sum(v for (n, ls), v in s.items() if n == "gpu_link_errors_total" and ("gpu", "0") in ls
                   and ("counter", "crc_flit") in ls) == 15.0
        assert sample(s, "gpu_encoder_utilization_ratio", gpu="0") == pytest.approx(0.12)
        assert sample(s, "gpu_decoder_utilization_ratio", gpu="0") == pytest.approx(0.34)
        assert sample(s, "gpu_processes", gpu="0") == 2.0
        assert sample(s, "gpu_processes_memory_used_bytes", gpu="0") == 5 * 2**30
        assert sample(s, "gpu_process_memory_used_bytes", gpu="0", pid="5678") == 3 * 2**30
        assert sample(s, "gpu_processes", gpu="1") == 0.0


def test_per_pid_series_are_opt_in(fleet: FakeNvml, exporter: ExporterProcess) -> None:
    fleet.set(0, procs=[(1234, 2**30)])
    s = exporter.scrape()
    assert sample(s, "gpu_processes", gpu="0") == 1.0
    assert not any(n == "gpu_process_memory_used_bytes" for n, _ in s)


def test_mig_gpu_next_to_a_plain_one(fleet: FakeNvml, sysfs: Path) -> None:
    a = fleet.add_mig(0, 0, "3g.40gb", gi=1, ci=0, mem_total=40 * 2**30, mem_used=5 * 2**30)
    b = fleet.add_mig(0, 1, "1g.10gb", gi=9, ci=0, mem_total=10 * 2**30, mem_used=2**30)
    with start(fleet, sysfs) as ex:
        s = ex.scrape()
        assert sample(s, "gpu_mig_mode_enabled", gpu="0") == 1.0
        assert sample(s, "gpu_mig_mode_enabled", gpu="1") == 0.0
        assert sample(s, "gpu_mig_memory_total_bytes", gpu="0", mig_uuid=a, mig_profile="3g.40gb",
                      gpu_instance="1", compute_instance="0") == 40 * 2**30
        assert sample(s, "gpu_mig_memory_used_bytes", gpu="0", mig_uuid=b, gpu_instance="9") == 2**30
        assert not any(n.startswith("gpu_mig_memory") and ("gpu", "1") in ls for n, ls in s)
        # the plain GPU next to it is unchanged
        assert sample(s, "gpu_utilization_ratio", gpu="1") == pytest.approx(fleet.gpus[1]["util_gpu"] / 100)
        assert check_metrics(ex.scrape_text()) == []


def test_gpu_vanishing_from_nvml_while_on_the_bus(fleet: FakeNvml, exporter: ExporterProcess) -> None:
    s = exporter.scrape()
    assert sample(s, "gpu_pci_devices", vendor="nvidia") == 4.0  # audio function, NVSwitch, BMC VGA not counted
    assert sample(s, "gpu_visible_devices", vendor="nvidia") == 4.0
    fleet.set_count(3)  # the driver dropped GPU 3, the PCI bus still lists it
    s = exporter.scrape()
    assert sample(s, "gpu_pci_devices", vendor="nvidia") == 4.0
    assert sample(s, "gpu_visible_devices", vendor="nvidia") == 3.0
    assert not any(("gpu", "3") in ls for _, ls in s)


def test_pcie_replay_and_opt_in_throughput(fleet: FakeNvml, sysfs: Path) -> None:
    for i in range(len(fleet.gpus)):  # the legacy call serves GPUs without GPM (GPM: test_nvml_gpm.py)
        fleet.set(i, gpm_supported=0)
    fleet.set(1, pcie_replay=17)
    with start(fleet, sysfs) as ex:
        s = ex.scrape()
        assert sample(s, "gpu_pcie_replays_total", gpu="1") == 17.0
        assert not any(n == "gpu_pcie_throughput_bytes_per_second" for n, _ in s)
    with start(fleet, sysfs, "--pcie-throughput") as ex:
        s = ex.scrape()
        assert sample(s, "gpu_pcie_throughput_bytes_per_second", gpu="1", direction="tx") == \
            fleet.gpus[1]["pcie_tx_kbps"] * 1024


def test_unsupported_depth_everywhere(fleet: FakeNvml, sysfs: Path) -> None:
    for fn in ("nvmlDeviceGetViolationStatus", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetEncoderUtilization",
               "nvmlDeviceGetMigMode", "nvmlDeviceGetCurrentClocksEventReasons",
               "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fleet.fail(fn, NOT_SUPPORTED)
    with start(fleet, sysfs) as ex:
        s = ex.scrape()
        names = {n for n, _ in s}
        assert not {"gpu_violation_seconds_total", "gpu_link_up", "gpu_encoder_utilization_ratio",
                    "gpu_mig_mode_enabled", "gpu_throttle_reason_active"} & names
        assert all(sample(s, "gpu_up", gpu=str(i)) == 1.0 for i in range(4))
        assert parse_samples(ex.scrape_text())


def test_gpu_lost_before_its_first_read_keeps_real_labels(fleet: FakeNvml, sysfs: Path) -> None:
    """NVML never answered for GPU 2: its bus ID comes from sysfs (NVML numbers GPUs in bus order)
    and its UUID from the driver's /proc/driver/nvidia/gpus/<bus>/information."""
    bus = sysfs_address(fleet.gpus[2]["bus_id"])
    info = sysfs.parent / "proc" / "driver" / "nvidia" / "gpus" / bus
    info.mkdir(parents=True)
    (info / "information").write_text(f"Model: \t\t NVIDIA H100\nGPU UUID: \t {fleet.gpus[2]['uuid']}\n")
    fleet.fail("nvmlDeviceGetHandleByIndex_v2", GPU_IS_LOST, gpu=2)
    with start(fleet, sysfs) as ex:
        s = ex.scrape()
    assert sample(s, "gpu_up", gpu="2", uuid=fleet.gpus[2]["uuid"]) == 0.0
    assert sample(s, "gpu_info", gpu="2", pci_bus_id=bus, uuid=fleet.gpus[2]["uuid"]) == 1.0


# NVML_VALUE_NOT_AVAILABLE of a 64-bit counter, unsigned and signed, and of a 32-bit one
NO_VALUE_64 = (0xFFFF_FFFF_FFFF_FFFF, 0x7FFF_FFFF_FFFF_FFFF, 0xFFFF_FFFF)


@pytest.mark.parametrize("sentinel", NO_VALUE_64, ids=hex)
def test_an_nvlink_error_counter_answering_a_sentinel_is_absent(fleet: FakeNvml, sysfs: Path, sentinel: int) -> None:
    """One link's counter answers "no value": that series is absent, its neighbours stay."""
    fleet.set(0, nvlink_err={(3, 1): sentinel, (3, 2): 5, (4, 1): 6})
    with start(fleet, sysfs) as ex:
        s = ex.scrape()
    errs = {(dict(ls)["link"], dict(ls)["counter"]): v for (n, ls), v in s.items()
            if n == "gpu_link_errors_total" and ("gpu", "0") in ls}
    assert ("3", "recovery") not in errs, f"sentinel {sentinel:#x} published as {errs.get(('3', 'recovery'))}"
    assert errs[("3", "crc_flit")] == 5.0 and errs[("4", "recovery")] == 6.0 and errs[("2", "recovery")] == 0.0
    assert len(errs) == 18 * 4 - 1
    assert all(v < 2**31 for v in errs.values())


@pytest.mark.parametrize("omit", [[], ["nvmlDeviceGetComputeRunningProcesses_v3",
                                      "nvmlDeviceGetComputeRunningProcesses_v2"]], ids=["v3", "v1"])
def test_a_process_whose_memory_is_not_available_is_counted_but_not_summed(tmp_path: Path, omit: list[str]) -> None:
    """usedGpuMemory "not available" (ULLONG_MAX; pynvml's v3 wrapper turns it into None, the v1
    structs keep it raw): the process counts, its memory is absent, and so is the per-GPU sum,
    which would otherwise under-report; another GPU's processes are untouched."""
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2, omit=omit)
    fleet.set(0, procs=[(1234, 2 * 2**30), (5678, None)])
    fleet.set(1, procs=[(4321, 2**30)])
    with ExporterProcess(["--backend", "nvml", "--cache-ttl", "0", "--sysfs-root", str(tmp_path / "sys"),
                          "--per-process"], env=fleet.env()) as ex:
        s = ex.scrape()
    assert sample(s, "gpu_processes", gpu="0") == 2.0
    assert sample(s, "gpu_processes_memory_used_bytes", gpu="0") is None
    per_pid = {(dict(ls)["gpu"], dict(ls)["pid"]): v for (n, ls), v in s.items()
               if n == "gpu_process_memory_used_bytes"}
    assert per_pid == {("0", "1234"): 2 * 2**30, ("1", "4321"): 2**30}
    assert sample(s, "gpu_processes_memory_used_bytes", gpu="1") == 2**30


def test_unknown_error_from_a_mig_call_is_that_readings(fleet: FakeNvml, sysfs: Path) -> None:
    """NVML_ERROR_UNKNOWN (999) from one MIG instance's call loses that MIG reading only while the
    GPU's identity answers (issue 26): the identity asked is the parent GPU's."""
    a = fleet.add_mig(0, 0, "3g.40gb", gi=1, ci=0, mem_total=40 * 2**30, mem_used=5 * 2**30)
    with start(fleet, sysfs) as ex:
        ex.scrape()
        fleet.fail("nvmlDeviceGetComputeInstanceId", 999, gpu=0)  # a MIG-only call
        s = ex.scrape()
        assert sample(s, "gpu_up", gpu="0") == 1.0
        assert sample(s, "gpu_mig_memory_total_bytes", gpu="0", mig_uuid=a) == 40 * 2**30
        fleet.fail("nvmlDeviceGetUUID", 999, gpu=0)  # the GPU's identity fails too: the GPU is down
        s = ex.scrape()
        assert sample(s, "gpu_up", gpu="0") == 0.0 and sample(s, "gpu_up", gpu="1") == 1.0
