"""The ``GPUHealthy`` Node condition: what each GPU's health fields say, and when the condition changes. Pure.

Per GPU (from the health fields read with the memory aggregates, sources.Health), the causes,
most severe first (the condition's ``reason`` is the first one found on the node):

``GPULost``
    the exporter reports the GPU down (``gpu_up`` 0), or it stopped reporting while other
    GPUs of its node still do (lost or unreadable).
``CriticalXID``
    a ``fatal`` XID in the window: the severity of exporter/core/xid.py (NVIDIA's XID catalogue,
    then ``--xid-severity`` overrides: :class:`XidRules`). Ours: the counter
    ``gpu_xid_errors_total{xid}`` rose, per code. dcgm: ``DCGM_FI_DEV_XID_ERRORS`` is a gauge
    holding the last XID code, so a code among its values in the window (minimum, maximum, last)
    counts when the gauge changed in the window or held another value before it. A ``warn`` XID
    leaves the node ``True`` and is listed in its message; an ``ignore`` one is not shown.
``UncorrectableECC``
    the uncorrectable ECC counter rose in the window (dcgm only where the operator enabled
    ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``; it is off in the default counters).
``RowRemapFailure``
    a row remap failed, or a page retirement is pending.
``PCIeLinkNarrowed``
    the PCIe link runs narrower than its maximum width. A lower generation is not a fault:
    GPUs drop the generation when idle to save power. (dcgm has no width field.)

Ours also publishes its own verdict per GPU, ``gpu_health_state{state}`` (exporter/core/gpu_health.py:
ok, degraded, failed, hung, lost, OpenTelemetry's ``hw.status`` where they fit): ``hung`` is
``GPUHung`` (after ``GPULost`` in rank), ``lost`` is ``GPULost``, ``failed`` with nothing above
in the window is ``GPUFailed`` (ranked after ``RowRemapFailure``), ``degraded`` alone is listed on a
``True`` node like a warn XID. Each of these entries carries the exporter's ``cause`` label
(``(gpu_health_state: <cause>)``), which the query joins to the state.

Node: ``True`` (``AllGPUsHealthy``) when every GPU answers with no cause; ``False`` with the
first cause as reason; ``Unknown`` (``ExporterNotScraped``) when none of its GPUs has a recent
sample.

Message (``False``): one entry per failing GPU and cause, most severe first, joined by ``; ``,
each in the form NVSentinel's and NPD-style consumers parse::

    [<code>] GPU <index> <uuid>: <what> - RecommendedAction: <action>

``<code>``: ``XID<n>`` (the XID's number, where the source tells it), ``GPU_LOST``, ``GPU_HUNG``, ``GPU_FAILED``,
``ECC_UNCORRECTABLE``, ``ROW_REMAP_FAILURE``, ``PAGE_RETIREMENT_PENDING``,
``PCIE_LINK_NARROWED``; ``<uuid>`` is ``-`` where the source has none; ``<action>`` is one of
NVSentinel's ``RecommendedAction`` names (data-models/protobufs/health_event.proto:
``COMPONENT_RESET``, ``CONTACT_SUPPORT``, ``RUN_FIELDDIAG``, ``RESTART_BM``, ...). An entry never
holds ``;`` (NVSentinel splits condition messages there). Past :data:`MAX_MESSAGE` characters
the last entry says how many more were left out. docs/health.md shows consumers reading it.

Transitions: a changed (status, reason) must be observed ``k`` consecutive cycles
(``--hysteresis``) before it is written; the candidate waits in the node's ``pending``
annotation record (plan.py), so ``--once`` keeps the count. The first setting is written at
once. ``lastTransitionTime`` changes only when the status changes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exporter.core import xid as xid_catalogue
from exporter.profiler.classify import GpuStats
from exporter.profiler.plan import valid_uuid
from exporter.profiler.prom import printable

CONDITION = "GPUHealthy"
TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"
HEALTHY = "AllGPUsHealthy"
NOT_SCRAPED = "ExporterNotScraped"
LOST = "GPULost"
HUNG = "GPUHung"
XID = "CriticalXID"
ECC = "UncorrectableECC"
REMAP = "RowRemapFailure"
FAILED = "GPUFailed"
PCIE = "PCIeLinkNarrowed"
CAUSES = (LOST, HUNG, XID, ECC, REMAP, FAILED, PCIE)  # most severe first
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


# cause -> (code, what, NVSentinel RecommendedAction) of an entry, where the cause alone decides them
ACTIONS = {LOST: ("GPU_LOST", "lost or not answering", "RESTART_BM"),
           HUNG: ("GPU_HUNG", "a driver call about it did not return (gpu_health_state)", "RESTART_BM"),
           FAILED: ("GPU_FAILED", "the exporter reports it failed (gpu_health_state)", "COMPONENT_RESET"),
           ECC: ("ECC_UNCORRECTABLE", "uncorrectable ECC errors in the window", "COMPONENT_RESET"),
           PCIE: ("PCIE_LINK_NARROWED", "PCIe link narrower than its maximum width", "RUN_FIELDDIAG")}
XID_ACTION = "COMPONENT_RESET"  # a fatal XID whose number is not known: reset the GPU


@dataclass(frozen=True, slots=True)
class Finding:
    """One cause on one GPU, as one message entry."""

    gpu: str
    uuid: str
    cause: str
    code: str
    what: str
    action: str

    def entry(self) -> str:
        # labels come from the scrape: a uuid out of the UUID alphabet is not written
        gpu, uuid = printable(self.gpu, 40).replace(" ", "_"), self.uuid if valid_uuid(self.uuid) else "-"
        text = f"[{self.code}] GPU {gpu} {uuid}: {self.what} - RecommendedAction: {self.action}"
        return text.replace(";", ",")  # an entry never splits: consumers split the message on ';'


# NVIDIA's immediate-action bucket (xid_catalogue.tsv) -> NVSentinel's RecommendedAction
BUCKET_ACTION = {"RESET_GPU": "COMPONENT_RESET", "WORKFLOW_XID_48": "COMPONENT_RESET", "RESTART_BM": "RESTART_BM",
                 "RESTART_VM": "RESTART_VM", "RESTART_APP": "RESTART_APP", "WORKFLOW_XID_45": "RESTART_APP",
                 "IGNORE": "NONE"}  # the others (workflows, checks, updates): CONTACT_SUPPORT
WARN = "XIDWarning"  # a warn XID's finding: listed, never a cause of False


class XidRules:
    """Each XID code's severity (``fatal``, ``warn``, ``ignore``) and recommended action: the
    catalogue's, with the operator's overrides (exporter/core/xid.py ``load_overrides``)."""

    def __init__(self, overrides: Mapping[int | str, str] | None = None) -> None:
        self.overrides: dict[int | str, xid_catalogue.Severity] = xid_catalogue.load_overrides(
            dict(overrides or {}), "--xid-severity")
        self._cache: dict[int, str] = {}

    @classmethod
    def of(cls, rules: XidRules | Iterable[int] | None) -> XidRules:
        """``rules`` as XidRules; a plain set of codes means: these fatal, every other ignored."""
        if rules is None:
            return DEFAULT_RULES
        if isinstance(rules, XidRules):
            return rules
        codes = set(rules)
        out = cls({c: "fatal" for c in codes})
        out._only = True
        return out

    _only = False

    def severity(self, code: int) -> str:
        sev = self._cache.get(code)
        if sev is None:
            if self._only:
                sev = "fatal" if code in self.overrides else "ignore"
            else:
                sev = xid_catalogue.severity(code, self.overrides)
            self._cache[code] = sev
        return sev

    def ignored(self) -> tuple[int, ...]:
        """The catalogue's codes this policy ignores (the query leaves them out)."""
        return tuple(sorted(c for c in xid_catalogue.catalogue() if self.severity(c) == "ignore"))

    def fatal(self) -> tuple[int, ...]:
        """Every fatal code: the catalogue's and the overrides'."""
        codes = set(xid_catalogue.catalogue()) | {c for c in self.overrides if isinstance(c, int)}
        return tuple(sorted(c for c in codes if self.severity(c) == "fatal"))

    @staticmethod
    def action(code: int) -> str:
        entry = xid_catalogue.catalogue().get(code)
        return BUCKET_ACTION.get(entry.bucket, "CONTACT_SUPPORT") if entry is not None else "CONTACT_SUPPORT"

    @staticmethod
    def mnemonic(code: int) -> str:
        entry = xid_catalogue.catalogue().get(code)
        return entry.mnemonic.split(" / ")[0] if entry is not None else "not in NVIDIA's catalogue"


