"""rocm-smi backend: every recorded output parses to the values in the files; a fake rocm-smi on PATH.

Expected values below were read off the JSON files in tests/fixtures/rocm-smi/ (see NOTICE),
converted to the reading units by hand: C, W, bytes, ratio = percent / 100, Hz = MHz * 1e6.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from exporter.backends import create, registry
from exporter.backends.amdsmi import amd_uuid
from exporter.backends.base import BackendError, BackendUnavailable
from exporter.backends.rocm_smi import ROCM_SMI_ARGS, RocmSmiBackend, RocmSmiParseError, parse_rocm_smi_json
from exporter.core.options import BackendOptions
from exporter.core.readings import Collection
from tests.harness.poll import wait_until

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rocm-smi"
MHZ = 1e6

# card -> name, bus, (edge, junction, memory) C, power W, power cap W, VRAM total, VRAM used,
#         (gfx %, memory busy %), (sclk, mclk, socclk) MHz, (PCIe gen, width)
MI100 = "Arcturus GL-XL [Instinct MI100]"
NAVI22 = "Navi 22 [Radeon RX 6700/6700 XT / 6800M]"
EXPECTED: dict[str, dict[str, Any]] = {
    "mi100_rocm571.json": {
        "driver": "6.2.4",
        "cards": [
            (MI100, "0000:1e:00.0", (31, 34, 30), 39, 290, 34342961152, 6782976, (0, 0), (300, 1200, 1000), (3, 16)),
            (MI100, "0000:22:00.0", (30, 33, 38), 37, 290, 34342961152, 6782976, (0, 0), (300, 1200, 1000), (3, 16)),
            (MI100, "0000:3f:00.0", (31, 34, 31), 35, 290, 34342961152, 6782976, (0, 0), (300, 1200, 1000), (3, 16)),
            (MI100, "0000:43:00.0", (33, 35, 36), 39, 290, 34342961152, 6782976, (0, 0), (300, 1200, 1000), (3, 16)),
            (MI100, "0000:46:00.0", (32, 34, 38), 39, 290, 34342961152, 6782976, (0, 0), (300, 1200, 1000), (3, 16)),
            (MI100, "0000:49:00.0", (33, 35, 38), 40, 290, 34342961152, 6782976, (0, 0), (300, 1200, 1000), (3, 16)),
        ],
    },
    "mi100_rocm602.json": {
        "driver": "6.3.6",
        "cards": [
            (MI100, "0000:83:00.0", (53, 55, 53), 36, 290, 34342961152, 6750208, (0, 0), (300, 1200, 1000), (4, 16)),
            (MI100, "0000:a3:00.0", (55, 58, 54), 44, 290, 34342961152, 6750208, (0, 0), (300, 1200, 1000), (4, 16)),
            (MI100, "0000:c3:00.0", (54, 57, 55), 43, 290, 34342961152, 6750208, (0, 0), (300, 1200, 1000), (4, 16)),
            (MI100, "0000:e3:00.0", (51, 53, 50), 39, 290, 34342961152, 6750208, (0, 0), (300, 1200, 1000), (4, 16)),
        ],
    },
    "rx6700xt_rocm571.json": {
        "driver": "6.3.6",
        "cards": [(NAVI22, "0000:07:00.0", (45, 47, 46), 6, 211, 12868124672, 1564491776, (0, 0), (500, 96, 685),
                   (4, 16))],
    },
    "rx6700xt_rocm602.json": {  # power is "N/A (Secondary die)": absent
        "driver": "6.3.6",
        "cards": [(NAVI22, "0000:07:00.0", (45, 47, 46), None, 211, 12868124672, 1572757504, (0, 0),
                   (500, 96, 685), (4, 16))],
    },
    "rx6700xt_rocm612.json": {  # "GPU Memory Allocated (VRAM%)": 12 is allocation, activity is 0
        "driver": "6.3.6",
        "cards": [(NAVI22, "0000:07:00.0", (45, 47, 46), 6, 211, 12868124672, 1572745216, (0, 0), (0, 96, 685),
                   (4, 16))],
    },
    "vega-10-XT.json": {  # no product name, no memory-use key, a fan at 13 %
        "driver": "5.9.25",
        "cards": [(None, "0000:04:00.0", (39, 40, 92), 15, 170, 17163091968, 17776640, (0, None), (1269, 167, 960),
                   (3, 16))],
    },
}

# UUIDs from "Unique ID" + "Device ID"/"GPU ID", by amd-smi's layout (worked by hand for mi100 card0:
# serial 0x79ccd55167a2124a: byte 7 = 79, fcn ff, device 738c, byte 6 = cc, bytes 5-0 = d55167a2124a).
EXPECTED_UUIDS = {
    "mi100_rocm602.json": ["79ff738c-0000-1000-80cc-d55167a2124a", "04ff738c-0000-1000-80ed-fb117a17a07d",
                           "d4ff738c-0000-1000-80a9-ec48d03d261d", "1bff738c-0000-1000-809d-d972253c3736"],
    "vega-10-XT.json": ["02ff6861-0000-1000-8015-0e7d042a1124"],
    # no Unique ID and serial "0" (placeholder): the PCI bus ID is the stable identity
    "mi100_rocm571.json": [f"amd-pci-{c[1]}" for c in EXPECTED["mi100_rocm571.json"]["cards"]],
    "rx6700xt_rocm612.json": ["amd-pci-0000:07:00.0"],
}


def test_every_fixture_has_expected_values() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_output_parses_to_expected(name: str) -> None:
    readings = parse_rocm_smi_json((FIXTURES / name).read_text())
    expected = EXPECTED[name]
    cards = expected["cards"]
    assert [r.index for r in readings] == list(range(len(cards)))
    for r, card in zip(readings, cards, strict=True):
        gpu_name, bus, (edge, junction, memory), power, cap, total, used, (use, mem_use), clocks, (gen, width) = card
        assert r.vendor == "amd"
        assert r.name == gpu_name
        assert r.pci_bus_id == bus
        assert r.driver_version == expected["driver"]
        assert r.temperature_celsius == {"gpu": edge, "junction": junction, "memory": memory}
        assert r.power_watts == power
        assert r.power_limit_watts == cap
        assert r.memory_total_bytes == total
        assert r.memory_used_bytes == used
        assert r.memory_free_bytes == total - used
        assert r.utilization_ratio == use
        assert r.memory_utilization_ratio == mem_use
        assert r.clock_hertz == {"graphics": clocks[0] * MHZ, "memory": clocks[1] * MHZ, "soc": clocks[2] * MHZ}
        assert (r.pcie_link_generation, r.pcie_link_width) == (gen, width)
        assert r.pcie_replay_total == 0
        assert r.up
    assert len({r.uuid for r in readings}) == len(readings)
    if name in EXPECTED_UUIDS:
        assert [r.uuid for r in readings] == EXPECTED_UUIDS[name]


def test_vega_fan_and_firmware() -> None:
    (r,) = parse_rocm_smi_json((FIXTURES / "vega-10-XT.json").read_text())
    assert r.fan_speed_ratio == pytest.approx(0.13)
    assert r.firmware_version == "113-D0510100-106"
    assert r.serial is None  # "N/A"


def test_placeholder_serial_zero_is_absent() -> None:
    readings = parse_rocm_smi_json((FIXTURES / "mi100_rocm571.json").read_text())
    assert all(r.serial is None for r in readings)


def test_amd_uuid_needs_a_nonzero_serial() -> None:
    assert amd_uuid(0x79CCD55167A2124A, 0x738C) == "79ff738c-0000-1000-80cc-d55167a2124a"
    assert amd_uuid(0, 0x738C) is None


def _card(**values: str) -> dict[str, str]:
    return values


def test_key_variants_of_newer_rocm() -> None:
    """MI300/6.x keys: socket power, Read/Write activity beside VRAM%, "Card Series", partitions."""
    doc = {
        "card1": _card(**{
            "Device ID": "0x74a1", "Unique ID": "0x9d205b1f1f2b6ac6", "Card Series": "AMD Instinct MI300X OAM",
            "Serial Number": "692351000123", "PCI Bus": "0000:0C:00.0", "VBIOS version": "113-M3000100-102",
            "Temperature (Sensor edge) (C)": "N/A", "Temperature (Sensor junction) (C)": "61.0",
            "Temperature (Sensor memory) (C)": "52.0", "Temperature (Sensor HBM 0) (C)": "50.0",
            "Current Socket Graphics Package Power (W)": "612.5", "Max Graphics Package Power (W)": "750.0",
            "Average Graphics Package Power (W)": "N/A",
            "GPU use (%)": "87", "GPU Memory Allocated (VRAM%)": "31", "GPU Memory Read/Write Activity (%)": "42",
            "VRAM Total Memory (B)": "206158430208", "VRAM Total Used Memory (B)": "64424509440",
            "Energy counter": "65628", "Accumulated Energy (uJ)": "1004108.41",
            "sclk clock speed:": "(2087Mhz)", "mclk clock speed:": "(1300Mhz)", "socclk clock speed:": "(1143Mhz)",
            "vclk0 clock speed:": "(29Mhz)", "pcie clock level": "0 (32.0GT/s x16)", "0": "2.5GT/s x1",
            "PCIe Replay Count": "3", "Fan speed (%)": "N/A", "Compute Partition": "CPX",
            "Memory Partition": "NPS4",
        }),
        "card0": _card(**{
            "GPU ID": "0x74a1", "Unique ID": "N/A", "Card series": "(Secondary die)", "Device Name": "MI300X",
            "Serial Number": "N/A", "PCI Bus": "0000:8a:00.0",
            "Average Graphics Package Power (W)": "N/A (Secondary die)", "GPU memory use (%)": "5",
            "Compute Partition": "SPX",
        }),
        "system": {"Driver version": "6.8.5", "PID4242": "python3, 1, 34359738368, 0, 0"},
    }
    readings = parse_rocm_smi_json(json.dumps(doc))
    assert [r.index for r in readings] == [0, 1]
    r0, r1 = readings
    assert r0.name == "MI300X" and r0.power_watts is None and r0.memory_utilization_ratio == 0.05
    assert r0.uuid == "amd-pci-0000:8a:00.0" and r0.mig_mode_enabled == 0.0
    assert r1.uuid == "9dff74a1-0000-1000-8020-5b1f1f2b6ac6"
    assert r1.name == "AMD Instinct MI300X OAM"
    assert r1.serial == "692351000123" and r1.driver_version == "6.8.5"
    assert r1.temperature_celsius == {"junction": 61.0, "memory": 52.0}
    assert r1.power_watts == 612.5 and r1.power_limit_watts == 750.0
    assert r1.utilization_ratio == 0.87
    assert r1.memory_utilization_ratio == 0.42  # activity, not the 31 % allocation
    assert r1.energy_joules == pytest.approx(1.00410841)
    assert r1.clock_hertz == {"graphics": 2087 * MHZ, "memory": 1300 * MHZ, "soc": 1143 * MHZ, "video": 29 * MHZ}
    assert (r1.pcie_link_generation, r1.pcie_link_width, r1.pcie_replay_total) == (5, 16, 3)
    assert r1.fan_speed_ratio is None
    assert r1.mig_mode_enabled == 1.0


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty output"),
    ("Traceback (most recent call last):\n  oops", "no JSON object"),
    ('{"card0": {"GPU ID": "0x738c", "Temperature', "invalid JSON at line 1"),
    ('{"card0": {}} trailing', "unexpected text after the JSON object"),
    ('["card0"]', "not an object"),
])
def test_bad_output_is_a_parse_error(text: str, message: str) -> None:
    with pytest.raises(RocmSmiParseError, match=message):
        parse_rocm_smi_json(text)


def test_warning_line_before_json_is_tolerated() -> None:
    text = "WARNING: AMD GPU device(s) is/are in a low-power state. Check power control/runtime_status\n\n"
    readings = parse_rocm_smi_json(text + (FIXTURES / "vega-10-XT.json").read_text())
    assert [r.pci_bus_id for r in readings] == ["0000:04:00.0"]


# ---- a fake rocm-smi on PATH --------------------------------------------------------------------


class FakeRocmSmi:
    """``rocm-smi`` in a temp dir on PATH; each run appends its arguments to ``calls``."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.bin.mkdir(parents=True)
        self.calls = root / "calls.log"
        self.calls.touch()
        self.path = self.bin / "rocm-smi"

    def script(self, body: str) -> None:
        tmp = self.bin / "rocm-smi.tmp"
        tmp.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{self.calls}"\n{body}\n')
        tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR)
        os.replace(tmp, self.path)

    def prints(self, fixture: str, exit_code: int = 0) -> None:
        self.script(f'cat "{FIXTURES / fixture}"\nexit {exit_code}')

    def runs(self) -> list[str]:
        return self.calls.read_text().splitlines()


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRocmSmi:
    f = FakeRocmSmi(tmp_path)
    monkeypatch.setenv("PATH", f"{f.bin}{os.pathsep}{os.environ.get('PATH', '')}")
    return f


