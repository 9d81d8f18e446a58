"""AMD GPUs through the ``rocm-smi`` command line tool: the fallback when ``libamd_smi.so`` is absent.

One ``rocm-smi ... --json`` run per collection reads every GPU (never one run per GPU), with a
hard timeout after which the whole process group is killed (exporter/backends/cli.py, the CLI
backends' common part). Because a run costs a Python start-up (about a second), the collector
serves its readings at most every :attr:`RocmSmiBackend.min_interval` seconds.

Options (:data:`ROCM_SMI_ARGS`) are limited to those present in every ``rocm_smi.py`` from
ROCm 5.7.1 to 6.2.x (checked against the tagged sources); an unknown option makes older
versions exit with a usage error. ``--showmemorypartition`` (6.0+) is therefore not asked
for, though a "Memory Partition" key is parsed when present.

rocm-smi exits with the status of the last failed library call, so a non-zero exit with a
complete JSON document (some field unsupported on some GPU) is normal: the readings are
used and the exit code is logged once. A non-zero exit without JSON, a timeout, or output
that is not one complete JSON object fails the collection with :class:`BackendError`.

JSON keys differ between ROCm versions; :func:`parse_rocm_smi_json` reads every variant
(all values are strings; "N/A", "(Secondary die)" and "N/A (Secondary die)" mean absent):

==================  ==============================================================
reading             keys
==================  ==============================================================
name                "Card Series" (6.1+) / "Card series", else "Device Name"
device id           "Device ID" (6.0+) / "GPU ID" (5.x)
uuid                from "Unique ID" + device id (amdsmi's UUID, see ``amdsmi.amd_uuid``),
                    else ``amd-serial-<Serial Number>``, else ``amd-pci-<PCI Bus>``
power               "Current Socket Graphics Package Power (W)" (MI300, APUs),
                    else "Average Graphics Package Power (W)"
power limit         "Max Graphics Package Power (W)" (the current power cap)
memory activity     "GPU Memory Read/Write Activity (%)" (6.1+) / "GPU memory use (%)"
                    (before 6.1: the same busy percent). "GPU Memory Allocated (VRAM%)"
                    is VRAM *allocation*, already given in bytes, and is not used.
                    Also gpu_dram_active_ratio, as "GPU use (%)" is also
                    gpu_graphics_engine_active_ratio (amdsmi's gpu_metrics sources).
temperatures        "Temperature (Sensor edge|junction|memory) (C)" -> gpu|junction|memory
clocks              "sclk|mclk|socclk|vclk0 clock speed:" "(1402Mhz)" -> graphics|memory|soc|video
PCIe link           "pcie clock level" "1 (16.0GT/s x16)" -> generation 4, width 16
==================  ==============================================================

Ignored: bare numeric keys ("0", "1", ...: clock level lists of ``-s``, which overwrite one
another in the JSON), the "system" section except "Driver version", and the topology keys.
Not available from rocm-smi JSON: maximum clocks, PCIe maximum link, ECC totals, XGMI link
state, throttle reasons, per-process memory, ROCm version, multimedia (VCN) activity and the
XGMI/PCIe data accumulators ("Memory Activity" and "Avg. Memory Bandwidth" are "N/A" or 0 in
every recorded output and are not used).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from typing import Any, ClassVar

from exporter.backends.amdsmi import KUBERNETES, PCI_VENDOR, amd_uuid, dedupe_uuids, is_na
from exporter.backends.base import BAD_VALUE, BackendError
from exporter.backends.cli import COMMAND_TIMEOUT, CliBackend, Result, path_setting
from exporter.core.k8s_names import KubernetesNames
from exporter.core.options import BackendSetting
from exporter.core.pci import canonical_bus_id
from exporter.core.readings import GpuReading

log = logging.getLogger(__name__)

#: one run reads everything for every GPU; each option exists in rocm-smi 5.7.1 .. 6.2.x
ROCM_SMI_ARGS: tuple[str, ...] = (
    "--showid", "--showproductname", "--showuniqueid", "--showserial", "--showbus", "--showdriverversion",
    "--showvbios", "--showtemp", "--showuse", "--showmemuse", "--showpower", "--showmaxpower",
    "--showenergycounter", "--showclocks", "--showfan", "--showreplaycount", "--showcomputepartition",
    "--showmeminfo", "vram", "--json",
)

_CARD_RE = re.compile(r"^card(\d+)$")
_NUMBER_RE = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_CLOCK_RE = re.compile(r"\(?\s*(\d+(?:\.\d+)?)\s*([kMG]?)hz\s*\)?", re.IGNORECASE)
_PCIE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*GT/s\s*x(\d+)", re.IGNORECASE)
_CLOCK_KEYS = {"sclk": "graphics", "mclk": "memory", "socclk": "soc", "vclk0": "video"}
_TEMP_KEYS = {"edge": "gpu", "junction": "junction", "memory": "memory"}
_PCIE_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_CLOCK_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}


class RocmSmiParseError(ValueError):
    """rocm-smi printed something that is not a complete JSON document of cards."""


def _value(card: dict[str, Any], *keys: str) -> str | None:
    """The first of ``keys`` present with a real value (not "N/A"/"(Secondary die)")."""
    for key in keys:
        v = card.get(key)
        if isinstance(v, str) and not is_na(v):
            return v.strip()
    return None


def _number(card: dict[str, Any], *keys: str) -> float | None:
    v = _value(card, *keys)
    if v is None:
        return None
    m = _NUMBER_RE.search(v)
    return float(m.group()) if m else None


def _clock_hertz(text: str | None) -> float | None:
    if text is None:
        return None
    m = _CLOCK_RE.search(text)
    return float(m.group(1)) * _CLOCK_SCALE[m.group(2).lower()] if m else None


def decode_rocm_smi_json(text: str) -> dict[str, Any]:
    """The JSON object rocm-smi printed; RocmSmiParseError saying where it broke."""
    stripped = text.lstrip()
    start = len(text) - len(stripped)
    if not stripped.startswith(("{", "[")):
        # rocm-smi may print a warning line before the JSON: start at the first line that opens it
        line = text.find("\n{")
        if line < 0:
            snippet = " ".join(text.split())[:60]
            raise RocmSmiParseError(f"no JSON object in the output ({snippet!r})" if snippet else "empty output")
        log.debug("rocm-smi printed text before its JSON: %r", text[:line].strip()[:120])
        start = line + 1
    try:
        doc, end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise RocmSmiParseError(f"invalid JSON at line {exc.lineno} column {exc.colno} "
                                f"(char {exc.pos}): {exc.msg}") from None
    except RecursionError:
        raise RocmSmiParseError("JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise RocmSmiParseError(f"JSON top level is a {type(doc).__name__}, not an object")
    if text[end:].strip():
        raise RocmSmiParseError(f"unexpected text after the JSON object at char {end}")
    return doc


def parse_rocm_smi_json(text: str) -> list[GpuReading]:
    """Readings for every ``cardN`` in rocm-smi's JSON, ordered by N (the rocm-smi device index).

    Pure function of the text. Raises :class:`RocmSmiParseError` (a ValueError) for output
    that is not one complete JSON object; unknown keys are ignored.
    """
    doc = decode_rocm_smi_json(text)
    raw_system = doc.get("system")
    system: dict[str, Any] = raw_system if isinstance(raw_system, dict) else {}
    driver = _value(system, "Driver version")
    cards = sorted(((int(m.group(1)), v) for k, v in doc.items()
                    if (m := _CARD_RE.match(k)) and isinstance(v, dict)), key=lambda c: c[0])
    for (a, _), (b, _) in itertools.pairwise(cards):
        if a == b:  # "card1" and "card01": two GPUs cannot share a device index
            raise RocmSmiParseError(f"card {a} appears twice")
    readings = [_card_reading(index, card, driver) for index, card in cards]
    unique = dedupe_uuids([(r.uuid, None, r.index) for r in readings])
    for r, uuid in zip(readings, unique, strict=True):
        r.uuid = uuid
    return readings


def _card_reading(index: int, card: dict[str, Any], driver: str | None) -> GpuReading:
    bus = canonical_bus_id(_value(card, "PCI Bus"))
    serial = _value(card, "Serial Number")
    if serial is not None and not serial.strip("0"):
        serial = None  # "0" on boards without a FRU serial (MI100, ROCm 5.7)
    uuid = None
    unique_id, device_id = _value(card, "Unique ID"), _value(card, "Device ID", "GPU ID")
    if unique_id and device_id:
        try:
            uuid = amd_uuid(int(unique_id, 16), int(device_id, 16))
        except ValueError:
            uuid = None
    if uuid is None and serial:
        uuid = f"amd-serial-{serial}"
    if uuid is None and bus:
        uuid = f"amd-pci-{bus}"
    r = GpuReading(
        index=index,
        uuid=uuid or f"amd-index-{index}",
        vendor="amd",
        name=_value(card, "Card Series", "Card series", "Device Name"),
        pci_bus_id=bus,
        serial=serial,
        driver_version=driver,
        firmware_version=_value(card, "VBIOS version"),
    )
    if (v := _number(card, "GPU use (%)")) is not None:
        r.utilization_ratio = v / 100.0
        r.graphics_engine_active_ratio[""] = v / 100.0  # gpu_metrics' gfx activity, as amdsmi publishes it
    if (v := _number(card, "GPU Memory Read/Write Activity (%)", "GPU memory use (%)")) is not None:
        r.memory_utilization_ratio = v / 100.0
        r.dram_active_ratio[""] = v / 100.0  # the memory controller's busy share, as amdsmi publishes it
    r.memory_total_bytes = _number(card, "VRAM Total Memory (B)")
    r.memory_used_bytes = _number(card, "VRAM Total Used Memory (B)")
    if r.memory_total_bytes is not None and r.memory_used_bytes is not None:
        r.memory_free_bytes = max(0.0, r.memory_total_bytes - r.memory_used_bytes)
    for sensor, name in _TEMP_KEYS.items():
        if (v := _number(card, f"Temperature (Sensor {sensor}) (C)")) is not None:
            r.temperature_celsius[name] = v
    r.power_watts = _number(card, "Current Socket Graphics Package Power (W)",
                            "Average Graphics Package Power (W)")
    r.power_limit_watts = _number(card, "Max Graphics Package Power (W)") or None
    if (v := _number(card, "Accumulated Energy (uJ)")) is not None:
        r.energy_joules = v / 1e6
    for clk, name in _CLOCK_KEYS.items():
        if (hz := _clock_hertz(_value(card, f"{clk} clock speed:"))) is not None:
            r.clock_hertz[name] = hz
    pcie = _value(card, "pcie clock level")
    if pcie and (m := _PCIE_RE.search(pcie)):
        gen = _PCIE_GEN_BY_GTS.get(float(m.group(1)))
        r.pcie_link_generation = float(gen) if gen else None
        r.pcie_link_width = float(m.group(2))
    r.pcie_replay_total = _number(card, "PCIe Replay Count")
    if (v := _number(card, "Fan speed (%)")) is not None:
        r.fan_speed_ratio = min(1.0, v / 100.0)
    partition = _value(card, "Compute Partition")
    if partition:
        r.mig_mode_enabled = 0.0 if partition.upper() == "SPX" else 1.0
    return r


class RocmSmiBackend(CliBackend):
    """AMD GPUs via one ``rocm-smi --json`` run per collection (at most every 10 s)."""

    name: ClassVar[str] = "rocm-smi"
    auto_priority: ClassVar[int | None] = 30
    floor: ClassVar[str] = (
        "ROCm 5.7.1 (recorded outputs of 5.7.1, 6.0.2 and 6.1.2 in `tests/fixtures/rocm-smi/`)")
    below_floor: ClassVar[str] = "Fields an older `rocm-smi` does not print are absent."
    vendor: ClassVar[str] = "amd"
    tool: ClassVar[str] = "rocm-smi"
    directories: ClassVar[tuple[str, ...]] = ("$ROCM_PATH/bin", "/opt/rocm/bin")
    arguments: ClassVar[tuple[str, ...]] = ROCM_SMI_ARGS
    #: the families this backend fills (docs/metrics.md's support table; the contract test checks it)
    families: ClassVar[frozenset[str]] = frozenset({
        "gpu_field_unsupported", "gpu_utilization_ratio", "gpu_memory_utilization_ratio", "gpu_memory_total_bytes",
        "gpu_memory_used_bytes", "gpu_memory_free_bytes", "gpu_temperature_celsius", "gpu_fan_speed_ratio",
        "gpu_power_watts", "gpu_power_limit_watts", "gpu_energy_joules_total", "gpu_clock_hertz",
        "gpu_pcie_link_generation", "gpu_pcie_link_width", "gpu_pcie_replays_total", "gpu_graphics_engine_active_ratio",
        "gpu_dram_active_ratio", "gpu_mig_mode_enabled",
    })
    pci_vendor: ClassVar[int | None] = PCI_VENDOR
    kubernetes: ClassVar[KubernetesNames] = KUBERNETES  # amdsmi's: the same GPUs, the same device plugin
    settings: ClassVar[tuple[BackendSetting, ...]] = (
        path_setting("rocm-smi", "rocm-smi", "PATH, then /opt/rocm/bin/rocm-smi",
                                 "/opt/rocm/bin/rocm-smi"), COMMAND_TIMEOUT)

    def usable(self, result: Result) -> bool:
        """rocm-smi exits with the status of the last failed library call: complete JSON is still its answer."""
        try:
            decode_rocm_smi_json(result.stdout)
        except RocmSmiParseError:
            return False
        return True

    def parse(self, result: Result) -> list[GpuReading]:
        try:
            return parse_rocm_smi_json(result.stdout)
        except RocmSmiParseError as exc:
            raise BackendError(f"rocm-smi output unusable: {exc}", kind=BAD_VALUE) from None


BACKEND = RocmSmiBackend