DEFAULT_RULES = XidRules()
CRITICAL_XIDS = DEFAULT_RULES.fatal()  # the catalogue's fatal codes, no override


def gpu_causes(st: GpuStats, rules: XidRules | Iterable[int] | None = None) -> list[str]:
    """The causes (CAUSES order) that make one reporting GPU unhealthy; [] when none."""
    return list(dict.fromkeys(f.cause for f in gpu_findings(st, rules) if f.cause != WARN))


def gpu_findings(st: GpuStats, rules: XidRules | Iterable[int] | None = None) -> list[Finding]:
    """What makes one reporting GPU unhealthy (and its warn XIDs, cause :data:`WARN`), CAUSES order;
    [] when nothing."""
    h = st.health
    state = _state(h) if h else None
    if (st.up is not None and st.up == 0) or state in ("hung", "lost"):
        if state == "hung":
            return [_verdict(st, HUNG, "a driver call about it did not return (gpu_health_state)")]
        return [_finding(st, LOST)]
    if not h:
        return []  # no health field published (or all read as absent): nothing to find
    return _findings(st, h, XidRules.of(rules))


def _state(h: Mapping[str, float]) -> str | None:
    """The exporter's ``gpu_health_state`` for this GPU when it is not ok (ours only), else None."""
    return _state_and_cause(h)[0]