def _ready(fake: FakeRocmSmi, timeout: float = 5.0) -> RocmSmiBackend:
    fake.prints("mi100_rocm602.json")
    backend = create("rocm-smi", BackendOptions(backend_settings={"command_timeout": timeout}))
    assert isinstance(backend, RocmSmiBackend)
    backend.init()
    first = Collection("rocm-smi")
    backend.collect(first)  # served from init's run
    assert len(first.gpus) == 4
    return backend


def test_registered_for_auto_after_amdsmi() -> None:
    reg = registry()
    assert reg["rocm-smi"] is RocmSmiBackend
    assert (reg["amdsmi"].auto_priority or 0) < (RocmSmiBackend.auto_priority or 0)
    assert RocmSmiBackend.min_interval == 10.0


def test_one_run_per_collection_for_all_gpus(fake: FakeRocmSmi) -> None:
    backend = _ready(fake)
    assert len(fake.runs()) == 1  # init's run also served the first collection
    out = Collection("rocm-smi")
    backend.collect(out)
    runs = fake.runs()
    assert len(runs) == 2
    assert runs[-1] == " ".join(ROCM_SMI_ARGS)  # every GPU at once: no -d/--device
    assert [r.uuid for r in out.gpus][:1] == ["79ff738c-0000-1000-80cc-d55167a2124a"]
    assert out.gpus[3].temperature_celsius["gpu"] == 51.0


