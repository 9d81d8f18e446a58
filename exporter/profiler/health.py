"""The ``GPUHealthy`` Node condition: what each GPU's health fields say, and when the condition changes. Pure.

Per GPU (from the health fields read with the memory aggregates, sources.Health), the causes,
most severe first (the condition's ``reason`` is the first one found on the node):

``GPULost``
    the exporter reports the GPU down (``gpu_up`` 0), or it stopped reporting while other
    GPUs of its node still do (lost or unreadable).
``CriticalXID``
    an XID of the critical list (sources.CRITICAL_XIDS) in the window. Ours: the counter
    ``gpu_xid_errors_total{xid}`` rose. dcgm: ``DCGM_FI_DEV_XID_ERRORS`` is a gauge holding the
    last XID code, so a critical code among its values in the window (minimum, maximum, last)
    counts when the gauge changed in the window or held another value before it.
``UncorrectableECC``
    the uncorrectable ECC counter rose in the window (dcgm only where the operator enabled
    ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``; it is off in the default counters).
``RowRemapFailure``
    a row remap failed, or a page retirement is pending.
``PCIeLinkNarrowed``
    the PCIe link runs narrower than its maximum width. A lower generation is not a fault:
    GPUs drop the generation when idle to save power. (dcgm has no width field.)

Node: ``True`` (``AllGPUsHealthy``) when every GPU answers with no cause; ``False`` with the
first cause as reason and a short message naming the GPUs; ``Unknown``
(``ExporterNotScraped``) when none of its GPUs has a recent sample.

Transitions: a changed (status, reason) must be observed ``k`` consecutive cycles
(``--hysteresis``) before it is written; the candidate waits in the node's ``pending``
annotation record (plan.py), so ``--once`` keeps the count. The first setting is written at
once. ``lastTransitionTime`` changes only when the status changes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exporter.profiler.classify import GpuStats
from exporter.profiler.sources import CRITICAL_XIDS

CONDITION = "GPUHealthy"
TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"
HEALTHY = "AllGPUsHealthy"
NOT_SCRAPED = "ExporterNotScraped"
LOST = "GPULost"
XID = "CriticalXID"
ECC = "UncorrectableECC"
REMAP = "RowRemapFailure"
PCIE = "PCIeLinkNarrowed"
CAUSES = (LOST, XID, ECC, REMAP, PCIE)  # most severe first
PENDING_NAME = "gpu-healthy"  # its entry in the pending annotation record
MAX_MESSAGE = 1024


@dataclass(frozen=True, slots=True)
class Observed:
    """What one cycle saw on a node (before the hysteresis)."""

    status: str
    reason: str
    message: str

    @property
    def value(self) -> str:
        return f"{self.status}.{self.reason}"


def _f(h: Mapping[str, float], name: str) -> float | None:
    x = h.get(name)
    return x if x is not None and math.isfinite(x) else None


def _critical(x: float | None, codes: frozenset[int]) -> bool:
    return x is not None and x == int(x) and int(x) in codes


def gpu_causes(st: GpuStats, critical: Iterable[int] = CRITICAL_XIDS) -> list[str]:
    """The causes (CAUSES order) that make one reporting GPU unhealthy; [] when none."""
    if st.up is not None and st.up == 0:
        return [LOST]
    h = st.health
    if not h:
        return []  # no health field published (or all read as absent): nothing to find
    return _causes(h, critical if isinstance(critical, frozenset) else frozenset(critical))


def _causes(h: Mapping[str, float], codes: frozenset[int]) -> list[str]:
    out: list[str] = []
    xid = _f(h, "xid")
    if xid is not None and xid > 0:
        out.append(XID)
    elif "xid_last" in h:
        before, changes = _f(h, "xid_before"), _f(h, "xid_changes") or 0.0
        seen = {v for v in (_f(h, "xid_min"), _f(h, "xid_max"), _f(h, "xid_last")) if v is not None}
        if any(_critical(v, codes) and (changes > 0 or v != before) for v in seen):
            out.append(XID)
    ecc = _f(h, "ecc")
    if ecc is not None and ecc > 0:
        out.append(ECC)
    if (_f(h, "remap") or 0.0) >= 1 or (_f(h, "retire") or 0.0) > 0:
        out.append(REMAP)
    width, widest = _f(h, "width"), _f(h, "width_max")
    if width is not None and widest is not None and width < widest:
        out.append(PCIE)
    return out


def _gpu_sort(g: str) -> tuple[int, int, str]:
    return (0, int(g), "") if g.isdigit() else (1, 0, g)


_ALL_HEALTHY: dict[int, Observed] = {}  # "N GPUs healthy", one shared (frozen) object per N


def observe(gpus: Mapping[str, GpuStats], critical: Iterable[int] = CRITICAL_XIDS) -> Observed:
    """The node's condition from its GPUs' stats (every GPU Prometheus knows on it).

    O(GPUs) with a few attribute reads per healthy GPU: it runs for every node every cycle
    (80,000 GPUs at 10,000 nodes), and nearly every GPU is healthy."""
    codes = critical if isinstance(critical, frozenset) else frozenset(critical)
    sick = False
    fresh = 0
    for st in gpus.values():
        if st.fresh:
            fresh += 1
            if (st.up is not None and st.up == 0) or (st.health and _causes(st.health, codes)):
                sick = True
        else:
            sick = True  # lost, unless no GPU of the node is fresh (then the exporter is not scraped)
    if not fresh:
        return Observed(UNKNOWN, NOT_SCRAPED, "no recent sample from the node's GPU exporter")
    if not sick:
        obs = _ALL_HEALTHY.get(fresh)
        if obs is None:
            obs = Observed(TRUE, HEALTHY, f"{fresh} GPUs healthy")
            if len(_ALL_HEALTHY) < 256:
                _ALL_HEALTHY[fresh] = obs
        return obs
    found: dict[str, list[str]] = {}
    for g in sorted(gpus, key=_gpu_sort):
        st = gpus[g]
        for cause in gpu_causes(st, codes) if st.fresh else [LOST]:
            found.setdefault(cause, []).append(g)
    reason = next(c for c in CAUSES if c in found)
    parts = [f"{c}: GPU {', '.join(found[c])}" for c in CAUSES if c in found]
    return Observed(FALSE, reason, "; ".join(parts)[:MAX_MESSAGE])


def published_value(condition: Mapping[str, str] | None) -> str | None:
    """``status.reason`` of the node's GPUHealthy condition, None when it has none."""
    if not condition:
        return None
    return f"{condition.get('status', '')}.{condition.get('reason', '')}"


def decide(published: str | None, observed: str, pending: tuple[str, int] | None,
           k: int) -> tuple[bool, tuple[str, int] | None]:
    """(write the observed condition now, the pending entry to keep).

    The first setting is written at once; a change waits for ``k`` consecutive observations.
    """
    if published is None or published == observed:
        return published != observed, None
    val, count = pending or ("", 0)
    count = count + 1 if val == observed else 1
    if count >= k:
        return True, None
    return False, (observed, count)


def condition(obs: Observed, previous: Mapping[str, str] | None, now: str) -> dict[str, str]:
    """The condition to write: ``lastTransitionTime`` kept unless the status changes."""
    keep = previous is not None and previous.get("status") == obs.status and previous.get("lastTransitionTime")
    return {"type": CONDITION, "status": obs.status, "reason": obs.reason, "message": obs.message,
            "lastTransitionTime": str(previous["lastTransitionTime"]) if keep and previous else now,
            "lastHeartbeatTime": now}


def same(previous: Mapping[str, str] | None, obs: Observed) -> bool:
    """Whether the node already carries exactly this condition (then nothing is written)."""
    return previous is not None and (previous.get("status"), previous.get("reason"), previous.get("message")) == (
        obs.status, obs.reason, obs.message)
