"""An NVIDIA family read by one NVML call is its schema row and one ``SIMPLE`` entry (docs/extending.md, "A new
metric family"), a call that also writes a sampling period included: in a copy of the package, a JPEG-decoder
row, its ``Simple("nvmlDeviceGetJpgUtilization", 0.01, trailing=1)`` and the backend's declaration are the whole
change, and the family is served over the fake NVML, absent (never 0) on a driver without the function."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.fakenvml import FakeNvml
from tests.harness.exporter import ExporterProcess, sample
from tests.harness.tree import edit, package_copy

pytestmark = pytest.mark.slow  # builds a copy of the package and starts the exporter

ROW = '''    _g("gpu_jpeg_utilization_ratio", GAUGE, "ratio", "JPEG decoder (NVJPG) utilisation (0-1).", "utilization",
       "jpeg_utilization_ratio", "nvmlDeviceGetJpgUtilization (%)",
       {"nvidia-smi": "(nvidia-smi -q: JPEG)", "amd-smi": "amd-smi metric --usage: jpeg_activity"}),
'''
ENTRY = '''    "gpu_jpeg_utilization_ratio": (Simple("nvmlDeviceGetJpgUtilization", 0.01, trailing=1),),  # (%, period)
'''


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = package_copy(tmp_path_factory.mktemp("tree"))
    pkg = root / "exporter"
    edit(pkg / "core" / "schema.py", "    # --- memory ----", ROW, before=True)
    edit(pkg / "backends" / "nvml.py", "SIMPLE: dict[str, tuple[Simple, ...]] = {\n", ENTRY)
    edit(pkg / "backends" / "nvml.py", "    families: ClassVar[frozenset[str]] = frozenset({\n",
          '        "gpu_jpeg_utilization_ratio",\n')
    return root


def test_the_row_and_its_entry_serve_it(tree: Path, tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2)
    fleet.set(1, jpg_util=37)
    with ExporterProcess(["--backend", "nvml", "--sysfs-root", str(tmp_path / "sys")], env=fleet.env(),
                         cwd=tree) as ex:
        s = ex.scrape()
        text = ex.scrape_text()
    assert sample(s, "gpu_jpeg_utilization_ratio", gpu="1") == pytest.approx(0.37)
    assert sample(s, "gpu_jpeg_utilization_ratio", gpu="0") == pytest.approx(fleet.gpus[0]["jpg_util"] / 100)
    assert "# HELP gpu_jpeg_utilization_ratio JPEG decoder (NVJPG) utilisation (0-1)." in text


def test_a_driver_without_the_function_leaves_it_absent(tree: Path, tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2, omit=["nvmlDeviceGetJpgUtilization"])
    with ExporterProcess(["--backend", "nvml", "--sysfs-root", str(tmp_path / "sys")], env=fleet.env(),
                         cwd=tree) as ex:
        text = ex.scrape_text()
    assert "gpu_jpeg_utilization_ratio{" not in text
    assert 'gpu_power_watts{gpu="1"' in text  # one missing function, one missing reading
