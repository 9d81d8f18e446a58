"""Fixtures shared by the amdsmi backend tests: the real ``amdsmi`` wrapper over the fake ``libamd_smi.so``.

test_amdsmi_fidelity.py (a fake with no fleet written yet) and test_rocm_smi.py (the fake ``rocm-smi``)
define their own ``fake``, which takes precedence over this one in those modules.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.backends import create
from exporter.backends.amdsmi import AmdSmiBackend
from exporter.core.options import BackendOptions
from tests.fakes.fakeamdsmi import FakeAmdSmi, two_gpu_fleet


@pytest.fixture
def fake(fake_rocm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeAmdSmi:
    """The fake libamd_smi serving :func:`two_gpu_fleet` (ROCm 6.2.1), its environment set for this process."""
    f = FakeAmdSmi(fake_rocm, tmp_path / "fleet.conf")
    f.write(two_gpu_fleet(), rocm_version="6.2.1")
    monkeypatch.delenv("ROCM_HOME", raising=False)  # it would take precedence over ROCM_PATH
    for k, v in f.env().items():
        monkeypatch.setenv(k, v)
    return f


@pytest.fixture
def backend(fake: FakeAmdSmi) -> Iterator[AmdSmiBackend]:
    """An initialised amdsmi backend over ``fake``, with default options; shut down at teardown."""
    b = create("amdsmi", BackendOptions())
    assert isinstance(b, AmdSmiBackend)
    b.init()
    yield b
    b.shutdown()
