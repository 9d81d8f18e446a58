"""Count GPUs on the PCI bus from sysfs, to catch a GPU that "fell off the bus".

The vendor library only reports GPUs it can talk to; the PCI bus still lists a device
the driver lost. ``gpu_pci_devices`` above ``gpu_visible_devices`` is the alert.
"""

from __future__ import annotations

import os

NVIDIA_VENDOR = 0x10DE
AMD_VENDOR = 0x1002
# PCI class 0x03: display controllers (0x0300 VGA, 0x0302 3D). Excludes the same vendor's
# audio functions (0x0403), USB-C controllers (0x0c03) and NVSwitch bridges (0x0680).
DISPLAY_CLASS = 0x03


def _read_hex(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read().strip(), 16)
    except (OSError, ValueError):
        return None


def count_pci_gpus(sysfs_root: str, vendor: int) -> int | None:
    """GPUs of ``vendor`` under ``<sysfs_root>/bus/pci/devices``; None when sysfs is not readable."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        entries = os.listdir(base)
    except OSError:
        return None
    n = 0
    for dev in entries:
        d = os.path.join(base, dev)
        if _read_hex(os.path.join(d, "vendor")) != vendor:
            continue
        cls = _read_hex(os.path.join(d, "class"))
        if cls is not None and cls >> 16 == DISPLAY_CLASS:
            n += 1
    return n
