"""The one vendor-call policy of ``exporter/backends/base.py``, for every kind of exception.

A minimal backend whose "vendor" raises whatever a test asks: the policy itself is under test
here (the real libraries exercise it in test_nvml*.py, test_amdsmi*.py, test_nvml_generations.py).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from exporter.backends.base import (
    MISSING,
    Backend,
    BackendError,
    Device,
    GpuDown,
    NoValue,
    Outcome,
    Verdict,
    si,
)
from exporter.core.readings import Collection


class VendorError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"vendor code {code}")
        self.code = code


class Toy(Backend):
    """Vendor codes: 1 unsupported, 2 transient, 3 device fault, 4 driver gone."""

    name: ClassVar[str] = "toy"

    def init(self) -> None:
        pass

    def collect(self, out: Collection) -> None:
        pass

    def classify(self, exc: BaseException) -> Verdict:
        if isinstance(exc, VendorError):
            outcome, kind = {1: (Outcome.UNSUPPORTED, "unsupported"), 2: (Outcome.ERROR, "reading_error"),
                             3: (Outcome.DOWN, "gpu_error"), 4: (Outcome.DRIVER, "driver")}[exc.code]
            return Verdict(outcome, kind, str(exc))
        return super().classify(exc)


def raising(exc: BaseException) -> Callable[..., Any]:
    def fn(*args: Any) -> Any:
        raise exc

    fn.__name__ = "vendorCall"
    return fn


class Mismatch(Exception):
    """Like pynvml's NVMLLibraryMismatchError: not a subclass of the vendor's error type."""


@pytest.mark.parametrize(("exc", "kind"), [
    (ValueError("malformed"), "bad_value"),
    (TypeError("bad type"), "bad_value"),
    (ctypes.ArgumentError("argument 2: wrong type"), "bad_value"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "bad_value"),
    (OverflowError("too big"), "bad_value"),
    (Mismatch("unversioned call"), "bad_value"),
    (NoValue("sentinel"), "no_value"),
    (VendorError(2), "reading_error"),
])
def test_any_exception_loses_that_reading_only(exc: BaseException, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    b = Toy()
    dev = Device(0)
    caplog.set_level(logging.INFO, logger="exporter.backends")
    for _ in range(3):
        dev.begin()
        assert b.call(dev, "gpu_power_watts", lambda: 350.0) == 350.0  # before: fine
        assert b.call(dev, "gpu_clock_hertz", raising(exc)) is MISSING
        assert b.call(dev, "gpu_temperature_celsius", lambda: 40.0) == 40.0  # after: fine
    assert b.drain_errors() == {kind: 3}  # counted every time
    logged = [r for r in caplog.records if "gpu_clock_hertz" in r.getMessage()]
    assert len(logged) == 1  # logged once per GPU and reading
    assert "gpu_clock_hertz" not in dev.unsupported  # asked again next time


def test_unsupported_is_remembered_per_device_and_counted_once() -> None:
    b = Toy()
    d0, d1 = Device(0), Device(1)
    calls: list[int] = []

    def fn(i: int) -> float:
        calls.append(i)
        if i == 0:
            raise VendorError(1)
        return 1.0

    for _ in range(3):
        assert b.call(d0, "gpu_fan_speed_ratio", fn, 0) is MISSING
        assert b.call(d1, "gpu_fan_speed_ratio", fn, 1) == 1.0
    assert calls == [0, 1, 1, 1]  # GPU 0 asked once, GPU 1 every time
    assert b.drain_errors() == {"unsupported": 1}
    assert d0.unsupported == {"gpu_fan_speed_ratio"} and not d1.unsupported


def test_attribute_error_means_the_binding_lacks_the_function() -> None:
    b = Toy()
    dev = Device(0)
    assert b.call(dev, "gpu_sm_active", raising(AttributeError("module has no attribute nvmlGpmFoo"))) is MISSING
    assert dev.unsupported == {"gpu_sm_active"}


def test_device_fault_downs_the_gpu_and_driver_loss_fails_the_collection() -> None:
    b = Toy()
    with pytest.raises(GpuDown) as down:
        b.call(Device(0), "gpu_power_watts", raising(VendorError(3)))
    assert down.value.kind == "gpu_error"
    with pytest.raises(BackendError) as gone:
        b.call(Device(0), "gpu_power_watts", raising(VendorError(4)))
    assert gone.value.kind == "driver" and "\n" not in str(gone.value)


def test_a_gpu_answering_only_errors_is_down_after_three() -> None:
    b = Toy()
    dev = Device(0)
    dev.begin()
    assert b.call(dev, "a", raising(VendorError(2))) is MISSING
    assert b.call(dev, "b", raising(VendorError(2))) is MISSING
    with pytest.raises(GpuDown, match="no answer, 3 errors"):
        b.call(dev, "c", raising(VendorError(2)))
    other = Device(1)  # one answer first: errors after it never down the GPU
    other.begin()
    b.call(other, "a", lambda: 1)
    for name in "bcdef":
        assert b.call(other, name, raising(VendorError(2))) is MISSING


def test_probe_remembers_the_version_per_device() -> None:
    b = Toy()
    new_calls: list[int] = []

    def v2(i: int) -> str:
        new_calls.append(i)
        if i == 0:
            raise VendorError(1)  # this GPU (say a MIG instance) lacks v2
        return "v2"

    d0, d1 = Device(0), Device(1)
    for _ in range(3):
        assert b.probe(d0, "mem", (("v2", v2), ("v1", lambda i: "v1")), 0) == "v1"
        assert b.probe(d1, "mem", (("v2", v2), ("v1", lambda i: "v1")), 1) == "v2"
    assert new_calls == [0, 1, 1, 1]  # probed once on GPU 0, then v1 directly
    assert d0.versions == {"mem": 1} and d1.versions == {"mem": 0}


def test_a_conversion_error_is_inside_the_funnel() -> None:
    b = Toy()
    assert b.call(Device(0), "gpu_power_watts", lambda: "garbage", convert=float) is MISSING
    assert b.drain_errors() == {"bad_value": 1}


@pytest.mark.parametrize("value", [0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 0x7FFFFFFFFFFFFFFF, -1, float("nan"), float("inf"),
                                   "N/A", "[N/A]"])
def test_sentinels_are_no_value(value: object) -> None:
    with pytest.raises(NoValue):
        si(value)


def test_si_scales_exactly() -> None:
    assert si(1012345678, 1e-3) == 1012345.678
    assert si(41, 0.01) == 0.41
    assert si(1500, 1e6) == 1.5e9