def test_nonzero_exit_with_complete_json_is_used(fake: FakeRocmSmi) -> None:
    # rocm-smi exits with the status of its last failed call (2: a field is unsupported)
    backend = _ready(fake)
    fake.prints("vega-10-XT.json", exit_code=2)
    out = Collection("rocm-smi")
    backend.collect(out)
    assert [r.pci_bus_id for r in out.gpus] == ["0000:04:00.0"]


def _pid_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # a zombie waiting for its reaper is dead too


def test_hung_rocm_smi_is_killed_at_the_timeout(fake: FakeRocmSmi, tmp_path: Path) -> None:
    timeout = 0.5
    backend = _ready(fake, timeout=timeout)
    child = tmp_path / "child.pid"
    fake.script(f'sleep 60 &\necho $! > "{child}"\nwait')
    t0 = time.monotonic()
    with pytest.raises(BackendError) as err:
        backend.collect(Collection("rocm-smi"))
    elapsed = time.monotonic() - t0
    assert err.value.kind == "stalled"  # reported like a hung in-process call about no GPU (issue 35)
    assert str(err.value) == "rocm-smi did not answer within 0.5 s and was killed"
    assert timeout <= elapsed < timeout + 3.0
    pid = int(wait_until(lambda: child.read_text().strip() if child.exists() else None, what="child pid"))
    wait_until(lambda: _pid_gone(pid), timeout=5.0, what=f"sleep {pid} killed with its process group")


