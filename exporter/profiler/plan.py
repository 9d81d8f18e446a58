"""What a Node's annotations should become: hysteresis, dead bands, owned keys. Pure.

Everything the profiler remembers between cycles lives in its own annotations on the Node,
so ``--once`` runs from cron carry state exactly like the long-running loop:

* ``<prefix>/owned-keys``: the names (without prefix) of every key this profiler wrote,
  like Node Feature Discovery's record. Only these keys are ever removed; a key outside
  the record is never touched, even under the same prefix.
* ``<prefix>/pending``: candidate values waiting out the hysteresis,
  ``name=value:count`` separated by commas (absent when nothing is pending).

Rules (docs/annotations.md has the reader's side):

* A classification (a GPU's pattern, the node's idle-GPU count) changes only after the
  new value has been seen ``k`` consecutive evaluations. A first value (nothing published,
  or ``unknown`` published) is written at once: that fills a gap, it is not a flap.
* Numbers that come with a pattern (period, growth rate) and the best-GPU score move only
  when they change by more than a dead band, so noise in the last digits causes no writes.
* A GPU that stopped reporting while others on its node still report has its keys
  removed. A node where no GPU reports at all keeps its GPU keys, each turning ``unknown``
  through the hysteresis, and loses its statistics (idle count, best GPU).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter.profiler.classify import (
    ALLOCATED_IDLE,
    GROWING,
    PATTERNS,
    PERIODIC,
    UNKNOWN,
    GpuProfile,
    Thresholds,
    dominant_pattern,
    is_idle_for_node,
)

OWNED = "owned-keys"
PENDING = "pending"
NODE_PATTERN = "pattern"
IDLE_GPUS = "idle-gpus"
BEST_GPU = "best-gpu"
BEST_SCORE = "best-gpu-score"
ALLOCATED_IDLE_GPUS = "allocated-idle-gpus"
OMITTED_GPUS = "omitted-gpus"  # GPUs beyond --max-gpus-per-node or the byte bound: counted, not annotated
GPU_FIELDS = ("pattern", "uuid", "period-seconds", "memory-growth-bytes-per-second", "holder")
MAX_HOLDER_CHARS = 320  # one "namespace/pod" (63 + 1 + 253); a shared GPU lists what fits

_GPU_KEY = re.compile(r"gpu-([0-9A-Za-z_.-]+)\.(" + "|".join(map(re.escape, GPU_FIELDS)) + r")\Z")
_GPU_ID = re.compile(r"[0-9A-Za-z]([0-9A-Za-z_.-]{0,18}[0-9A-Za-z])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?\Z")  # as we write numbers: no exponent, no NaN, ASCII digits
_COUNT = re.compile(r"(0|[1-9][0-9]{0,8})\Z")  # a count as we write it (below 10^9)
# what a GPU UUID looks like on every source we read: NVIDIA GPU-<uuid>, MIG-<uuid> and the older
# MIG-GPU-<uuid>/<gi>/<ci>, AMD's <uuid>, DCGM's and simulated ones alike; printable ASCII, short
_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,95}\Z")
# a holder entry: namespace (a DNS-1123 label) / pod (a DNS-1123 subdomain of at most 253 characters)
_HOLDER = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/"
                     r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_MORE = re.compile(r"\+[1-9][0-9]{0,8}\Z")  # bounded_holder's ",+N"


def valid_prefix(prefix: str) -> bool:
    """An annotation prefix must be a lowercase DNS subdomain of at most 253 characters."""
    return 0 < len(prefix) <= 253 and bool(_DNS_SUBDOMAIN.match(prefix))


def valid_gpu_id(gpu: str) -> bool:
    """GPU ids become part of a key name (``gpu-<id>.pattern``): keep them short and plain."""
    return bool(_GPU_ID.match(gpu))


def valid_uuid(uuid: str) -> bool:
    """A ``uuid`` label value we write as it is: printable ASCII of the UUID alphabet, at most 96."""
    return bool(_UUID.match(uuid))


def valid_holder(entry: str) -> bool:
    """One ``namespace/pod`` as Kubernetes names them (lower-case DNS names, pod name at most 253)."""
    return len(entry) <= 317 and bool(_HOLDER.match(entry)) and len(entry.partition("/")[2]) <= 253


def clean_holders(holder: str | None) -> tuple[str | None, int]:
    """The entries of a holder list that are Kubernetes names, and how many were not."""
    if not holder:
        return None, 0
    entries = holder.split(",")
    good = [h for h in entries if valid_holder(h)]
    return (",".join(good) or None), len(entries) - len(good)


@dataclass(frozen=True)
class PlanConfig:
    prefix: str = "gpu-exporter.io"
    hysteresis: int = 2  # k consecutive evaluations before a classification changes
    score_deadband: float = 0.05  # availability score: absolute
    period_deadband: float = 0.10  # period: relative
    growth_deadband: float = 0.25  # growth rate: relative
    thresholds: Thresholds = field(default_factory=Thresholds)
    max_gpus_per_node: int = 64  # GPUs annotated per node (lowest ids); the rest are counted in omitted-gpus
    max_annotation_bytes: int = 16384  # our keys and values on one node (the API server allows 256 KiB in all)

    def __post_init__(self) -> None:
        if not valid_prefix(self.prefix):
            raise ValueError(f"annotation prefix {self.prefix!r} is not a lowercase DNS subdomain")
        if self.hysteresis < 1:
            raise ValueError(f"hysteresis {self.hysteresis} must be at least 1")
        if not 1 <= self.max_gpus_per_node <= 4096:
            raise ValueError(f"max GPUs per node {self.max_gpus_per_node} must be 1 to 4096")
        if not 2048 <= self.max_annotation_bytes <= 131072:
            raise ValueError(f"max annotation bytes {self.max_annotation_bytes} must be 2048 to 131072")


@dataclass(frozen=True)
class GpuInput:
    """One reporting GPU of a node for this evaluation."""

    uuid: str
    profile: GpuProfile


def parse_pending(value: str | None) -> dict[str, tuple[str, int]]:
    """``"gpu-0.pattern=bursty:1,idle-gpus=3:1"`` -> {name: (value, count)}; junk is ignored."""
    out: dict[str, tuple[str, int]] = {}
    for item in (value or "").split(","):
        name, eq, rest = item.strip().partition("=")
        val, colon, count = rest.rpartition(":")
        # ASCII digits only ('²'.isdigit() is true), and short: int() refuses 4,300+ digits
        if eq and colon and name and val and _COUNT.match(count):
            out[name] = (val, int(count))
    return out


def format_pending(pending: Mapping[str, tuple[str, int]]) -> str:
    return ",".join(f"{k}={v}:{c}" for k, (v, c) in sorted(pending.items()))


def owned_names(annotations: Mapping[str, str], prefix: str) -> set[str]:
    """Names recorded in ``<prefix>/owned-keys`` (empty entries and odd names dropped)."""
    raw = annotations.get(f"{prefix}/{OWNED}", "")
    return {n.strip() for n in raw.split(",") if n.strip() and "/" not in n.strip()}


def _fmt_number(x: float) -> str:
    return str(round(x))


def _fmt_score(x: float) -> str:
    return f"{x:.2f}"


def _num(s: str | None) -> float | None:
    """A finite plain decimal (``62``, ``0.85``) or None: float() would also take ``nan``,
    ``1e999``, ``1_000`` and ``٣``, none of which we write nor readers parse."""
    if s is None or not _DECIMAL.match(s):
        return None
    x = float(s)
    return x if math.isfinite(x) else None


def _well_formed(name: str, value: str) -> bool:
    """Whether a published value of ours is one this profiler could have written.

    Anything else (a tampered ``gpu-0.pattern: STEADY``, ``best-gpu-score: nan``) is treated
    as absent, so the plan replaces it at once instead of holding it through the hysteresis.
    The uuid is free text; the record and ``pending`` have their own tolerant parsers.
    """
    m = _GPU_KEY.match(name)
    kind = m.group(2) if m else name
    if kind == NODE_PATTERN:  # gpu-<id>.pattern and the node's pattern
        return value in PATTERNS
    if kind in ("period-seconds", "memory-growth-bytes-per-second"):
        return _num(value) is not None
    if kind in (IDLE_GPUS, ALLOCATED_IDLE_GPUS):
        return bool(_COUNT.match(value))
    if kind == "holder":
        entries = value.split(",")
        if entries and _MORE.match(entries[-1]):
            entries.pop()
        return 0 < len(value) <= MAX_HOLDER_CHARS and bool(entries) and all(valid_holder(h) for h in entries)
    if kind == "uuid":
        return valid_uuid(value)
    if kind == BEST_SCORE:
        score = _num(value)
        return score is not None and 0.0 <= score <= 1.0
    if kind == BEST_GPU:
        return valid_gpu_id(value)
    return True


def _moved(old: str | None, new: float, rel: float | None = None, absolute: float | None = None) -> bool:
    """Whether ``new`` is outside the dead band around the published ``old``."""
    o = _num(old)
    if o is None:
        return True
    if absolute is not None:
        return abs(new - o) >= absolute
    assert rel is not None
    return abs(new - o) > rel * max(abs(o), 1e-12)


class _Hysteresis:
    def __init__(self, published: Mapping[str, str], pending: Mapping[str, tuple[str, int]], k: int) -> None:
        self.published = published
        self.pending = pending
        self.k = k
        self.new_pending: dict[str, tuple[str, int]] = {}

    def __call__(self, name: str, candidate: str) -> str:
        pub = self.published.get(name)
        if pub is None or (pub == UNKNOWN and name.endswith(".pattern")) or pub == candidate:
            return candidate
        val, count = self.pending.get(name, ("", 0))
        count = count + 1 if val == candidate else 1
        if count >= self.k:
            return candidate
        self.new_pending[name] = (candidate, count)
        return pub


def plan_node(current: Mapping[str, str], gpus: Mapping[str, GpuInput], cfg: PlanConfig,
              extra_pending: Mapping[str, tuple[str, int]] | None = None) -> dict[str, str]:
    """The complete set of our annotations (full keys) this node should carry now.

    ``current``: all of the node's annotations as read from the API server (foreign ones
    included; they are only read for our prefix). ``gpus``: the GPUs reporting now (fresh),
    by GPU id; empty when the node has no data. ``extra_pending``: other candidates to keep in
    the pending record (the GPUHealthy condition's, health.py).
    """
    p = cfg.prefix + "/"
    owned = owned_names(current, cfg.prefix)
    present = {n: current[p + n] for n in owned if p + n in current}
    # garbage under our keys counts as absent: replaced now, never kept by the hysteresis
    published = {n: v for n, v in present.items() if _well_formed(n, v)}
    pending = parse_pending(current.get(p + PENDING)) if PENDING in owned else {}
    hyst = _Hysteresis(published, pending, cfg.hysteresis)
    out: dict[str, str] = {}

    if gpus:
        inputs: Mapping[str, GpuInput] = gpus
    else:
        # no data for the whole node: every GPU we published turns unknown (via hysteresis)
        # (a GPU whose keys are all garbage is still one we published: it turns unknown too)
        known = sorted({m.group(1) for n in present if (m := _GPU_KEY.match(n))})
        inputs = {g: GpuInput(published.get(f"gpu-{g}.uuid", ""), GpuProfile(UNKNOWN)) for g in known}

    ids = sorted((g for g in inputs if valid_gpu_id(g)), key=_gpu_sort_key)
    omitted = max(0, len(ids) - cfg.max_gpus_per_node)
    kept = ids[: cfg.max_gpus_per_node]
    for gpu in kept:
        gi = inputs[gpu]
        prof = gi.profile
        base = f"gpu-{gpu}."
        name = base + "pattern"
        pattern = hyst(name, prof.pattern if prof.pattern in PATTERNS else UNKNOWN)
        out[name] = pattern
        if gi.uuid and valid_uuid(gi.uuid):
            out[base + "uuid"] = gi.uuid
        held = pattern != prof.pattern  # the hysteresis kept the old pattern
        changed = published.get(name) != pattern
        if pattern == PERIODIC:
            _number(out, published, base + "period-seconds", None if held else prof.period_seconds,
                    changed, rel=cfg.period_deadband)
        elif pattern == GROWING:
            _number(out, published, base + "memory-growth-bytes-per-second",
                    None if held else prof.growth_bytes_per_second, changed, rel=cfg.growth_deadband)
        elif pattern == ALLOCATED_IDLE:
            holder = published.get(base + "holder") if held else bounded_holder(clean_holders(prof.holder)[0])
            if holder:
                out[base + "holder"] = holder

    patterns = [v for n, v in out.items() if n.endswith(".pattern")]
    if patterns:
        out[NODE_PATTERN] = dominant_pattern(patterns)
    allocated_idle = sum(1 for v in patterns if v == ALLOCATED_IDLE)
    if allocated_idle:  # absent means none: most nodes never carry it
        out[ALLOCATED_IDLE_GPUS] = str(allocated_idle)

    profiles = {g: gi.profile for g, gi in gpus.items() if valid_gpu_id(g)}
    measured = [pr for pr in profiles.values() if pr.util_mean is not None and pr.mem_used_ratio is not None]
    if measured:
        idle = sum(1 for pr in measured if is_idle_for_node(pr, cfg.thresholds))
        out[IDLE_GPUS] = hyst(IDLE_GPUS, str(idle))
    shown = set(kept)
    scores = {g: pr.score for g, pr in profiles.items() if pr.score is not None and g in shown}
    if scores:
        best = max(sorted(scores, key=_gpu_sort_key), key=lambda g: scores[g])
        pub_best = published.get(BEST_GPU)
        # keep the published best GPU while it is within the dead band of the best one
        if pub_best in scores and scores[pub_best] >= scores[best] - cfg.score_deadband:
            best = pub_best
        out[BEST_GPU] = best
        pub_score = published.get(BEST_SCORE)
        new_score = scores[best]
        keep = pub_score is not None and pub_best == best and not _moved(pub_score, new_score,
                                                                         absolute=cfg.score_deadband)
        out[BEST_SCORE] = pub_score if keep and pub_score is not None else _fmt_score(new_score)

    if extra_pending:
        hyst.new_pending.update(extra_pending)
    desired = _desired(out, hyst.new_pending, omitted, p)
    # the byte bound: GPUs are left out from the highest id, each counted, until the node fits
    while kept and annotation_bytes(desired, cfg.prefix) > cfg.max_annotation_bytes:
        base = f"gpu-{kept.pop()}."
        out = {n: v for n, v in out.items() if not n.startswith(base)}
        hyst.new_pending = {n: x for n, x in hyst.new_pending.items() if not n.startswith(base)}
        omitted += 1
        desired = _desired(out, hyst.new_pending, omitted, p)
    return desired


def _desired(out: Mapping[str, str], pending: Mapping[str, tuple[str, int]], omitted: int, p: str) -> dict[str, str]:
    """Full keys: ``out`` plus the pending record, the omitted-GPU count and the owned-keys record."""
    names = dict(out)
    if pending:
        names[PENDING] = format_pending(pending)
    if omitted:
        names[OMITTED_GPUS] = str(omitted)
    if not names:
        return {}  # nothing left to say: diff() then removes the record itself
    desired = {p + n: v for n, v in names.items()}
    desired[p + OWNED] = ",".join(sorted(names, key=_name_sort_key))
    return desired


def bounded_holder(holder: str | None) -> str | None:
    """``namespace/pod[,namespace/pod...]`` cut to whole entries within MAX_HOLDER_CHARS
    (``+N`` counts the entries left out)."""
    if not holder:
        return None
    entries = [h for h in holder.split(",") if h]
    kept: list[str] = []
    for i, h in enumerate(entries):
        rest = len(entries) - i - 1
        tail = f",+{rest}" if rest else ""
        if len(",".join([*kept, h])) + len(tail) > MAX_HOLDER_CHARS:
            left = len(entries) - len(kept)
            return (",".join(kept) + f",+{left}") if kept else entries[0][: MAX_HOLDER_CHARS]
        kept.append(h)
    return ",".join(kept)


def _number(out: dict[str, str], published: Mapping[str, str], name: str, value: float | None,
            changed: bool, rel: float) -> None:
    """Set a pattern's number: keep the published one inside the dead band or when held."""
    old = published.get(name)
    if value is None:
        if old is not None:
            out[name] = old
        return
    if changed or old is None or _moved(old, value, rel=rel):
        out[name] = _fmt_number(value)
    else:
        out[name] = old


def _gpu_sort_key(g: str) -> tuple[int, int, str]:
    return (0, int(g), "") if g.isdigit() else (1, 0, g)


def _name_sort_key(n: str) -> tuple[int, tuple[int, int, str], str]:
    m = _GPU_KEY.match(n)
    if m:
        return (1, _gpu_sort_key(m.group(1)), m.group(2))
    return (0, (0, 0, ""), n)


def diff(current: Mapping[str, str], desired: Mapping[str, str], prefix: str) -> dict[str, str | None]:
    """The annotations part of a JSON merge patch taking ``current`` to ``desired``.

    Sets what differs; deletes (``None``) only keys named in the current owned-keys record
    (plus the record and pending keys themselves) that ``desired`` no longer has.
    """
    p = prefix + "/"
    patch: dict[str, str | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    for name in owned_names(current, prefix) | {OWNED, PENDING}:
        key = p + name
        if key in current and key not in desired:
            patch[key] = None
    return patch


def has_our_keys(annotations: Mapping[str, str], prefix: str) -> bool:
    return f"{prefix}/{OWNED}" in annotations


def annotation_bytes(annotations: Mapping[str, str], prefix: str) -> int:
    """Bytes of keys and values under our record (what the 4 KiB budget counts)."""
    p = prefix + "/"
    return sum(len(k) + len(v) for k, v in annotations.items() if k.startswith(p))
