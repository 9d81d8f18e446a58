"""One health state per GPU, with its cause: ``gpu_health_state`` on ``/metrics`` (one schema row), the
``health`` field of ``/stats``, ``snapshot`` and the Python API, and what the profiler reads.

The states follow OpenTelemetry's ``hw.status`` (``hw.state``: ok, degraded, failed, needs_cleaning,
predicted_failure) where they fit, and add the two a GPU exporter must tell apart:

- ``lost``: the driver says the GPU is gone (NVML ``GPU_IS_LOST``): ``gpu_up`` 0;
- ``hung``: a vendor call about it has not returned within ``--call-deadline``, or a call about no GPU
  (init, the device count) stalls its backend: ``gpu_up`` 0;
- ``failed``: it cannot be read for another reason (a device fault, the driver gone), or it answers
  but a ``fatal`` event says it needs a reset, a reboot or a person: an XID whose severity is fatal
  within the last :data:`XID_HOLD_SECONDS`, uncorrected ECC errors since the driver loaded, a failed
  row remap, or the driver's own recovery action asking for a reset or a reboot;
- ``degraded``: it answers, and a ``warn`` event holds (an XID rated warn, a recovery action asking to
  drain peer-to-peer traffic);
- ``ok``: none of these.

Severities come from exporter/core/xid.py (NVIDIA's XID catalogue, the RAS/ECC event table and the
operator's ``--xid-severity`` overrides); an event rated ``ignore`` changes nothing. The cause is the
worst event's (the most recent among equals), in words that stay the same while it holds, since it
labels the series. ECC counts, a failed remap and the recovery action are levels the driver keeps (they
clear on a GPU reset or a driver reload, when the fault is dealt with); an XID is an event, so it
holds for :data:`XID_HOLD_SECONDS` after it was last seen.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from exporter.core import xid
from exporter.core.readings import HEALTH_STATES, Collection, GpuReading

STATES = HEALTH_STATES
XID_HOLD_SECONDS = 600.0  # an XID keeps its GPU degraded or failed this long after it was last seen

_BY_SEVERITY = {"fatal": "failed", "warn": "degraded"}
_RANK = {"ok": 0, "degraded": 1, "failed": 2}
# the down kinds (gpu_exporter_collection_errors_total's) that are not plain failures
_DOWN_STATE = {"gpu_lost": "lost", "gpu_hung": "hung", "stalled": "hung"}
# nvmlDeviceGpuRecoveryAction_t: 1 reset, 2 node reboot, 3 drain peer-to-peer, 4 drain and reset
_RECOVERY = {1: ("failed", "the driver asks for a GPU reset"), 2: ("failed", "the driver asks for a node reboot"),
             3: ("degraded", "the driver asks to drain peer-to-peer traffic"),
             4: ("failed", "the driver asks to drain the GPU and reset it")}


def down_state(kind: str | None) -> str:
    """The state of a GPU that did not answer, from the kind of its failure."""
    return _DOWN_STATE.get(kind or "", "failed")


class HealthTracker:
    """Sets ``health_state`` and ``health_cause`` on every reading of a collection (the engine calls
    :meth:`assess` before building a snapshot). Keeps the XID counts it last saw and when each code of
    each GPU last rose; thread-safe."""

    def __init__(self, overrides: Mapping[int | str, xid.Severity] | None = None,
                 hold: float = XID_HOLD_SECONDS) -> None:
        self.overrides = dict(overrides or {})
        self.hold = hold
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str, str], float] = {}  # (backend, uuid, code) -> count last seen
        self._risen: dict[tuple[str, str], dict[str, float]] = {}  # (backend, uuid) -> code -> when it last rose

    def assess(self, collections: Sequence[Collection], now: float) -> None:
        with self._lock:
            for coll in collections:
                self._note_xids(coll, now)
                for r in coll.gpus:
                    r.health_state, r.health_cause = self._state(coll.backend, r, now)

    def _note_xids(self, coll: Collection, now: float) -> None:
        for (_, uuid, code), n in coll.xid_counts.items():
            key = (coll.backend, uuid, code)
            if n > self._counts.get(key, 0.0):  # counts start at 0 when the exporter starts
                self._risen.setdefault((coll.backend, uuid), {})[code] = now
            self._counts[key] = n

    def _state(self, backend: str, r: GpuReading, now: float) -> tuple[str, str]:
        if not r.up:
            return down_state(r.down_kind), r.up_reason or "unreadable"
        worst, cause = "ok", ""

        def consider(state: str, why: str) -> None:
            nonlocal worst, cause
            if _RANK[state] > _RANK[worst]:
                worst, cause = state, why

        risen = self._risen.get((backend, r.uuid), {})
        for code, when in sorted(risen.items(), key=lambda kv: -kv[1]):  # the most recent first
            if now - when > self.hold:
                continue
            sev = xid.severity(int(code) if code.isdigit() else code, self.overrides)
            if sev in _BY_SEVERITY:
                entry = xid.catalogue().get(int(code)) if code.isdigit() else None
                consider(_BY_SEVERITY[sev], f"xid {code}" + (f" {entry.mnemonic}" if entry else "") + f" ({sev})")
        for event, present in (
            ("ecc_uncorrected", (r.ecc_errors.get(("uncorrected", "volatile")) or 0) > 0),
            ("page_retirement_failed", (r.remapped_rows_failed or 0) > 0),
            ("ecc_corrected", (r.ecc_errors.get(("corrected", "volatile")) or 0) > 0),
            ("page_retired", (r.remapped_rows_pending or 0) > 0 or (r.retired_pages_pending or 0) > 0),
        ):
            if present:
                sev = xid.severity(event, self.overrides)
                if sev in _BY_SEVERITY:
                    consider(_BY_SEVERITY[sev], f"{event} ({sev})")
        for event, where in r.ras_events.items():  # AMD's deferred errors and per-block RAS states
            sev = xid.severity(event, self.overrides)
            if sev in _BY_SEVERITY:
                consider(_BY_SEVERITY[sev], f"{event}{' ' + where if where else ''} ({sev})")
        if r.recovery_action is not None and int(r.recovery_action) in _RECOVERY:
            consider(*_RECOVERY[int(r.recovery_action)])
        return worst, cause