def test_failing_rocm_smi_fails_the_collection(fake: FakeRocmSmi) -> None:
    backend = _ready(fake)
    fake.script('echo "ERROR:root:Driver not initialized (amdgpu not found in modules)" >&2\necho "more" >&2\nexit 3')
    with pytest.raises(BackendError) as err:
        backend.collect(Collection("rocm-smi"))
    assert err.value.kind == "driver"
    assert str(err.value) == ("rocm-smi exited with code 3: "
                              "ERROR:root:Driver not initialized (amdgpu not found in modules)")


def test_traceback_reports_its_last_line(fake: FakeRocmSmi) -> None:
    backend = _ready(fake)
    fake.script('printf "Traceback (most recent call last):\\n  File x\\nKeyError: 0\\n" >&2\nexit 1')
    with pytest.raises(BackendError, match=r"^rocm-smi exited with code 1: KeyError: 0$"):
        backend.collect(Collection("rocm-smi"))


def test_garbage_output_fails_the_collection(fake: FakeRocmSmi) -> None:
    backend = _ready(fake)
    fake.script('echo "GPU[0] : Temperature: 31.0c"')
    with pytest.raises(BackendError) as err:
        backend.collect(Collection("rocm-smi"))
    assert err.value.kind == "bad_value"
    assert str(err.value).startswith("rocm-smi output unusable: no JSON object in the output")


