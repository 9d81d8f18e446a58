"""GPUs on the PCI bus from sysfs: counted on every collection, read from sysfs only when a
device's files changed (a server lists a few hundred PCI functions)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from exporter.core import pci
from exporter.core.pci import count_pci_gpus, pci_gpus
from tests.fakes.fakenvml import make_sysfs

GPU, AUDIO, VGA = 0x030200, 0x040300, 0x030000

NVIDIA_VENDOR, AMD_VENDOR = 0x10DE, 0x1002  # PCI vendor IDs (the backends declare theirs)


def _replace(path: Path, text: str) -> None:
    """Rewrite a sysfs file as the kernel's re-enumeration would present it: a new file."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    make_sysfs(tmp_path, [("0000:18:00.0", NVIDIA_VENDOR, GPU), ("0000:18:00.1", NVIDIA_VENDOR, AUDIO),
                          ("0000:3b:00.0", NVIDIA_VENDOR, GPU), ("0000:c1:00.0", AMD_VENDOR, GPU),
                          ("0000:02:00.0", 0x1A03, VGA)])  # the BMC's VGA
    return tmp_path


def test_gpus_of_a_vendor_in_bus_order(sysfs: Path) -> None:
    assert pci_gpus(str(sysfs), NVIDIA_VENDOR) == ["0000:18:00.0", "0000:3b:00.0"]
    assert pci_gpus(str(sysfs), AMD_VENDOR) == ["0000:c1:00.0"]
    assert count_pci_gpus(str(sysfs / "missing"), NVIDIA_VENDOR) is None


def test_unchanged_devices_are_not_read_again(sysfs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert count_pci_gpus(str(sysfs), NVIDIA_VENDOR) == 2
    reads: list[str] = []
    real = pci._read_hex
    monkeypatch.setattr(pci, "_read_hex", lambda p: reads.append(p) or real(p))
    assert count_pci_gpus(str(sysfs), NVIDIA_VENDOR) == 2
    assert reads == []
    # the AMD count reads the class of the AMD GPU it had not needed before, and nothing else
    assert count_pci_gpus(str(sysfs), AMD_VENDOR) == 1
    assert [Path(p).parent.name + "/" + Path(p).name for p in reads] == ["0000:c1:00.0/class"]
    # both vendors counted in turn (an NVIDIA and an AMD backend on one node): nothing read again
    reads.clear()
    assert count_pci_gpus(str(sysfs), NVIDIA_VENDOR) == 2 and count_pci_gpus(str(sysfs), AMD_VENDOR) == 1
    assert reads == []


def test_changes_are_seen(sysfs: Path) -> None:
    base = sysfs / "bus" / "pci" / "devices"
    assert count_pci_gpus(str(sysfs), NVIDIA_VENDOR) == 2
    shutil.rmtree(base / "0000:3b:00.0")  # fell off the bus: the kernel removed it
    assert pci_gpus(str(sysfs), NVIDIA_VENDOR) == ["0000:18:00.0"]
    _replace(base / "0000:18:00.1" / "class", f"0x{GPU:06x}\n")
    assert pci_gpus(str(sysfs), NVIDIA_VENDOR) == ["0000:18:00.0", "0000:18:00.1"]
    _replace(base / "0000:c1:00.0" / "vendor", f"0x{NVIDIA_VENDOR:04x}\n")
    assert pci_gpus(str(sysfs), NVIDIA_VENDOR) == ["0000:18:00.0", "0000:18:00.1", "0000:c1:00.0"]
    make_sysfs(sysfs, [("0000:3b:00.0", NVIDIA_VENDOR, GPU)])  # back after a rescan
    assert count_pci_gpus(str(sysfs), NVIDIA_VENDOR) == 4
    (base / "0000:18:00.0" / "vendor").unlink()  # unreadable: not counted, and read again later
    assert count_pci_gpus(str(sysfs), NVIDIA_VENDOR) == 3
    (base / "0000:18:00.0" / "vendor").write_text(f"0x{NVIDIA_VENDOR:04x}\n")
    assert count_pci_gpus(str(sysfs), NVIDIA_VENDOR) == 4


def test_the_cache_holds_only_listed_devices(sysfs: Path) -> None:
    base = sysfs / "bus" / "pci" / "devices"
    count_pci_gpus(str(sysfs), NVIDIA_VENDOR)
    mine = {k for k in pci._ATTRS if k.startswith(str(base) + os.sep)}
    assert len(mine) == 5
    shutil.rmtree(base / "0000:02:00.0")
    count_pci_gpus(str(sysfs), NVIDIA_VENDOR)
    assert {k for k in pci._ATTRS if k.startswith(str(base) + os.sep)} == mine - {str(base / "0000:02:00.0")}