def _state_and_cause(h: Mapping[str, float]) -> tuple[str | None, str]:
    """The exporter's state when it is not ok, and its ``cause`` label ("" when not read): the stat
    ``state_<state>|<cause>`` (promql.py joins the two labels)."""
    for k, v in h.items():
        if k.startswith("state_") and v == 1:
            state, _, cause = k[6:].partition("|")
            return state, printable(cause, 160)
    return None, ""


def _verdict(st: GpuStats, cause: str, said: str) -> Finding:
    """The entry of the exporter's verdict (hung, failed, degraded), carrying the cause it gave."""
    f = _finding(st, cause)
    _, why = _state_and_cause(st.health or {})
    return Finding(f.gpu, f.uuid, f.cause, f.code, said.replace("(gpu_health_state)", f"(gpu_health_state: {why})")
                   if why else said, f.action)


def _finding(st: GpuStats, cause: str, code: str = "", what: str = "", action: str = "") -> Finding:
    c, w, a = ACTIONS.get(cause, ("", "", ""))
    return Finding(st.gpu, st.uuid, cause, code or c, what or w, action or a)


def _xid_codes(h: Mapping[str, float]) -> list[int] | None:
    """The XID codes seen in the window ([] when one was seen but its code is not known), None
    when none was."""
    per_code = sorted(int(k[4:]) for k, v in h.items() if k.startswith("xid_") and k[4:].isdigit()
                      and math.isfinite(v) and v > 0)
    if per_code:
        return per_code  # ours, per code (the counter's xid label)
    xid = _f(h, "xid")
    if xid is not None and xid > 0:
        return []  # ours: a critical code rose, which one not read
    if "xid_last" in h:
        before, changes = _f(h, "xid_before"), _f(h, "xid_changes") or 0.0
        seen = {v for v in (_f(h, "xid_min"), _f(h, "xid_max"), _f(h, "xid_last")) if v is not None}
        hit = sorted(int(v) for v in seen if v == int(v) and v > 0 and (changes > 0 or v != before))
        if hit:
            return hit  # dcgm: the gauge holds the code itself
    return None


