"""The amdsmi floor: the library of each ROCm release (its exported symbol set) under the pinned package.

``tests/fakes/amdsmi_symbols/rocm-*.txt`` list what each release's ``libamd_smi.so`` exports (sources
in that folder's README). The amdsmi Python package binds every library function when it is
imported, so the floor is the package's own release: at or above it the backend serves the core
readings; below it the backend is unavailable with one line that names the missing function.
Each build runs in its own process (the package can load one library per process).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import fakeamdsmi

SYMBOLS = Path(fakeamdsmi.__file__).resolve().parent / "amdsmi_symbols"
RELEASES = sorted(p.stem.removeprefix("rocm-") for p in SYMBOLS.glob("rocm-*.txt"))
FLOOR = ".".join(fakeamdsmi.PINNED_AMDSMI_VERSION.split(".")[:2])  # 7.0.2 -> 7.0
CORE = ("utilization_ratio", "memory_used_bytes", "temperature_celsius", "power_watts", "clock_hertz")

PROBE = """
import json
from exporter.backends import create
from exporter.backends.base import BackendUnavailable
from exporter.core.options import BackendOptions
from exporter.core.readings import Collection
b = create("amdsmi", BackendOptions())
try:
    b.init()
except BackendUnavailable as exc:
    print(json.dumps({"unavailable": str(exc)}))
    raise SystemExit(0)
out = Collection("amdsmi")
b.collect(out)
print(json.dumps({"gpus": [{k: getattr(g, k) for k in %r} | {"up": g.up} for g in out.gpus]}))
"""


def probe(tmp_path: Path, release: str) -> dict[str, object]:
    rocm = fakeamdsmi.built(symbols=fakeamdsmi.release_symbols(release))
    fake = fakeamdsmi.FakeAmdSmi(rocm, tmp_path / "fleet.conf")
    fake.write(fakeamdsmi.two_gpu_fleet())
    env = {k: v for k, v in __import__("os").environ.items() if k != "ROCM_HOME"} | fake.env()
    res = subprocess.run([sys.executable, "-c", PROBE % (CORE,)], env=env, capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[3])
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def test_the_floor_is_a_listed_release() -> None:
    assert FLOOR in RELEASES


@pytest.mark.parametrize("release", [r for r in RELEASES if tuple(map(int, r.split("."))) >= (7, 0)])
def test_at_or_above_the_floor_the_core_readings_are_served(release: str, tmp_path: Path) -> None:
    doc = probe(tmp_path, release)
    gpus = doc["gpus"]
    assert isinstance(gpus, list) and len(gpus) == 2
    for g in gpus:
        assert g["up"] is True
        for key in CORE:
            assert g[key] not in (None, {}), f"rocm {release}: {key} missing"


@pytest.mark.parametrize("release", [r for r in RELEASES if tuple(map(int, r.split("."))) < (7, 0)])
def test_below_the_floor_one_line_names_the_missing_function(release: str, tmp_path: Path) -> None:
    doc = probe(tmp_path, release)
    message = str(doc["unavailable"])
    assert "\n" not in message
    assert "libamd_smi.so lacks amdsmi_" in message and fakeamdsmi.PINNED_AMDSMI_VERSION in message, message