def test_partial_json_fails_the_collection(fake: FakeRocmSmi) -> None:
    backend = _ready(fake)
    fake.script(f'head -c 700 "{FIXTURES / "mi100_rocm602.json"}"')
    with pytest.raises(BackendError) as err:
        backend.collect(Collection("rocm-smi"))
    assert err.value.kind == "bad_value"
    assert "invalid JSON at line" in str(err.value)
    # the next good run recovers without a new init
    fake.prints("rx6700xt_rocm612.json")
    out = Collection("rocm-smi")
    backend.collect(out)
    assert [r.name for r in out.gpus] == [NAVI22]


def test_missing_binary_is_unavailable(tmp_path: Path) -> None:
    backend = RocmSmiBackend(BackendOptions(), binary=str(tmp_path / "nowhere" / "rocm-smi"))
    with pytest.raises(BackendUnavailable, match=r"^rocm-smi not available: not found in .*nowhere/rocm-smi$"):
        backend.init()


def test_no_gpu_is_unavailable(fake: FakeRocmSmi) -> None:
    fake.script("""echo '{"system": {"Driver version": "6.3.6"}}'""")
    with pytest.raises(BackendUnavailable, match=r"^rocm-smi not available: it reports no AMD GPU$"):
        RocmSmiBackend(BackendOptions()).init()


def test_explicit_path_wins_over_path(fake: FakeRocmSmi, tmp_path: Path) -> None:
    fake.prints("mi100_rocm602.json")
    other = FakeRocmSmi(tmp_path / "other")
    other.prints("vega-10-XT.json")
    backend = RocmSmiBackend(BackendOptions(), binary=str(other.path))
    backend.init()
    out = Collection("rocm-smi")
    backend.collect(out)
    assert [r.pci_bus_id for r in out.gpus] == ["0000:04:00.0"]
    assert fake.runs() == [] and len(other.runs()) == 1


# ---- strings no vendor should send ----------------------------------------------------------------