def _findings(st: GpuStats, h: Mapping[str, float], rules: XidRules) -> list[Finding]:
    out: list[Finding] = []
    warn: list[Finding] = []
    xids = _xid_codes(h)
    if xids == []:
        out.append(_finding(st, XID, "XID", "a critical XID in the window", XID_ACTION))
    for c in xids or ():
        sev = rules.severity(c)
        if sev != "ignore":
            (out if sev == "fatal" else warn).append(_finding(
                st, XID if sev == "fatal" else WARN, f"XID{c}", f"XID {c} ({rules.mnemonic(c)}) in the window",
                rules.action(c)))
    ecc = _f(h, "ecc")
    if ecc is not None and ecc > 0:
        out.append(_finding(st, ECC))
    if (_f(h, "remap") or 0.0) >= 1:
        out.append(_finding(st, REMAP, "ROW_REMAP_FAILURE", "a row remap failed", "CONTACT_SUPPORT"))
    if (_f(h, "retire") or 0.0) > 0:
        out.append(_finding(st, REMAP, "PAGE_RETIREMENT_PENDING", "a page retirement is pending",
                            "COMPONENT_RESET"))
    width, widest = _f(h, "width"), _f(h, "width_max")
    if width is not None and widest is not None and width < widest:
        out.append(_finding(st, PCIE, what=f"PCIe link x{width:g} of x{widest:g}"))
    state = _state(h)
    if state == "failed" and not [f for f in out if f.cause != PCIE]:
        # the exporter's verdict on what this window does not show
        out.append(_verdict(st, FAILED, ACTIONS[FAILED][1]))
    elif state == "degraded" and not out and not warn:
        f = _verdict(st, WARN, "the exporter reports it degraded (gpu_health_state)")
        warn.append(Finding(f.gpu, f.uuid, WARN, "GPU_DEGRADED", f.what, "CONTACT_SUPPORT"))
    return out + warn


def _noted(h: Mapping[str, float], rules: XidRules) -> bool:
    """Whether these fields hold anything to report, warn XIDs included (the fast path of :func:`observe`)."""
    return _state(h) in ("hung", "lost") or bool(_findings(_NOBODY, h, rules))


_NOBODY = GpuStats(node="", gpu="")


def _gpu_sort(g: str) -> tuple[int, int, str]:
    return (0, int(g), "") if g.isdigit() else (1, 0, g)


_ALL_HEALTHY: dict[int, Observed] = {}  # "N GPUs healthy", one shared (frozen) object per N


def observe(gpus: Mapping[str, GpuStats], rules: XidRules | Iterable[int] | None = None) -> Observed:
    """The node's condition from its GPUs' stats (every GPU Prometheus knows on it).

    O(GPUs) with a few attribute reads per healthy GPU: it runs for every node every cycle
    (80,000 GPUs at 10,000 nodes), and nearly every GPU is healthy."""
    xr = XidRules.of(rules)
    noted = False
    fresh = 0
    for st in gpus.values():
        if st.fresh:
            fresh += 1
            if (st.up is not None and st.up == 0) or (st.health and _noted(st.health, xr)):
                noted = True
        else:
            noted = True  # lost, unless no GPU of the node is fresh (then the exporter is not scraped)
    if not fresh:
        return Observed(UNKNOWN, NOT_SCRAPED, "no recent sample from the node's GPU exporter")
    if not noted:
        obs = _ALL_HEALTHY.get(fresh)
        if obs is None:
            obs = Observed(TRUE, HEALTHY, f"{fresh} GPUs healthy")
            if len(_ALL_HEALTHY) < 256:
                _ALL_HEALTHY[fresh] = obs
        return obs
    found: list[Finding] = []
    for g in sorted(gpus, key=_gpu_sort):
        st = gpus[g]
        found.extend(gpu_findings(st, xr) if st.fresh else [_finding(st, LOST)])
    failed = [f for f in found if f.cause != WARN]
    if not failed:  # warn XIDs only: healthy, and listed
        return Observed(TRUE, HEALTHY, message(found, f"{fresh} GPUs healthy"))
    rank = {c: i for i, c in enumerate(CAUSES)}
    failed.sort(key=lambda f: rank[f.cause])  # stable: GPU order within a cause
    return Observed(FALSE, failed[0].cause, message(failed + [f for f in found if f.cause == WARN]))


def message(found: list[Finding], head: str = "") -> str:
    """``head`` (if any) then the entries, joined by ``; ``, at most MAX_MESSAGE characters: whole
    entries only, then one ``[MORE] N more entries`` for those left out."""
    entries = [f.entry() for f in found]
    out: list[str] = [head] if head else []
    size = len(head)
    for i, e in enumerate(entries):
        need = size + len(e) + (2 if out else 0)
        if need + (_MORE if i + 1 < len(entries) else 0) > MAX_MESSAGE:
            out.append(f"[MORE] {len(entries) - i} more entries")
            break
        out.append(e)
        size = need
    return "; ".join(out)


_MORE = 32  # room kept for "; [MORE] N more entries"


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
