"""The NVML state nvidia_gpu_exporter's dashboards read (issue 28), through the real pynvml over the
fake libnvidia-ml: default power limit, compute mode, VBIOS version, NVLink fabric state and the
driver's recovery action. Each comes from its own NVML call, in SI units or as NVML's enum number,
and is absent (never 0) where the driver or GPU cannot give it."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.fakenvml import INVALID_ARGUMENT, NOT_SUPPORTED, FakeNvml
from tests.harness.exporter import ExporterProcess, sample

FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION


def scrape(fleet: FakeNvml, tmp_path: Path) -> dict[tuple[str, frozenset], float]:
    with ExporterProcess(["--backend", "nvml", "--cache-ttl", "0", "--sysfs-root", str(tmp_path / "sys")],
                         env=fleet.env()) as ex:
        return ex.scrape()


def info_label(s: dict[tuple[str, frozenset], float], gpu: str, label: str) -> str:
    (labels,) = [dict(ls) for (n, ls), _ in s.items() if n == "gpu_info" and dict(ls)["gpu"] == gpu]
    return labels[label]


def test_values_in_si_units_and_nvml_enums(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2)
    fleet.set(1, default_limit_mw=650_500, compute_mode=3, fabric_state=2, recovery_action=4,
              vbios_version="96.00.89.00.01")
    s = scrape(fleet, tmp_path)
    assert sample(s, "gpu_power_default_limit_watts", gpu="0") == 700.0
    assert sample(s, "gpu_power_default_limit_watts", gpu="1") == 650.5
    assert (sample(s, "gpu_compute_mode", gpu="0"), sample(s, "gpu_compute_mode", gpu="1")) == (0.0, 3.0)
    assert (sample(s, "gpu_fabric_state", gpu="0"), sample(s, "gpu_fabric_state", gpu="1")) == (3.0, 2.0)
    assert (sample(s, "gpu_recovery_action", gpu="0"), sample(s, "gpu_recovery_action", gpu="1")) == (0.0, 4.0)
    assert info_label(s, "0", "vbios_version") == "96.00.99.00.01"
    assert info_label(s, "1", "vbios_version") == "96.00.89.00.01"


def test_a_gpu_without_fabric_and_a_driver_without_the_recovery_field(tmp_path: Path) -> None:
    """Fabric state 0 is NVML's "not supported" (a PCIe GPU, no NVSwitch); a driver that does not know
    the recovery-action field answers it with an error of its own (other readings stay)."""
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2)
    fleet.set(0, fabric_state=0)
    fleet.field_fails[(FIELD_RECOVERY_ACTION, 0)] = NOT_SUPPORTED
    fleet.field_fails[(FIELD_RECOVERY_ACTION, 1)] = INVALID_ARGUMENT
    fleet.write()
    s = scrape(fleet, tmp_path)
    assert sample(s, "gpu_fabric_state", gpu="0") is None
    assert sample(s, "gpu_fabric_state", gpu="1") == 3.0
    assert sample(s, "gpu_field_unsupported", gpu="0", field="gpu_fabric_state") == 1.0
    assert sample(s, "gpu_recovery_action", gpu="0") is None
    assert sample(s, "gpu_recovery_action", gpu="1") is None
    assert sample(s, "gpu_up", gpu="1") == 1.0 and sample(s, "gpu_compute_mode", gpu="1") == 0.0


def test_missing_functions_leave_their_families_absent(tmp_path: Path) -> None:
    """An R470 driver has no nvmlDeviceGetGpuFabricInfo; older or trimmed libraries may lack the others."""
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=1, omit=["nvmlDeviceGetGpuFabricInfo",
                                                           "nvmlDeviceGetPowerManagementDefaultLimit",
                                                           "nvmlDeviceGetComputeMode", "nvmlDeviceGetVbiosVersion"])
    s = scrape(fleet, tmp_path)
    for family in ("gpu_fabric_state", "gpu_power_default_limit_watts", "gpu_compute_mode"):
        assert sample(s, family, gpu="0") is None, family
    assert info_label(s, "0", "vbios_version") == ""
    assert sample(s, "gpu_up", gpu="0") == 1.0 and sample(s, "gpu_recovery_action", gpu="0") == 0.0