# Card names as rocm-smi's own json.dumps writes them (ensure_ascii): an undecodable byte of a
# sysfs or PCI-ids name arrives as a lone surrogate escape (issue 26); then other lone
# surrogates, a reversed pair, NUL and other control characters, and a name with every trouble at once.
HOSTILE_NAMES = ["Vega\\udcff 10", "\\ud800", "x\\udfff", "\\udc80\\ud800", "A\\u0000B\\u001b[31m",
                 "\\udcff\\\"}\\n# HELP forged\\n\\\\"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_bad_vendor_string_never_fails_a_scrape(name: str, tmp_path: Path) -> None:
    """Every /metrics answer was 500 while /readyz said ready: the exposition could not be encoded."""
    from tests.harness.exporter import ExporterProcess, sample
    from tests.harness.prom import check_metrics

    doc = json.loads((FIXTURES / "vega-10-XT.json").read_text())
    card = next(iter(doc))
    doc[card]["Card series"] = "@NAME@"
    fixture = tmp_path / "card.json"
    fixture.write_text(json.dumps(doc).replace('"@NAME@"', f'"{name}"'))
    assert json.loads(fixture.read_text())[card]["Card series"] == json.loads(f'"{name}"')
    script = tmp_path / "rocm-smi"
    script.write_text(f'#!/bin/sh\ncat "{fixture}"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    with ExporterProcess(["--backend", "rocm-smi", "--rocm-smi-path", str(script)]) as ex:
        for accept in ({}, {"Accept": "application/openmetrics-text; version=1.0.0"}):
            status, body, _ = ex.get("/metrics", accept)
            assert status == 200, body[:300]
            page = body.decode("utf-8")  # strict: valid UTF-8
            assert "\ud800" not in page and not any(0xD800 <= ord(c) <= 0xDFFF for c in page)
            if not accept:
                assert check_metrics(page) == [], check_metrics(page)
                s = ex.scrape()
                info = [dict(ls) for (n, ls), _ in s.items() if n == "gpu_info"]
                assert len(info) == 1 and sample(s, "gpu_up", gpu="0") == 1.0
                want = json.loads(f'"{name}"')
                got = info[0].get("name", "")
                assert len(got) == len(want) and all(
                    g == w if not 0xD800 <= ord(w) <= 0xDFFF else g == "\ufffd" for g, w in zip(got, want, strict=True))
        status, body, _ = ex.get("/api/v1/gpus")
        assert status in (200, 404), body[:300]
        assert "Traceback" not in ex.log()


def test_a_killed_rocm_smi_is_reported_like_a_stalled_in_process_call(fake: FakeRocmSmi) -> None:
    """Issue 35: the CLI's own kill at --command-timeout shows as a stalled backend, the way a hung NVML or
    amdsmi call about no GPU does: the GPUs it knew down and hung with the cause, readiness naming it."""
    from exporter.core.engine import Engine
    from exporter.core.host import host_info
    from exporter.core.options import FieldFilter

    backend = _ready(fake, timeout=0.5)
    engine = Engine([backend], host_info(), FieldFilter(), collection_timeout=5.0, cache_ttl=0.0)
    engine.mark_initialised("rocm-smi")
    try:
        assert len([r for c in engine.scrape().collections for r in c.gpus if r.up]) == 4
        fake.script("sleep 60")
        engine._cached.clear()  # rocm-smi is re-run at most every min_interval: now, for this test
        snap = engine.scrape()
        gpus = [r for c in snap.collections for r in c.gpus]
        assert len(gpus) == 4 and not any(r.up for r in gpus)
        cause = "stalled: rocm-smi did not answer within 0.5 s and was killed"
        assert {(r.up_reason, r.health_state, r.health_cause) for r in gpus} == {(cause, "hung", cause)}
        assert snap.stats["rocm-smi"].errors_total.get("stalled", 0) >= 1
        assert engine.ready(60, wait=False) == (False, "backend rocm-smi: stalled: rocm-smi did not answer "
                                                       "within 0.5 s and was killed")
    finally:
        engine.stop()
