"""amdsmi backend: the real ``amdsmi`` wrapper over a fake ``libamd_smi.so`` built by the tests.

The fake (tests/fakes/fake_amdsmi/) exports every symbol the installed wrapper resolves (stubs
generated from it) and serves the fleet file named by $FAKE_AMDSMI_FLEET; see tests/fakes/fakeamdsmi.py.
The wrapper loads the library once per process (from $ROCM_PATH/lib); the fleet is re-read by
the fake on every change, so each test just writes its own fleet.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.backends import registry
from exporter.backends.amdsmi import AmdSmiBackend, amd_uuid
from exporter.backends.base import BackendError, BackendUnavailable
from exporter.backends.rocm_smi import parse_rocm_smi_json
from exporter.core.options import BackendOptions, FieldFilter
from exporter.core.readings import Collection
from tests.fakes import fakeamdsmi
from tests.fakes.fakeamdsmi import FakeAmdSmi, rocm_smi_json, two_gpu_fleet

GIB = 2**30
MHZ = 1e6
REPO = Path(__file__).resolve().parents[3]


def collect(b: AmdSmiBackend) -> Collection:
    out = Collection("amdsmi")
    b.collect(out)
    return out


def test_stubs_are_pinned_to_the_installed_wrapper() -> None:
    # The generator reads symbols and layouts from the installed wrapper; the fake's semantics
    # (units, N/A values) were checked against this version. A new one needs a re-check.
    assert fakeamdsmi.installed_version() == fakeamdsmi.PINNED_AMDSMI_VERSION == "7.0.2"


def test_fake_layout_comes_from_the_wrapper(fake_rocm: Path) -> None:
    header = (fake_rocm.parent / "build" / "amdsmi_layout.h").read_text()
    assert '#define FAKE_AMDSMI_WRAPPER_VERSION "7.0.2"' in header
    assert "#define OFF_amdsmi_pcie_info_t__pcie_metric__pcie_speed " in header
    stubs = (fake_rocm.parent / "build" / "amdsmi_stubs.c").read_text()
    assert stubs.count("__attribute__((weak))") > 150  # every symbol the wrapper resolves


def test_registered_before_rocm_smi() -> None:
    assert registry()["amdsmi"] is AmdSmiBackend
    assert (AmdSmiBackend.name, AmdSmiBackend.vendor, AmdSmiBackend.auto_priority) == ("amdsmi", "amd", 20)


def test_two_gpus_exact_values_and_units(backend: AmdSmiBackend) -> None:
    out = collect(backend)
    assert out.errors == {}
    g0, g1 = out.gpus
    assert (g0.index, g1.index) == (0, 1)
    assert g0.uuid == "9dff74a1-0000-1000-8020-5b1f1f2b6ac6"  # amdsmi_get_gpu_device_uuid, as given
    assert (g0.vendor, g0.up, g0.name) == ("amd", True, "AMD Instinct MI300X")
    assert g0.pci_bus_id == "0000:0c:00.0"  # canonical lower case
    assert (g0.serial, g0.driver_version, g0.firmware_version) == ("692351000123", "6.8.5", "113-M3000100-102")
    assert g0.cuda_driver_version == "6.2.1"  # the ROCm version
    assert (g0.utilization_ratio, g0.memory_utilization_ratio) == (0.87, 0.42)
    assert g0.memory_total_bytes == 192 * GIB and g0.memory_used_bytes == 60 * GIB
    assert g0.memory_free_bytes == 132 * GIB
    assert g0.temperature_celsius == {"gpu": 45.0, "junction": 61.0, "memory": 52.0}
    assert g0.power_watts == 612.0  # current socket power
    assert g0.power_limit_watts == 750.0  # 750 000 000 uW
    assert g0.energy_joules == 1_000_000_000 * 15.25 / 1e6  # count x uJ
    assert g0.clock_hertz == {"graphics": 2087 * MHZ, "memory": 1300 * MHZ, "soc": 1143 * MHZ, "video": 29 * MHZ}
    assert g0.clock_max_hertz == {"graphics": 2100 * MHZ, "memory": 1300 * MHZ, "soc": 1143 * MHZ,
                                  "video": 1333 * MHZ}
    assert (g0.pcie_link_generation, g0.pcie_link_generation_max) == (5.0, 5.0)  # 32000 MT/s
    assert (g0.pcie_link_width, g0.pcie_link_width_max, g0.pcie_replay_total) == (16.0, 16.0, 3.0)
    assert g0.fan_speed_ratio == 128 / 255
    assert g0.ecc_errors == {("corrected", "volatile"): 12.0, ("uncorrected", "volatile"): 0.0}
    assert g0.link_up == {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0}  # U,U,U,D; the disabled 5th link is not one
    assert g0.throttle_reasons == {"sw_power_cap": 1.0, "sw_thermal_slowdown": 0.0, "hw_slowdown": 1.0,
                                   "hw_thermal_slowdown": 0.0}  # PPT0 + PROCHOT_GFX bits
    assert (g0.process_count, g0.process_memory_used_bytes) == (2.0, 33 * GIB)
    assert g0.process_memory_by_pid == {}  # per-PID series are opt-in
    assert (g0.mig_mode_enabled, g0.mig) == (0.0, [])  # SPX
    assert g0.unsupported == set()

    assert g1.uuid == "55ff74a1-0000-1000-8031-7e2a3c4d5e6f" and g1.pci_bus_id == "0000:8a:00.0"
    assert g1.power_watts == 141.0  # only the average is reported on this one
    assert g1.energy_joules == 2_000_000_000 * 15.25 / 1e6
    assert (g1.pcie_link_generation, g1.pcie_link_width) == (4.0, 8.0)  # 16000 MT/s x8
    assert g1.pcie_replay_total == 7.0  # from the sysfs counter: pcie_info has none
    assert g1.fan_speed_ratio == 0.0
    assert g1.ecc_errors[("uncorrected", "volatile")] == 2.0
    assert g1.link_up == {0: 1.0, 1: 0.0}
    assert set(g1.throttle_reasons.values()) == {0.0}
    assert "video" not in g1.clock_hertz


def test_unsupported_fields_are_absent_not_zero(backend: AmdSmiBackend, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.backends")
    for _ in range(2):
        g1 = collect(backend).gpus[1]
        assert "memory" not in g1.temperature_celsius  # no VRAM sensor on this GPU
        assert g1.temperature_celsius == {"gpu": 38.0, "junction": 44.0}
        assert g1.process_count is None and g1.process_memory_used_bytes is None
        assert g1.unsupported == {"gpu_processes", "gpu_processes_memory_used_bytes"}
    logged = [r.getMessage() for r in caplog.records if "gpu_processes not available" in r.getMessage()]
    assert logged == ["amdsmi: GPU 1: gpu_processes not available (amdsmi_get_gpu_process_list: "
                      "AMDSMI_STATUS_NOT_SUPPORTED); the series is omitted"]  # once, not per scrape


def test_injected_not_supported_on_one_call(fake: FakeAmdSmi, backend: AmdSmiBackend) -> None:
    gpus = two_gpu_fleet()
    gpus[0]["fail.get_power_info"] = fakeamdsmi.STATUS_NOT_SUPPORTED
    fake.write(gpus, rocm_version="6.2.1")
    g0 = collect(backend).gpus[0]
    assert g0.power_watts is None
    assert "gpu_power_watts" in g0.unsupported
    assert g0.power_limit_watts == 750.0  # other readings unaffected


def test_device_error_marks_only_that_gpu_down(fake: FakeAmdSmi, backend: AmdSmiBackend) -> None:
    gpus = two_gpu_fleet()
    fake.write(gpus, rocm_version="6.2.1")
    healthy = collect(backend).gpus[1]
    backend.drain_errors()  # counted below: this collection's only
    gpus[1]["fail.all"] = fakeamdsmi.STATUS_DRM_ERROR
    fake.write(gpus, rocm_version="6.2.1")
    out = collect(backend)
    g0, g1 = out.gpus
    assert g0.up and g0.power_watts == 612.0
    assert not g1.up
    assert g1.up_reason is not None and "amdsmi_get_gpu_activity: AMDSMI_STATUS_DRM_ERROR" in g1.up_reason
    assert (g1.uuid, g1.index) == ("55ff74a1-0000-1000-8031-7e2a3c4d5e6f", 1)  # identity kept
    # all of it, as while it answered (gpu_info keeps its labels; nvml keeps them the same way)
    ident = ("name", "pci_bus_id", "serial", "driver_version", "cuda_driver_version", "firmware_version", "vendor")
    assert healthy.firmware_version is not None
    assert {k: getattr(g1, k) for k in ident} == {k: getattr(healthy, k) for k in ident}
    assert g1.power_watts is None and g1.temperature_celsius == {}
    # the funnel's errors are the backend's; the GPU published down is the collection's own count (a
    # collection the engine started again takes the reads over, and counts the GPU once): the engine adds both
    assert backend.drain_errors() == {"reading_error": AmdSmiBackend.DOWN_AFTER}
    assert out.errors == {"gpu_error": 1}


def test_device_error_on_one_field_keeps_the_gpu_up(fake: FakeAmdSmi, backend: AmdSmiBackend) -> None:
    gpus = two_gpu_fleet()
    gpus[0]["fail.get_temp_metric"] = fakeamdsmi.STATUS_DRM_ERROR
    fake.write(gpus, rocm_version="6.2.1")
    out = collect(backend)
    assert out.gpus[0].up and out.gpus[0].temperature_celsius == {}
    assert out.gpus[0].utilization_ratio == 0.87
    errors = backend.drain_errors()
    assert errors["reading_error"] == 3  # edge, hotspot, vram
    assert set(errors) <= {"reading_error", "unsupported"}


def test_library_failure_then_recovery(fake: FakeAmdSmi, backend: AmdSmiBackend) -> None:
    assert len(collect(backend).gpus) == 2
    fake.write(two_gpu_fleet(), rocm_version="6.2.1", fail_all=fakeamdsmi.STATUS_DRIVER_NOT_LOADED)
    with pytest.raises(BackendError) as err:
        collect(backend)
    assert err.value.kind == "driver"
    assert str(err.value) == "amdsmi: amdsmi_get_gpu_activity failed: AMDSMI_STATUS_DRIVER_NOT_LOADED"
    backend.reset()
    # still broken: the next initialisation fails and says why
    with pytest.raises(BackendUnavailable, match="AMDSMI_STATUS_DRIVER_NOT_LOADED"):
        backend.init()
    fake.write(two_gpu_fleet(), rocm_version="6.2.1")  # the driver is back
    backend.reset()
    out = collect(backend)  # collect re-initialises by itself after reset
    assert [g.uuid for g in out.gpus] == ["9dff74a1-0000-1000-8020-5b1f1f2b6ac6",
                                          "55ff74a1-0000-1000-8031-7e2a3c4d5e6f"]
    assert out.gpus[0].power_watts == 612.0


def test_not_initialised_library_is_a_library_error(fake: FakeAmdSmi, backend: AmdSmiBackend) -> None:
    fake.write(two_gpu_fleet(), fail_all=fakeamdsmi.STATUS_NOT_INIT)
    with pytest.raises(BackendError) as err:
        collect(backend)
    assert err.value.kind == "driver"


def test_init_failure_is_unavailable(fake: FakeAmdSmi) -> None:
    fake.write(two_gpu_fleet(), init_status=fakeamdsmi.STATUS_DRIVER_NOT_LOADED)
    with pytest.raises(BackendUnavailable) as err:
        AmdSmiBackend().init()
    assert str(err.value) == ("amdsmi not available: amdsmi: amdsmi_init failed: "
                              "AMDSMI_STATUS_DRIVER_NOT_LOADED")


def test_no_gpu_is_unavailable(fake: FakeAmdSmi) -> None:
    fake.write([])
    with pytest.raises(BackendUnavailable, match=r"^amdsmi not available: no AMD GPU found$"):
        AmdSmiBackend().init()


def test_uuid_fallbacks(fake: FakeAmdSmi) -> None:
    gpus = two_gpu_fleet()
    del gpus[0]["uuid"]  # derived from the ASIC serial and device ID, as amdsmi does
    gpus[1].update(uuid="00ff74a1-0000-1000-8000-000000000000", asic_serial="", product_serial="0")
    fake.write(gpus)
    b = AmdSmiBackend()
    b.init()
    g0, g1 = collect(b).gpus
    assert g0.uuid == amd_uuid(0x9D205B1F1F2B6AC6, 0x74A1) == "9dff74a1-0000-1000-8020-5b1f1f2b6ac6"
    assert g1.uuid == "amd-pci-0000:8a:00.0"  # a zero serial identifies nothing
    assert g1.serial is None


def test_partitions_in_the_style_of_mig(fake: FakeAmdSmi) -> None:
    part: dict[str, object] = {"compute_partition": "CPX", "memory_partition": "NPS4",
                               "uuid": "9dff74a1-0000-1000-8020-5b1f1f2b6ac6"}
    gpus = two_gpu_fleet()
    gpus[0].update(part, partition_id=0)
    gpus[1].update(part, partition_id=1)  # two partitions of one GPU share its UUID
    fake.write(gpus)
    b = AmdSmiBackend()
    b.init()
    g0, g1 = collect(b).gpus
    assert (g0.uuid, g1.uuid) == ("9dff74a1-0000-1000-8020-5b1f1f2b6ac6-p0", "9dff74a1-0000-1000-8020-5b1f1f2b6ac6-p1")
    assert g0.mig_mode_enabled == g1.mig_mode_enabled == 1.0
    (m,) = g1.mig
    assert (m.gpu_instance_id, m.profile, m.memory_total_bytes) == (1, "CPX/NPS4", 192 * GIB)


def test_throttle_from_residency_counters(fake: FakeAmdSmi) -> None:
    """MI300 reports no throttle bits, only residency accumulators: active = grew since last time."""
    def fleet(acc: int, ppt: int, thm: int) -> list[dict[str, object]]:
        gpus = two_gpu_fleet()[:1]
        del gpus[0]["metrics.indep_throttle_status"]
        gpus[0].update({"metrics.accumulation_counter": acc, "metrics.ppt_residency_acc": ppt,
                        "metrics.socket_thm_residency_acc": thm, "metrics.prochot_residency_acc": 0})
        return gpus
    fake.write(fleet(1000, 10, 5))
    b = AmdSmiBackend()
    b.init()
    assert collect(b).gpus[0].throttle_reasons == {}  # one sample: no interval yet
    fake.write(fleet(2000, 400, 5))
    assert collect(b).gpus[0].throttle_reasons == {"sw_power_cap": 1.0, "sw_thermal_slowdown": 0.0,
                                                   "hw_slowdown": 0.0}  # VR/HBM counters N/A: absent


def test_topology_between_the_two_gpus(backend: AmdSmiBackend) -> None:
    peers = {(p.gpu, p.peer): p for p in collect(backend).peers}
    assert set(peers) == {(0, 1), (1, 0)}
    for p in peers.values():
        assert p.p2p == {"read": 1.0, "write": 1.0, "xgmi": 1.0}
        assert (p.topology_level, p.topology_level_value) == ("system", 50)  # NUMA nodes 0 and 1


def test_disabled_families_are_not_read(fake: FakeAmdSmi) -> None:
    gpus = two_gpu_fleet()
    gpus[0]["fail.get_temp_metric"] = fakeamdsmi.STATUS_DRM_ERROR  # would count errors if called
    fake.write(gpus)
    b = AmdSmiBackend(BackendOptions(fields=FieldFilter(exclude=["gpu_temperature_celsius"]), per_process=True))
    b.init()
    out = collect(b)
    assert out.errors == {} and out.gpus[0].temperature_celsius == {}
    assert out.gpus[0].process_memory_by_pid == {4242: 32 * GIB, 4343: 1 * GIB}


def test_rocm_smi_reads_the_same_fleet_the_same_way(backend: AmdSmiBackend) -> None:
    """Both AMD backends label one GPU identically and agree where both can read a value."""
    via_lib = collect(backend).gpus
    via_cli = parse_rocm_smi_json(rocm_smi_json(two_gpu_fleet()))
    same = ("index", "uuid", "vendor", "name", "pci_bus_id", "serial", "driver_version", "firmware_version",
            "utilization_ratio", "memory_utilization_ratio", "memory_total_bytes", "memory_used_bytes",
            "memory_free_bytes", "temperature_celsius", "power_watts", "power_limit_watts", "clock_hertz",
            "pcie_link_generation", "pcie_link_width", "pcie_replay_total", "mig_mode_enabled")
    for lib, cli in zip(via_lib, via_cli, strict=True):
        assert {k: getattr(cli, k) for k in same} == {k: getattr(lib, k) for k in same}
        assert cli.energy_joules == pytest.approx(lib.energy_joules, abs=1e-6)
    assert via_cli[0].fan_speed_ratio == pytest.approx(via_lib[0].fan_speed_ratio, abs=0.005)  # % vs /255


def test_import_failure_is_reported_and_stdout_stays_clean(tmp_path: Path) -> None:
    """Without libamd_smi.so the wrapper prints two lines and raises KeyError; we print nothing."""
    if Path("/opt/rocm/lib/libamd_smi.so").exists():
        pytest.skip("a real ROCm install would be found")
    env = {k: v for k, v in os.environ.items() if k not in ("ROCM_HOME", "LD_LIBRARY_PATH", "ROCM_PATH")}
    env["ROCM_PATH"] = str(tmp_path)  # no lib/ here
    code = ("from exporter.backends.amdsmi import AmdSmiBackend\n"
            "from exporter.backends.base import BackendUnavailable\n"
            "try:\n    AmdSmiBackend().init()\n"
            "except BackendUnavailable as e:\n    import sys; sys.stderr.write(str(e))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    assert proc.stdout == ""
    # the wrapper's last try is $ROCM_PATH/lib; its loader message is the reason
    assert proc.stderr == (f"amdsmi not available: libamd_smi.so could not be loaded ({tmp_path}/lib/libamd_smi.so: "
                           "cannot open shared object file: No such file or directory)")
