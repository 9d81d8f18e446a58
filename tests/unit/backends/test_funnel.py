"""The one vendor-call policy of ``exporter/backends/base.py``, for every kind of exception.

A minimal backend whose "vendor" raises whatever a test asks: the policy itself is under test
here (the real libraries exercise it in test_nvml*.py, test_amdsmi*.py, test_nvml_generations.py).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from pathlib import Path
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
from exporter.core.options import BackendOptions, BackendSetting
from exporter.core.readings import Collection


class VendorError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"vendor code {code}")
        self.code = code


class Toy(Backend):
    """Vendor codes: 1 unsupported, 2 transient, 3 device fault, 4 driver gone, 6 GPU lost, 7 init failed."""

    name: ClassVar[str] = "toy"

    def init(self) -> None:
        pass

    def collect(self, out: Collection) -> None:
        pass

    def classify(self, exc: BaseException) -> Verdict:
        if isinstance(exc, VendorError):
            outcome, kind = {1: (Outcome.UNSUPPORTED, "unsupported"), 2: (Outcome.ERROR, "reading_error"),
                             3: (Outcome.DOWN, "gpu_error"), 4: (Outcome.DRIVER, "driver"),
                             6: (Outcome.DOWN, "gpu_lost"), 7: (Outcome.DRIVER, "init_failed")}[exc.code]
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


# --- what the operator sees: one log line per GPU, reading and kind; errors that name the call --------


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "exporter.backends.base"]


def test_the_log_lines_name_backend_gpu_reading_call_and_cause(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="exporter.backends")
    b = Toy()
    dev = Device(3)
    for _ in range(2):
        dev.begin()
        b.call(dev, "gpu_fan_speed_ratio", raising(VendorError(1)))
        b.call(dev, "gpu_clock_hertz:sm", raising(VendorError(2)))
        b.call(dev, "gpu_ecc_mode_enabled", raising(VendorError(1)))
        b.call(dev, "gpu_power_watts", raising(ValueError("garbage")))
        b.call(dev, "gpu_energy_joules_total", raising(NoValue("no value (sentinel 0xffffffff)")))
        b.call(None, "gpu_topology_level", raising(VendorError(2)))
    assert lines(caplog) == [
        (logging.INFO, "toy: GPU 3: gpu_fan_speed_ratio not available (vendorCall: vendor code 1); the series is "
                       "omitted"),
        (logging.INFO, "toy: GPU 3: gpu_clock_hertz:sm failed (vendorCall: vendor code 2); the series is omitted "
                       "while it fails"),
        (logging.INFO, "toy: GPU 3: gpu_ecc_mode_enabled not available (vendorCall: vendor code 1); the series is "
                       "omitted"),
        (logging.WARNING, "toy: GPU 3: gpu_power_watts failed (vendorCall: ValueError: garbage); the series is "
                          "omitted while it fails"),
        (logging.INFO, "toy: GPU 3: gpu_energy_joules_total failed (vendorCall: no value (sentinel 0xffffffff)); "
                       "the series is omitted while it fails"),
        (logging.INFO, "toy: GPU -: gpu_topology_level failed (vendorCall: vendor code 2); the series is omitted "
                       "while it fails"),
    ]
    assert b.drain_errors() == {"unsupported": 2, "reading_error": 4, "bad_value": 2, "no_value": 2}
    assert dev.unsupported == {"gpu_fan_speed_ratio", "gpu_ecc_mode_enabled"}
    # another GPU, or another kind of failure of the same reading, is a new line
    b.call(Device(4), "gpu_clock_hertz:sm", raising(VendorError(2)))
    b.call(dev, "gpu_clock_hertz:sm", raising(ValueError("x")))
    assert [m for _, m in lines(caplog)[6:]] == [
        "toy: GPU 4: gpu_clock_hertz:sm failed (vendorCall: vendor code 2); the series is omitted while it fails",
        "toy: GPU 3: gpu_clock_hertz:sm failed (vendorCall: ValueError: x); the series is omitted while it fails"]


def test_a_call_without_a_name_is_named_by_its_reading(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.backends")

    class Callable_:
        def __call__(self) -> float:
            raise VendorError(2)

    Toy().call(Device(0), "gpu_power_watts", Callable_())
    assert lines(caplog) == [(logging.INFO, "toy: GPU 0: gpu_power_watts failed (gpu_power_watts: vendor code 2); "
                                            "the series is omitted while it fails")]


def test_fatal_outcomes_raise_with_the_call_and_the_cause() -> None:
    b = Toy()
    with pytest.raises(GpuDown) as down:
        b.call(Device(0), "gpu_power_watts", raising(VendorError(3)))
    assert (str(down.value), down.value.kind) == ("vendorCall: vendor code 3", "gpu_error")
    with pytest.raises(BackendError) as gone:
        b.call(Device(0), "gpu_power_watts", raising(VendorError(4)))
    assert (str(gone.value), gone.value.kind) == ("toy: vendorCall failed: vendor code 4", "driver")
    # a device fault outside any GPU (a system-level call) fails the collection instead
    with pytest.raises(BackendError) as sys_down:
        b.call(None, "gpu_topology_level", raising(VendorError(3)))
    assert (str(sys_down.value), sys_down.value.kind) == ("toy: vendorCall failed: vendor code 3", "gpu_error")
    # the verdict's kind is the one counted, whatever the outcome's usual kind
    with pytest.raises(GpuDown) as lost:
        b.call(Device(0), "gpu_power_watts", raising(VendorError(6)))
    assert lost.value.kind == "gpu_lost"
    with pytest.raises(BackendError) as init:
        b.call(Device(0), "gpu_power_watts", raising(VendorError(7)))
    assert init.value.kind == "init_failed"
    assert BackendError("x").kind == "driver" and str(BackendError("x")) == "x"
    assert GpuDown("y").kind == "gpu_error" and str(GpuDown("y")) == "y"
    assert b.drain_errors() == {}  # fatal outcomes are counted by the engine, not here


def test_down_after_three_names_the_first_error_and_counts_answers() -> None:
    b = Toy()
    dev = Device(0)
    dev.begin()
    assert b.call(dev, "a", raising(VendorError(2))) is MISSING
    assert (dev.failed, dev.first_error) == (1, "vendorCall: vendor code 2")
    b.call(dev, "b", raising(RuntimeError("other")))  # not a vendor status: not counted towards down
    assert dev.failed == 1
    assert b.call(dev, "b", raising(VendorError(2))) is MISSING
    with pytest.raises(GpuDown) as down:
        b.call(dev, "c", raising(VendorError(2)))
    assert (str(down.value), down.value.kind) == ("no answer, 3 errors, first: vendorCall: vendor code 2",
                                                  "gpu_error")
    dev.begin()  # a new collection starts from zero
    assert (dev.answered, dev.failed, dev.first_error) == (0, 0, "")
    assert b.call(dev, "a", lambda: 1.0) == 1.0 and dev.answered == 1
    assert b.call(dev, "b", lambda: 2.0) == 2.0 and dev.answered == 2
    assert b.call(None, "c", lambda: 3.0) == 3.0 and dev.answered == 2
    assert b.probe(dev, "d", (("only", lambda: 4.0),)) == 4.0 and dev.answered == 3
    assert b.probe(dev, "d", (("only", lambda: 4.0),)) == 4.0 and dev.answered == 4  # remembered: a call


def test_a_classifier_that_raises_cannot_break_the_funnel(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.backends")

    class Broken(Toy):
        def classify(self, exc: BaseException) -> Verdict:
            raise KeyError("bug")

    b = Broken()
    assert b.call(Device(1), "gpu_power_watts", raising(VendorError(2))) is MISSING
    assert b.drain_errors() == {"bad_value": 1}
    assert lines(caplog) == [(logging.WARNING, "toy: GPU 1: gpu_power_watts failed (vendorCall: VendorError "
                                               "(KeyError)); the series is omitted while it fails")]


def test_the_base_classifier(caplog: pytest.LogCaptureFixture) -> None:
    b = Toy()
    assert Backend.classify(b, NoValue("no value (x)")) == Verdict(Outcome.ERROR, "no_value", "no value (x)")
    assert Backend.classify(b, AttributeError("no nvmlFoo")) == Verdict(Outcome.UNSUPPORTED, "unsupported",
                                                                        "AttributeError: no nvmlFoo")
    assert Backend.classify(b, NotImplementedError("later")) == Verdict(Outcome.UNSUPPORTED, "unsupported",
                                                                        "NotImplementedError: later")
    long = Backend.classify(b, ValueError("x" * 1000))
    assert long.outcome is Outcome.ERROR and long.kind == "bad_value"
    assert long.detail == ("ValueError: " + "x" * 1000)[:300]


def test_probe_logs_each_fallback_once_and_converts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="exporter.backends")
    b = Toy()
    dev = Device(2)
    cands = (("v3", raising(VendorError(1))), ("v2", raising(VendorError(1))), ("v1", lambda x: x * 2))
    for _ in range(2):
        assert b.probe(dev, "procs", cands, 21, convert=lambda v: v + 1) == 43
    assert dev.versions == {"procs": 2}
    assert lines(caplog) == [
        (logging.INFO, "toy: GPU 2: v3 unavailable (vendor code 1); trying v2"),
        (logging.INFO, "toy: GPU 2: v2 unavailable (vendor code 1); trying v1")]
    assert b.drain_errors() == {}  # falling back is not an error

    # every candidate unsupported: the reading is unsupported (and never asked again)
    dev2 = Device(5)
    gone = (("v2", raising(VendorError(1))), ("v1", raising(VendorError(1))))
    assert b.probe(dev2, "procs", gone) is MISSING
    assert dev2.unsupported == {"procs"} and b.drain_errors() == {"unsupported": 1}
    assert b.probe(dev2, "procs", cands, 1) is MISSING

    # a candidate that fails otherwise is not skipped: the reading fails this time, on that call
    dev3 = Device(6)
    flaky = (("v2", raising(VendorError(2))), ("v1", lambda: 1.0))
    assert b.probe(dev3, "procs", flaky) is MISSING
    assert dev3.versions == {} and not dev3.unsupported and dev3.failed == 1
    assert "toy: GPU 6: procs failed (v2: vendor code 2)" in lines(caplog)[-1][1]
    # a conversion error in a probe is a bad value of that reading
    assert b.probe(Device(7), "x", (("v1", lambda: "junk"),), convert=float) is MISSING
    assert b.drain_errors() == {"reading_error": 1, "bad_value": 1}
    # a remembered version still goes through the funnel, with its conversion
    assert b.probe(dev, "procs", cands, 1, convert=lambda v: v * 10) == 20
    # ... and its failures count against that reading: unsupported now, never asked again
    gone_later = (("v3", raising(VendorError(1))), ("v2", raising(VendorError(1))), ("v1", raising(VendorError(1))))
    assert b.probe(dev, "procs", gone_later) is MISSING
    assert "procs" in dev.unsupported and b.probe(dev, "procs", cands, 1) is MISSING


def test_si_edge_cases() -> None:
    assert si(7) == 7.0 and type(si(7)) is float
    assert si("12.5") == 12.5 and si(" 3 ") == 3.0
    assert si(2.5, 2.0) == 5.0 and si(3, 1.5) == 4.5 and si(10, 0.5) == 5.0
    assert si(1, 1e-9) == 1e-9 and si(5, 1e-6) == 5e-6 and si(5, 0.0) == 0.0
    for bad in (True, False):
        with pytest.raises(TypeError, match="expected a number, got"):
            si(bad)
    with pytest.raises(NoValue, match=r"no value \('n/a'\)"):
        si("n/a")
    with pytest.raises(NoValue, match=r"no value \(sentinel 0xffffffff\)"):
        si(0xFFFFFFFF)
    with pytest.raises(NoValue, match=r"no value \(nan\)"):
        si("nan")
    with pytest.raises(ValueError):
        si("12 W")
    with pytest.raises(NoValue):
        si(0xFFFF, sentinels=frozenset({0xFFFF}))
    assert si(0xFFFF_FFFF, sentinels=frozenset({0xFFFF})) == float(0xFFFF_FFFF)


def test_backend_defaults() -> None:
    b = Toy()
    assert b.options.fields.enabled("gpu_power_watts") and b.enabled("gpu_power_watts")
    assert b.any_enabled("gpu_power_watts", "no_such_family")



class Tunable(Toy):
    settings: ClassVar[tuple[BackendSetting, ...]] = (
        BackendSetting("toy_path", "--toy-path", "TOY_PATH", "path", "the toy binary (default: searched)"),
        BackendSetting("toy_timeout", "--toy-timeout", None, "seconds", "toy timeout (default 5)", default=5.0),
    )


def test_a_backend_reads_its_own_settings_given_or_default() -> None:
    """``Backend.setting``: the value serve parsed (flag, env or file), else the declared default;
    a name the backend never declared is a programming error naming both."""
    given = Tunable(BackendOptions(backend_settings={"toy_timeout": 0.5, "toy_path": "/opt/toy"}))
    assert given.setting("toy_timeout") == 0.5 and given.setting("toy_path") == "/opt/toy"
    unset = Tunable(BackendOptions(backend_settings={"other_backends_key": 9}))
    assert unset.setting("toy_timeout") == 5.0 and unset.setting("toy_path") is None
    with pytest.raises(KeyError) as err:
        given.setting("other_backends_key")  # another backend's value is not this backend's setting
    assert err.value.args[0] == "backend 'toy' declares no setting 'other_backends_key'"


# --- suspect statuses (NVML UNKNOWN): the GPU's identity calls decide -------------------------------


class Suspicious(Toy):
    """Vendor code 9 is suspect; ``identity`` is what the identity calls do (None: they answer)."""

    def __init__(self, identity: BaseException | None) -> None:
        super().__init__()
        self.identity = identity
        self.checks: list[tuple[int, str]] = []

    def classify(self, exc: BaseException) -> Verdict:
        if isinstance(exc, VendorError) and exc.code == 9:
            return Verdict(Outcome.SUSPECT, "reading_error", "vendor code 9")
        return super().classify(exc)

    def identity_fault(self, dev: Device, where: str) -> Verdict | None:
        self.checks.append((dev.index, where))
        if self.identity is None:
            return None
        return self.classify(self.identity)


def test_a_suspect_status_with_a_healthy_identity_is_a_reading_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.backends")
    b = Suspicious(None)
    dev = Device(2)
    dev.begin()
    for reading in ("a", "b", "c", "d"):  # never "down after three": the identity answered
        assert b.call(dev, reading, raising(VendorError(9))) is MISSING
    assert b.checks == [(2, "vendorCall")], "the identity is checked once per GPU and collection"
    assert dev.answered == 1 and dev.failed == 4
    assert b.drain_errors() == {"reading_error": 4}
    assert lines(caplog)[0] == (logging.INFO, "toy: GPU 2: a failed (vendorCall: vendor code 9); the series is "
                                              "omitted while it fails")
    dev.begin()
    assert (dev.identity_checked, dev.identity_fault) == (False, None)
    b.call(dev, "a", raising(VendorError(9)))
    assert b.checks == [(2, "vendorCall"), (2, "vendorCall")], "checked again in the next collection"


@pytest.mark.parametrize(("identity", "raised", "kind", "message"), [
    (VendorError(3), GpuDown, "gpu_error",
     "vendorCall: vendor code 9, and the identity call failed too: vendor code 3"),
    (VendorError(2), GpuDown, "reading_error",
     "vendorCall: vendor code 9, and the identity call failed too: vendor code 2"),
    (VendorError(4), BackendError, "driver", "toy: vendorCall failed: vendor code 4"),
    (KeyError("bug"), GpuDown, "reading_error",  # not a vendor status: the suspect call's own kind
     "vendorCall: vendor code 9, and the identity call failed too: KeyError: 'bug'"),
])
def test_a_suspect_status_with_a_failing_identity_downs_the_gpu(
        identity: BaseException, raised: type[Exception], kind: str, message: str) -> None:
    b = Suspicious(identity)
    dev = Device(1)
    dev.begin()
    with pytest.raises(raised) as exc:
        b.call(dev, "gpu_power_watts", raising(VendorError(9)))
    assert (str(exc.value), exc.value.kind) == (message, kind)  # type: ignore[attr-defined]
    with pytest.raises(raised):  # the verdict is kept for the collection: not asked again
        b.call(dev, "gpu_clock_hertz", raising(VendorError(9)))
    assert len(b.checks) == 1 and dev.answered == 0


def test_an_identity_checker_that_raises_downs_the_gpu() -> None:
    class Buggy(Suspicious):
        def identity_fault(self, dev: Device, where: str) -> Verdict | None:
            raise RuntimeError("checker bug")

    with pytest.raises(GpuDown) as exc:
        Buggy(None).call(Device(0), "x", raising(VendorError(9)))
    assert (str(exc.value), exc.value.kind) == (
        "vendorCall: vendor code 9, and the identity call failed too: identity check: RuntimeError", "gpu_error")


def test_a_suspect_status_outside_a_gpu_or_without_identity_calls_is_down() -> None:
    with pytest.raises(BackendError) as exc:
        Suspicious(None).call(None, "gpu_topology_level", raising(VendorError(9)))
    assert (str(exc.value), exc.value.kind) == ("toy: vendorCall failed: vendor code 9", "reading_error")

    class NoIdentity(Suspicious):
        identity_fault = Backend.identity_fault  # type: ignore[assignment]

    with pytest.raises(GpuDown) as down:
        NoIdentity(None).call(Device(0), "x", raising(VendorError(9)))
    assert (str(down.value), down.value.kind) == (
        "vendorCall: vendor code 9, and the identity call failed too: no identity call to tell a reading fault "
        "from a device fault", "gpu_error")


def test_a_backend_fills_what_it_declares_and_what_every_backend_gets() -> None:
    class Declares(Toy):
        families = frozenset({"gpu_power_watts"})

    assert Declares.fills("gpu_power_watts") and not Declares.fills("gpu_utilization_ratio")
    assert Declares.fills("gpu_info") and Toy.fills("gpu_up")  # identity rows: every backend
    assert not Toy.fills("gpu_power_watts")


def test_a_backend_with_kubernetes_names_fills_the_pod_attribution_families() -> None:
    """The pod attribution (exporter/k8s/) fills gpu_allocation_info and its self-metrics for the GPUs of any
    backend that says what its GPUs are called in Kubernetes: declaring those names is enough (a new vendor
    does not list the attribution's families, docs/extending.md), and a backend without them has none."""
    from exporter.core.k8s_names import DevicePluginResource, KubernetesNames

    class Named(Toy):
        families = frozenset({"gpu_power_watts"})
        kubernetes = KubernetesNames(resources=(DevicePluginResource(r"toy\.example/gpu"),))

    class DraOnly(Toy):
        kubernetes = KubernetesNames(dra_drivers=("gpu.toy.example",))

    for family in ("gpu_allocation_info", "gpu_exporter_pod_attribution_up", "gpu_exporter_dra_attribution_up"):
        assert Named.fills(family) and DraOnly.fills(family), family
        assert not Toy.fills(family), family
    assert Named.fills("gpu_power_watts") and not DraOnly.fills("gpu_power_watts")


def test_a_backend_with_a_pci_vendor_gets_its_gpus_counted_on_the_bus(tmp_path: Path) -> None:
    """gpu_pci_devices beside gpu_visible_devices (the GPUs the driver lost) for any backend that names the
    PCI vendor of its GPUs: the exporter counts them in sysfs after each collection, the backend neither
    counts them nor lists the two families (docs/extending.md); without a PCI vendor there is no count."""
    from exporter.core.engine import Engine
    from exporter.core.options import FieldFilter
    from exporter.core.readings import GpuReading, HostInfo
    from tests.fakes.fakenvml import make_sysfs

    make_sysfs(tmp_path, [("0000:4d:00.0", 0x8086, 0x038000), ("0000:51:00.0", 0x8086, 0x038000),
                          ("0000:00:02.0", 0x8086, 0x060000), ("0000:18:00.0", 0x10DE, 0x030200)])

    class OnTheBus(Toy):
        name = "onthebus"
        pci_vendor = 0x8086
        families = frozenset({"gpu_power_watts"})

        def collect(self, out: Collection) -> None:
            out.gpus.append(GpuReading(index=0, uuid="BUS-0", power_watts=1.0))  # the driver lost the other

    class Unknown(OnTheBus):
        name = "unknown"
        pci_vendor = None

    assert OnTheBus.fills("gpu_pci_devices") and OnTheBus.fills("gpu_visible_devices")
    assert not Unknown.fills("gpu_pci_devices") and not Toy.fills("gpu_visible_devices")
    for cls, expected in ((OnTheBus, (2, 1)), (Unknown, (None, None))):
        engine = Engine([cls(BackendOptions(sysfs_root=str(tmp_path)))], HostInfo(node="n", cpu_model="c", kernel="k"),
                        FieldFilter(), collection_interval=0, collection_timeout=30, cache_ttl=0)
        try:
            (coll,) = engine.scrape().collections
        finally:
            engine.stop()
        assert (coll.pci_devices, coll.visible_devices) == expected, cls.name
