"""PCI identity: the one bus-ID canonicaliser, and the GPU count on the PCI bus (sysfs).

Every backend and the pod-attribution code spell a bus ID the same way, ``0000:3b:00.0``
(lower case, 4-digit domain as in sysfs), through :func:`canonical_bus_id`.

Counting GPUs on the bus catches a GPU that "fell off the bus".

The vendor library only reports GPUs it can talk to; the PCI bus still lists a device
the driver lost. ``gpu_pci_devices`` above ``gpu_visible_devices`` is the alert.
"""

from __future__ import annotations

import functools
import os
import re
import threading

# PCI class 0x03: display controllers (0x0300 VGA, 0x0302 3D). Excludes the same vendor's
# audio functions (0x0403), USB-C controllers (0x0c03) and NVSwitch bridges (0x0680).
DISPLAY_CLASS = 0x03


_BUS_ID = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])")


@functools.lru_cache(maxsize=1024)
def canonical_bus_id(value: str | None) -> str | None:
    """``0000:3b:00.0`` for any spelling of a PCI bus ID (NVML's 8-digit domain, no domain,
    upper case); None when ``value`` is not a PCI address ("N/A", empty, garbage)."""
    if not isinstance(value, str):
        return None
    m = _BUS_ID.fullmatch(value.strip().lower())
    if m is None:
        return None
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


def _read_hex(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read().strip(), 16)
    except (OSError, ValueError):
        return None


# device directory -> ((vendor file's identity, its value), (class file's identity, its value)):
# sysfs attributes of a PCI device are set when it is enumerated, so a file whose inode and
# times are unchanged holds the same value. A stat() costs a fraction of an open and read
# (a server has a few hundred PCI functions, read on every collection); a device that is
# removed and added again, or a file a test rewrites, has a new identity and is read again.
_Ident = tuple[int, int, int, int]
_ATTRS: dict[str, tuple[tuple[_Ident, int | None], tuple[_Ident, int | None] | None]] = {}
_ATTRS_LOCK = threading.Lock()


def _ident(path: str) -> _Ident | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns


def _attr(path: str, cached: tuple[_Ident, int | None] | None) -> tuple[_Ident, int | None] | None:
    """(identity, value) of a sysfs hex attribute, read only when its identity changed."""
    ident = _ident(path)
    if ident is None:
        return None
    if cached is not None and cached[0] == ident:
        return cached
    return ident, _read_hex(path)


def pci_gpus(sysfs_root: str, vendor: int) -> list[str] | None:
    """Canonical bus IDs of ``vendor``'s GPUs under ``<sysfs_root>/bus/pci/devices``, in bus order;
    None when sysfs is not readable."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        entries = os.listdir(base)
    except OSError:
        return None
    out: list[str] = []
    seen: set[str] = set()
    with _ATTRS_LOCK:  # two backends (nvml and amdsmi) may count at once
        for dev in entries:
            d = os.path.join(base, dev)
            seen.add(d)
            old = _ATTRS.get(d)
            ven = _attr(os.path.join(d, "vendor"), old[0] if old else None)
            if ven is None:
                _ATTRS.pop(d, None)
                continue
            known = old[1] if old and old[0] is ven else None  # a class read under an unchanged vendor
            if ven[1] != vendor:
                _ATTRS[d] = (ven, known)  # kept for the other vendor's count (NVIDIA and AMD backends)
                continue
            cls = _attr(os.path.join(d, "class"), known)
            _ATTRS[d] = (ven, cls)
            bus = canonical_bus_id(dev)
            if cls is not None and cls[1] is not None and cls[1] >> 16 == DISPLAY_CLASS and bus is not None:
                out.append(bus)
        prefix = base + os.sep
        for gone in [k for k in _ATTRS if k.startswith(prefix) and k not in seen]:
            del _ATTRS[gone]
    return sorted(out)


def count_pci_gpus(sysfs_root: str, vendor: int) -> int | None:
    """How many GPUs of ``vendor`` are on the PCI bus; None when sysfs is not readable."""
    found = pci_gpus(sysfs_root, vendor)
    return None if found is None else len(found)

