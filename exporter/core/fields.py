"""The GPU field: how one value of a GPU shows outside ``/metrics``, in ``/stats``,
``/api/v1/monitoring/gpu-metrics``, the Python API's ``GpuStatus`` and ``Recording``, the ``snapshot``
table and ``diff``'s rule.

A field belongs to its family's row (``Family.views`` in :mod:`exporter.core.schema`), so a new family
that should show in those views is still one row; the identity fields (``backend``, ``index``, ``uuid``
...) belong to ``gpu_info``'s row. :data:`exporter.core.views.FIELDS` is the table of every row's
fields, in row order, and every view, JSON schema and docs table is generated from it.

A field left incomplete on a row is completed from the row (:meth:`Field.of`): ``name`` is the row's
``attr``, ``source`` reads that attribute of the GPU's reading, ``unit`` is the row's SI unit and
``doc`` its help and ``nvidia-smi`` equivalent.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Protocol

# SI units a field's value can have (JSON views: numbers in these units); "" for text, flags and counts
UNITS = ("bytes", "ratio", "celsius", "watts", "joules", "seconds", "hertz", "")
KINDS = ("number", "integer", "string", "boolean")
# "fixed": diff reports any change; "rise": diff reports a rise beyond the field's ``rise`` limit; "": shown, not
# compared (it varies in a run)
DIFF_RULES = ("", "fixed", "rise")


class Source(Protocol):
    """What a field reads: one GPU (:class:`exporter.core.views.GpuSource`); ``reading.up`` says
    whether it answered."""

    @property
    def reading(self) -> Any: ...


@dataclass(frozen=True)
class Legacy:
    """How gpu-metrics shows a field: ``key`` (``memory.total``: nested), value x ``times`` / ``per``,
    rounded to ``digits`` (None: a whole number)."""

    key: str
    doc: str = ""
    unit: str = ""  # the legacy unit, when not the field's: MiB, percent, MHz
    times: float = 1.0
    per: float = 1.0
    digits: int | None = 3
    minimum: float | None = 0
    maximum: float | None = None
    while_down: bool = False  # shown while the GPU is down, as identity is; else null then


@dataclass(frozen=True)
class Record:
    """How ``gpu-exporter record`` (and the Python API's ``Monitor``) writes a field it samples:
    under ``key`` of each GPU, min/max/mean x ``times`` rounded to 3 digits, and every sample
    too with ``samples``."""

    key: str
    times: float = 1.0
    samples: bool = False
    doc: str = ""  # the record schema's description of the scaled values (their unit)
    minimum: float | None = None
    maximum: float | None = None


@dataclass(frozen=True)
class Rise:
    """``diff``'s rule for a field that may rise a little during a run (``diff="rise"``): by more than
    ``limit`` (in the field's unit) per GPU it counts as a foreign load. ``check`` names the check
    (``--ignore CHECK``) and its flag (``--max-CHECK-rise``), ``what`` the quantity in diff's report;
    ``instead`` is the ``/stats`` key compared (as ``instead_what``) when either snapshot lacks this
    field (the instantaneous power for the average). ``note`` ends the flag's help."""

    check: str
    limit: float
    what: str
    note: str = ""
    instead: str = ""
    instead_what: str = ""


# One step of a field's source path: ``name``, ``name()`` (a method) or ``name[key]`` (a dict's entry).
_STEP = re.compile(r"([A-Za-z_]\w*)(?:(\(\))|\[(\w+)\])?\Z")


def getter(path: str) -> Callable[[Any], Any]:
    """``reading.temperature_celsius[gpu]`` -> a function of a GPU source returning that value
    (None as soon as a step is None or a key is missing). A path that is not one raises ValueError."""
    steps: list[tuple[str, bool, str | None]] = []
    for part in path.split("."):
        m = _STEP.match(part)
        if m is None:
            raise ValueError(f"field source {path!r}: {part!r} is not name, name() or name[key]")
        steps.append((m[1], bool(m[2]), m[3]))

    def get(src: Any) -> Any:
        v: Any = src
        for name, call, key in steps:
            v = getattr(v, name)
            if call:
                v = v()
            elif key is not None:
                v = v.get(key)
            if v is None:
                return None
        return v

    return get


@dataclass(frozen=True)
class Field:
    """One GPU field. ``name`` is its ``/stats`` key (unless ``stats`` says otherwise) and, with
    ``status``, its ``GpuStatus`` attribute; ``unit`` is the SI unit of ``source``'s value. Left
    empty on a schema row, ``name``, ``unit``, ``source`` and ``doc`` come from the row (:meth:`of`)."""

    name: str = ""
    unit: str | None = None  # bytes, ratio (0-1), celsius, watts, joules, seconds, hertz; "" text, flags, counts
    source: str = ""  # where the value is, on a GpuSource: ``reading.power_watts``, ``reading.clock_hertz[memory]``
    kind: str = "number"  # JSON type: number (rounded to ``digits``), integer, string, boolean
    digits: int = 3
    doc: str = ""  # the /stats schema's description: unit and nvidia-smi equivalent
    minimum: float | None = 0
    maximum: float | None = None
    nullable: bool = True  # False: always known
    identity: bool = False  # who the GPU is: shown while it is down, when its readings are null
    stats: str | None = ""  # /stats key ("pcie.width": nested); "": ``name``; None: not in /stats
    legacy: Legacy | None = None  # None: not in gpu-metrics
    status: bool = False  # a GpuStatus attribute (None while the GPU is down)
    pattern: str | None = None  # a JSON-schema pattern of a string
    diff: str = ""  # diff's rule (DIFF_RULES): "fixed" must not change during a run; "": not compared
    rise: Rise | None = None  # with diff="rise": how much it may rise
    column: str = ""  # its column's header in the snapshot table; "": shown in /stats and JSON only
    record: Record | None = None  # sampled by record / Monitor; None: not sampled
    read: Callable[[Any], Any] = dataclass_field(init=False, repr=False, compare=False)  # ``source``, compiled

    def __post_init__(self) -> None:
        if self.source:
            object.__setattr__(self, "read", getter(self.source))

    def of(self, attr: str, unit: str, help_: str, smi: str) -> Field:
        """This field completed from its family's row: ``attr`` (the reading's attribute), the row's
        ``unit`` ("1": a count), ``help`` and ``nvidia-smi`` equivalent; a field that cannot work
        raises ValueError naming it."""
        name = self.name or attr
        if not name:
            raise ValueError("a field of a row without attr needs a name and a source")
        done = dataclasses.replace(
            self, name=name, source=self.source or f"reading.{attr}",
            unit=self.unit if self.unit is not None else ("" if unit == "1" else unit),
            doc=self.doc or (f"{help_} (nvidia-smi {smi})" if smi and not smi.startswith("(") else help_))
        if done.unit not in UNITS:
            raise ValueError(f"field {name}: unit {done.unit!r} is not one of {', '.join(map(repr, UNITS))}")
        if done.kind not in KINDS:
            raise ValueError(f"field {name}: kind {done.kind!r} is not one of {', '.join(KINDS)}")
        if done.diff not in DIFF_RULES:
            raise ValueError(f"field {name}: diff {done.diff!r} is not one of {DIFF_RULES}")
        if (done.diff == "rise") != (done.rise is not None):
            raise ValueError(f"field {name}: diff='rise' and a rise=Rise(...) limit go together")
        return done

    @property
    def stats_key(self) -> str | None:
        return self.name if self.stats == "" else self.stats

    @property
    def python_type(self) -> type:
        """The type of its ``GpuStatus`` attribute (``None`` besides, unless ``nullable`` is False)."""
        return {"integer": int, "string": str, "boolean": bool}.get(self.kind, float)

    def si(self, src: Source) -> Any:
        """The value in the field's SI unit, as ``/stats`` shows it (numbers rounded; absent: None)."""
        v = self.read(src)
        if self.kind == "integer":
            return _int(v)
        if self.kind == "number":
            return _r(v, self.digits)
        return v

    def in_legacy(self, src: Source) -> Any:
        """The value as gpu-metrics shows it: in its legacy unit, null while the GPU is down."""
        leg = self.legacy
        if leg is None or not (src.reading.up or leg.while_down or self.identity):
            return None
        v = self.read(src)
        if self.kind in ("string", "boolean") or v is None or not math.isfinite(v):
            return v if self.kind in ("string", "boolean") else None
        v = v * leg.times / leg.per
        return round(v) if leg.digits is None else round(v, leg.digits)

    def in_status(self, src: Source) -> Any:
        """The value as ``GpuStatus`` holds it: SI, unrounded (whole bytes for integers), None while down."""
        if not (src.reading.up or self.identity):
            return None
        v = self.read(src)
        return _int(v) if self.kind == "integer" else v


def identity(name: str, source: str, nullable: bool = True, kind: str = "string", **kw: Any) -> Field:
    """An identity field: known while the GPU is down."""
    return Field(name, "", source, kind=kind, nullable=nullable, identity=True, **kw)


def _r(v: float | None, digits: int = 3) -> float | None:
    if v is None or not math.isfinite(v):
        return None
    return round(float(v), digits)


def _int(v: float | None) -> int | None:
    """A count or a whole number of bytes as a JSON integer (85899345920, not 85899345920.0):
    typed decoders reject a float where the schema says integer."""
    if v is None or not math.isfinite(v):
        return None
    return round(v)
