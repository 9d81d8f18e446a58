"""One health state per GPU (exporter/core/gpu_health.py): ok, degraded, failed, hung or lost, with its cause,
from the GPU's answer, its XIDs and ECC rated by exporter/core/xid.py, and the operator's overrides."""

from __future__ import annotations

import pytest

from exporter.core import xid
from exporter.core.gpu_health import XID_HOLD_SECONDS, HealthTracker
from exporter.core.readings import HEALTH_STATES, Collection, GpuReading


def assess(tracker: HealthTracker, r: GpuReading, now: float = 1000.0,
           xids: dict[str, float] | None = None) -> tuple[str, str]:
    coll = Collection("nvml", gpus=[r], xid_counts={(r.index, r.uuid, c): n for c, n in (xids or {}).items()})
    tracker.assess([coll], now)
    return r.health_state, r.health_cause


def gpu(**kw: object) -> GpuReading:
    return GpuReading(index=0, uuid="GPU-0", vendor="nvidia", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "state"), [
    ("gpu_lost", "lost"), ("gpu_hung", "hung"), ("stalled", "hung"), ("gpu_error", "failed"), ("driver", "failed"),
    (None, "failed"),
])
def test_a_gpu_that_does_not_answer_is_lost_hung_or_failed_with_its_cause(kind: str | None, state: str) -> None:
    r = gpu().down(f"{kind}: why", kind)
    assert assess(HealthTracker(), r) == (state, f"{kind}: why")


def test_a_healthy_gpu_is_ok_with_no_cause() -> None:
    assert assess(HealthTracker(), gpu(ecc_errors={("corrected", "aggregate"): 5.0})) == ("ok", "")


def test_xids_by_their_catalogue_severity_and_for_the_hold_only() -> None:
    t = HealthTracker()
    r = gpu()
    assert assess(t, r, 1000.0, {"79": 1}) == ("failed", "xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (fatal)")
    r = gpu()  # the same count later: it holds, then clears
    assert assess(t, r, 1000.0 + XID_HOLD_SECONDS - 1, {"79": 1})[0] == "failed"
    r = gpu()
    assert assess(t, r, 1000.0 + XID_HOLD_SECONDS + 1, {"79": 1}) == ("ok", "")
    t2 = HealthTracker()
    assert assess(t2, gpu(), 10.0, {"13": 2}) == ("degraded", "xid 13 ROBUST_CHANNEL_GR_EXCEPTION / "
                                                              "ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY (warn)")
    assert assess(HealthTracker(), gpu(), 10.0, {"63": 1}) == ("ok", "")  # IGNORE in the catalogue
    assert assess(HealthTracker(), gpu(), 10.0, {"9999": 1}) == ("degraded", "xid 9999 (warn)")  # unknown code


def test_the_worst_event_wins_and_a_rise_restarts_the_hold() -> None:
    t = HealthTracker()
    assert assess(t, gpu(), 0.0, {"13": 1, "48": 1})[0] == "failed"
    assert assess(t, gpu(), XID_HOLD_SECONDS + 5, {"13": 2, "48": 1}) == (
        "degraded", "xid 13 ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY (warn)")


def test_operator_overrides_change_the_state() -> None:
    over = xid.load_overrides({79: "ignore", "13": "fatal", "ecc_corrected": "warn"})
    t = HealthTracker(over)
    assert assess(t, gpu(), 0.0, {"79": 1}) == ("ok", "")
    assert assess(t, gpu(), 0.0, {"79": 1, "13": 1})[0] == "failed"
    r = gpu(ecc_errors={("corrected", "volatile"): 3.0})
    assert assess(HealthTracker(over), r) == ("degraded", "ecc_corrected (warn)")


def test_ecc_remap_and_recovery_levels_nvidia_and_amd_alike() -> None:
    assert assess(HealthTracker(), gpu(ecc_errors={("uncorrected", "volatile"): 2.0})) == (
        "failed", "ecc_uncorrected (fatal)")
    amd = GpuReading(index=1, uuid="amd-1", vendor="amd", ecc_errors={("uncorrected", "volatile"): 1.0})
    assert assess(HealthTracker(), amd) == ("failed", "ecc_uncorrected (fatal)")
    assert assess(HealthTracker(), gpu(ecc_errors={("corrected", "volatile"): 9.0})) == ("ok", "")
    assert assess(HealthTracker(), gpu(remapped_rows_failed=1.0)) == ("failed", "page_retirement_failed (fatal)")
    assert assess(HealthTracker(), gpu(remapped_rows_pending=1.0)) == ("ok", "")
    assert assess(HealthTracker(), gpu(recovery_action=1.0)) == ("failed", "the driver asks for a GPU reset")
    assert assess(HealthTracker(), gpu(recovery_action=3.0)) == (
        "degraded", "the driver asks to drain peer-to-peer traffic")
    assert assess(HealthTracker(), gpu(recovery_action=0.0)) == ("ok", "")


def test_the_family_is_one_series_per_state_with_the_cause() -> None:
    r = gpu().down("hung: nvmlDeviceGetPowerUsage did not return within 1 s", "gpu_hung")
    assess(HealthTracker(), r)
    cause = "hung: nvmlDeviceGetPowerUsage did not return within 1 s"
    assert r.health == {(s, cause): (1.0 if s == "hung" else 0.0) for s in HEALTH_STATES}
    assert HEALTH_STATES == ("ok", "degraded", "failed", "hung", "lost")
