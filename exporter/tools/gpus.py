"""The Python API for benchmark harnesses and autotuners (``import exporter``; docs/python-api.md).

Every function reads the GPUs through the exporter's own backends and
:class:`~exporter.core.engine.Engine`, as ``/metrics`` does, and the CLI tools ``snapshot``,
``record`` and ``pick`` are thin layers over this module: scoring, selection and aggregation
exist once, here.

Units are SI (bytes, ratio 0-1, celsius, watts, joules, seconds). A reading that cannot be
taken is ``None``, never 0. Bad arguments raise :class:`ValueError` or :class:`TypeError` with
a one-line message; a GPU backend that cannot be used raises :class:`GpuUnavailable` (a
:class:`RuntimeError`).

Thread safety: callers that use the same backend at the same time (two :class:`Monitor`
objects, concurrent :func:`query_gpus` calls) share one backend initialisation and one
collection thread; the backend is shut down when the last of them is done.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, dataclass_transform

from exporter.core.engine import Engine
from exporter.core.options import BackendOptions, Settings
from exporter.core.readings import GpuReading
from exporter.core.snapshot import Snapshot
from exporter.core.views import FIELDS, MIB, Field, GpuSource, format_bytes, iso_time, numbered, status_values

log = logging.getLogger(__name__)

FREE_WEIGHT, IDLE_WEIGHT = 0.6, 0.4  # score = 0.6 x free-memory fraction + 0.4 x (1 - utilisation)
DEFAULT_MAX_UTILIZATION = 0.5
# The memory floor of select_gpus/check_availability/wait_for_availability and of `pick --min-free`:
# one default for both (issue 28); None or 0 asks for no floor.
DEFAULT_MIN_FREE_BYTES = 8 * 2**30
MIN_INTERVAL, MAX_INTERVAL = 0.05, 3600.0  # seconds between samples or polls
MAX_TIMEOUT = 7 * 86400.0  # a wait longer than a week is a mistake, not a plan


T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def rows_dataclass(rows: Sequence[Field], after: str,
                   row_type: Callable[[Field], object]) -> Callable[[type[T]], type[T]]:
    """A frozen dataclass whose attributes are the class's own and, after its attribute ``after``, one per
    field of ``rows`` (the field table's, exporter/core/views.py), in table order: a row added to the table
    is an attribute with no edit here. The class's annotation of a row's attribute types it for type
    checkers; a row it does not annotate is typed ``row_type(field)``."""

    def make(cls: type[T]) -> type[T]:
        # the class's own annotations, in order, rewritten in place before dataclass() reads them
        annotations: dict[str, Any] = cls.__dict__["__annotations__"]  # noqa: RUF063
        declared = dict(annotations)
        names = [f.name for f in rows]
        own = [(k, v) for k, v in declared.items() if k not in names]
        at = [k for k, _ in own].index(after) + 1
        table = [(f.name, declared.get(f.name, row_type(f))) for f in rows]
        annotations.clear()
        annotations.update([*own[:at], *table, *own[at:]])
        return dataclass(frozen=True)(cls)

    return make


class GpuUnavailable(RuntimeError):
    """The GPU backend cannot be used: no GPU found, the library failed to load, a collection failed."""


# --- argument checks: one line, naming the argument --------------------------------------------


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_number(value: object, name: str, lo: float, hi: float, *, lo_open: bool = False,
                 what: str = "a number") -> float:
    """``value`` as a finite float in ``lo..hi`` (``(lo, hi]`` with ``lo_open``), else ValueError/TypeError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name}: expected {what}, got {type(value).__name__} {_short(value)}")
    try:
        v = float(value)
    except OverflowError:
        v = math.inf
    if not (math.isfinite(v) and lo <= v <= hi) or (lo_open and v == lo):
        low = f"{'more than' if lo_open else 'at least'} {lo:g}"
        bounds = low if hi == math.inf else f"{low} and at most {hi:g}"
        raise ValueError(f"{name}: expected {what} {bounds}, got {_short(value)}")
    return v


def check_count(value: object, name: str = "count") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected a whole number of GPUs, got {type(value).__name__} {_short(value)}")
    if value < 1:
        raise ValueError(f"{name}: expected at least 1 GPU, got {_short(value)}")
    return value


def _min_free(value: object) -> float:
    return 0.0 if value is None else check_number(value, "min_free_bytes", 0, math.inf, what="bytes")


def _max_util(value: object) -> float:
    return check_number(value, "max_utilization", 0, 1, what="a ratio")


def check_interval(value: object, name: str = "interval") -> float:
    return check_number(value, name, MIN_INTERVAL, MAX_INTERVAL, what="seconds")


def check_timeout(value: object, name: str = "timeout") -> float:
    return check_number(value, name, 0, MAX_TIMEOUT, what="seconds")


def settings_for(backend: object) -> Settings:
    """The settings of the Python API: ``backend`` and the exporter's defaults (no environment)."""
    from exporter import backends

    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a string such as 'auto' or 'nvml', got {type(backend).__name__}")
    known = backends.names()
    parts = [p.strip().lower() for p in backend.split(",")]
    if backend.strip().lower() != "auto" and (not all(parts) or any(p not in known for p in parts)):
        raise ValueError(f"backend: unknown backend {_short(backend)}; expected auto, or one or more of "
                         f"{', '.join(known)} separated by commas")
    return Settings(backend=",".join(parts))


# --- one backend initialisation per process, shared -----------------------------------------------


def _open_engine(settings: Settings) -> Engine:
    """Initialise the chosen backends now and wrap them in an Engine that collects on demand.

    Unlike ``serve`` (which keeps a failing explicit backend and retries it on every scrape),
    a caller here must hear at once, and ``auto`` never falls back to simulated GPUs.
    """
    from exporter import backends
    from exporter.backends.base import Backend
    from exporter.core.host import host_info

    options = BackendOptions.from_settings(settings)
    chosen: list[Backend] = []
    if settings.backend == "auto":
        found, reasons = backends.detect(options)
        if found is None:
            raise GpuUnavailable("no GPU found (" + "; ".join(reasons) + "); use backend 'simulated' to try it "
                                 "on simulated GPUs")
        chosen = [found]
    else:
        for name in settings.backend.split(","):
            b = backends.create(name, options)
            try:
                b.init()
            except Exception as exc:  # noqa: BLE001 - reported as one line
                for c in chosen:
                    c.shutdown()
                raise GpuUnavailable(f"backend {name}: {exc}") from None
            chosen.append(b)
            if name == "simulated":
                log.warning("backend simulated: these readings are SIMULATED, not real GPUs")
    engine = Engine(chosen, host_info(), options.fields, collection_interval=0.0,
                    collection_timeout=settings.collection_timeout, cache_ttl=0.0)
    for b in chosen:
        engine.mark_initialised(b.name)
    return engine


class _Shared:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.users = 0


_lock = threading.Lock()  # held while a backend initialises: concurrent first users wait for that one
_shared: dict[str, _Shared] = {}


@contextlib.contextmanager
def session(settings: Settings) -> Iterator[Engine]:
    """The engine for ``settings``, shared with every concurrent user of the same settings."""
    key = repr((settings.backend, BackendOptions.from_settings(settings), settings.collection_timeout))
    with _lock:
        shared = _shared.get(key)
        if shared is None:
            shared = _shared[key] = _Shared(_open_engine(settings))
        shared.users += 1
    try:
        yield shared.engine
    finally:
        with _lock:
            shared.users -= 1
            last = shared.users == 0
            if last:
                del _shared[key]
        if last:
            shared.engine.stop()


def read(engine: Engine) -> Snapshot:
    """One fresh collection from every backend; a failed backend is an error, not missing GPUs."""
    snap = engine.scrape()
    failed = [name for name, st in snap.stats.items() if not st.success]
    if failed:
        raise GpuUnavailable(f"collection failed for backend {', '.join(failed)} (see the warning logged)")
    return snap


# --- the state of each GPU -------------------------------------------------------------------------


def _status_type(f: Field) -> object:
    return f.python_type if not f.nullable else f.python_type | None


@rows_dataclass([f for f in FIELDS if f.status], after="index", row_type=_status_type)
class GpuStatus:
    """One GPU now, in SI units; ``None``: the reading cannot be taken (never 0).

    Its attributes are ``index``, the field table's rows marked ``status`` (exporter/core/schema.py:
    identity, memory, utilisation, temperature, power ... as docs/api.md lists them) and ``score``.
    ``index`` is the driver's (``nvidia-smi -i`` / ``amd-smi`` order; with two backends, the
    second one's GPUs follow the first's). ``score`` is 0.6 x the free-memory fraction +
    0.4 x (1 - utilisation); a reading that is missing counts as the worst case (no memory
    free, fully busy), so a GPU that does not report ranks last. ``up`` is False when the GPU
    is lost or unreadable (``gpu_up 0``); it then has no readings.
    """

    index: int
    score: float
    # the status rows, typed for type checkers (a row added later is typed by its kind at run time)
    uuid: str
    name: str | None
    up: bool
    memory_total_bytes: int | None  # nvidia-smi memory.total
    memory_used_bytes: int | None  # memory.used
    memory_free_bytes: int | None  # memory.free
    utilization_ratio: float | None  # utilization.gpu / 100
    temperature_celsius: float | None  # temperature.gpu (amd-smi: edge)
    power_watts: float | None  # power.draw
    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any: ...  # a status row the class does not annotate


def score(free: float | None, total: float | None, util: float | None) -> float:
    """0.6 x free fraction + 0.4 x (1 - utilisation); unknown free counts as 0, unknown utilisation as 1."""
    free_ratio = min(1.0, max(0.0, free / total)) if free is not None and total else 0.0
    busy = min(1.0, max(0.0, util)) if util is not None else 1.0
    return round(FREE_WEIGHT * free_ratio + IDLE_WEIGHT * (1.0 - busy), 6)


def status(number: int, g: GpuReading, backend: str = "") -> GpuStatus:
    """The :class:`GpuStatus` of one reading (``number``: its index across backends): the rows of the field
    table (:data:`exporter.core.views.FIELDS`) marked ``status``, its identity, and the score."""
    values = status_values(GpuSource(backend, number, g))
    if not g.up:
        return GpuStatus(index=number, **values, score=0.0)
    ranked = score(values["memory_free_bytes"], values["memory_total_bytes"], values["utilization_ratio"])
    return GpuStatus(index=number, **values, score=ranked)


def statuses(snap: Snapshot) -> list[tuple[str, GpuStatus]]:
    """(backend, status) of every GPU of a collection, in index order."""
    return [(backend, status(number, g, backend)) for number, backend, g in numbered(snap)]


def query_gpus(backend: str = "auto") -> list[GpuStatus]:
    """Every GPU now, in index order (``nvidia-smi --query-gpu=...`` / ``amd-smi metric``).

    ``backend``: ``auto`` (the real backends in ``--backend auto`` order; never simulated), one
    backend's name (``gpu-exporter serve --help`` lists them), or a comma list.
    """
    settings = settings_for(backend)
    with session(settings) as engine:
        return [s for _, s in statuses(read(engine))]


# --- choosing GPUs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Availability:
    """Whether ``count`` GPUs qualify now.

    ``gpus``: the best ``count`` qualifying GPUs (by score) when ``ok``, else every GPU that
    qualifies. ``reason``: one line saying what was found or what is missing. ``statuses``:
    every GPU that was looked at, best first.
    """

    ok: bool
    gpus: list[int]
    reason: str
    statuses: list[GpuStatus] = field(default_factory=list)


class InsufficientGpus(RuntimeError):
    """Fewer GPUs qualify than were asked for; the message says what is missing."""

    def __init__(self, availability: Availability) -> None:
        super().__init__(availability.reason)
        self.availability = availability


def why_not(s: GpuStatus, min_free: float, max_util: float) -> list[str]:
    """Why a GPU does not qualify; empty when it does."""
    if not s.up:
        return ["is down (lost or unreadable)"]
    out = []
    if s.memory_free_bytes is None and min_free > 0:
        out.append("does not report free memory")
    elif s.memory_free_bytes is not None and s.memory_free_bytes < min_free:
        out.append(f"has {format_bytes(s.memory_free_bytes)} free (needs {format_bytes(min_free)})")
    if s.utilization_ratio is None and max_util < 1:
        out.append("does not report utilisation")
    elif s.utilization_ratio is not None and s.utilization_ratio > max_util:
        out.append(f"is {s.utilization_ratio * 100:.0f}% busy (max {max_util * 100:.0f}%)")
    return out


def assess(found: Sequence[GpuStatus], count: int, min_free: float, max_util: float,
           waited: float | None = None) -> Availability:
    """The one selection rule: qualifying GPUs ranked by score (then index)."""
    ranked = sorted(found, key=lambda s: (-s.score, s.index))
    rejected = {s.index: why_not(s, min_free, max_util) for s in ranked}
    good = [s.index for s in ranked if not rejected[s.index]]
    if len(good) >= count:
        chosen = good[:count]
        return Availability(True, chosen, f"{len(good)} of {len(ranked)} GPUs qualify; best {count}: "
                            + ",".join(map(str, chosen)), list(ranked))
    if len(ranked) < count:
        return Availability(False, good, f"need {count} GPUs but this machine has {len(ranked)}", list(ranked))
    limits = ([f">= {format_bytes(min_free)} free"] if min_free > 0 else []) + \
        ([f"<= {max_util * 100:.0f}% utilisation"] if max_util < 1 else [])
    after = f" after waiting {waited:.0f} s" if waited else ""
    reasons = "; ".join(f"gpu {i} {' and '.join(r)}" for i, r in rejected.items() if r)
    return Availability(False, good, f"need {count} GPUs{' with ' + ' and '.join(limits) if limits else ''}, "
                        f"found {len(good)}{after}: {reasons}", list(ranked))


def check_availability(count: int, min_free_bytes: float | None = DEFAULT_MIN_FREE_BYTES,
                       max_utilization: float = DEFAULT_MAX_UTILIZATION, *, backend: str = "auto") -> Availability:
    """Whether ``count`` GPUs each have ``min_free_bytes`` free and at most ``max_utilization`` busy, now."""
    n, free, util = check_count(count), _min_free(min_free_bytes), _max_util(max_utilization)
    with session(settings_for(backend)) as engine:
        return assess([s for _, s in statuses(read(engine))], n, free, util)


def select_gpus(count: int, min_free_bytes: float | None = DEFAULT_MIN_FREE_BYTES,
                max_utilization: float = DEFAULT_MAX_UTILIZATION, *, backend: str = "auto") -> list[int]:
    """The indices of the best ``count`` qualifying GPUs, best first (for CUDA_VISIBLE_DEVICES with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``); raises :class:`InsufficientGpus` saying what is missing."""
    a = check_availability(count, min_free_bytes, max_utilization, backend=backend)
    if not a.ok:
        raise InsufficientGpus(a)
    return a.gpus


Report = Callable[[Availability, float, float], None]  # (availability, next sleep, seconds left)


def wait(engine: Engine, count: int, min_free: float, max_util: float, timeout: float, interval: float,
         report: Report | None = None, on_check: Callable[[Availability], None] | None = None) -> Availability:
    """Check every ``interval`` seconds until ``count`` GPUs qualify or ``timeout`` seconds have passed.

    Never sleeps past the deadline: the last check is at the deadline. Returns at once when the
    machine has fewer GPUs than ``count`` (waiting cannot help).
    """
    start = time.monotonic()
    deadline = start + timeout
    while True:
        found = [s for _, s in statuses(read(engine))]
        now = time.monotonic()
        a = assess(found, count, min_free, max_util, waited=(now - start) if now >= deadline and timeout else None)
        if on_check is not None:
            on_check(a)
        left = deadline - now
        if a.ok or len(found) < count or left <= 0:
            return a
        pause = min(interval, left)
        if report is not None:
            report(a, pause, left)
        time.sleep(pause)  # the wait between polls is the feature


def wait_for_availability(count: int, min_free_bytes: float | None = DEFAULT_MIN_FREE_BYTES, timeout: float = 300.0,
                          interval: float = 30.0, max_utilization: float = DEFAULT_MAX_UTILIZATION, *,
                          backend: str = "auto") -> Availability:
    """:func:`check_availability` every ``interval`` seconds until it is ok or ``timeout`` seconds
    have passed; returns the last answer at the deadline at the latest."""
    n, free, util = check_count(count), _min_free(min_free_bytes), _max_util(max_utilization)
    t, i = check_timeout(timeout), check_interval(interval)
    with session(settings_for(backend)) as engine:
        return wait(engine, n, free, util, t, i)


# --- how many GPUs a parallel run needs -----------------------------------------------------------------

# parallelism dimension -> accepted spellings (matched after lower-casing and "-" -> "_")
PARALLEL_KEYS: dict[str, tuple[str, ...]] = {
    "tp": ("tensor_parallel_size", "tp_size", "tp"),
    "pp": ("pipeline_parallel_size", "pp_size", "pp"),
    "dp": ("data_parallel_size", "dp_size", "dp"),
    "cp": ("context_parallel_size", "cp_size", "cp"),
    "dcp": ("decode_context_parallel_size", "dcp_size", "dcp"),
}
_SPELLING = {s: dim for dim, spellings in PARALLEL_KEYS.items() for s in spellings}
MAX_DEPTH = 32
# memory per GPU by model size (parameters, read from the model name): the autotuner's tiers
MEMORY_TIERS = ((65e9, 20_000 * MIB), (7e9, 12_000 * MIB), (0.0, 8_000 * MIB))
_PARAMS = re.compile(r"(?<![0-9a-z.])(\d+(?:\.\d+)?)b(?![a-z0-9])")


@dataclass(frozen=True)
class Requirements:
    """What a parallel run needs: ``gpus`` = tp x pp x max(dp, cp, dcp), and the free memory each
    GPU should have (bytes). ``parallelism``: the size of each dimension (1 when not given)."""

    gpus: int
    memory_per_gpu_bytes: int
    parallelism: dict[str, int]


def _positive(v: object, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ValueError(f"{where}={_short(v)}: expected a positive integer or a list of them")
    try:
        f = float(v)
    except (ValueError, OverflowError):
        f = math.nan
    if not (math.isfinite(f) and f.is_integer() and 1 <= f <= 1 << 20):
        raise ValueError(f"{where}={_short(v)}: expected a positive integer or a list of them")
    return int(f)


def _dimension(v: object, where: str) -> int:
    """A size, a list of sizes (its largest counts), or the autotuner's {"values": [...]}."""
    if isinstance(v, Mapping) and "values" in v:
        v, where = v["values"], f"{where}.values"
    if isinstance(v, list | tuple):
        if not v:
            raise ValueError(f"{where}=[]: expected a positive integer or a non-empty list of them")
        return max(_positive(x, f"{where}[{i}]") for i, x in enumerate(v))
    return _positive(v, where)


def parallelism(config: object, source: str = "task_config") -> tuple[dict[str, int], set[str]]:
    """The size of each dimension, searched at every depth; also which dimensions were given.

    A dimension given twice with different values is an error; a missing one is 1.
    """
    found: dict[str, tuple[int, str]] = {}
    stack: list[tuple[object, str, int]] = [(config, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"{source}: nested deeper than {MAX_DEPTH} levels at {path[:60]}")
        items: Iterable[tuple[str, object]]
        if isinstance(node, Mapping):
            items = ((str(k), v) for k, v in node.items())
        elif isinstance(node, list | tuple):
            items = ((f"[{i}]", v) for i, v in enumerate(node))
        else:
            continue
        children = []
        for k, v in items:
            where = f"{path}.{k}" if path and not k.startswith("[") else f"{path}{k}"
            dim = _SPELLING.get(k.lower().replace("-", "_"))
            if dim is None or (isinstance(v, Mapping) and "values" not in v):
                children.append((v, where, depth + 1))
                continue
            try:
                n = _dimension(v, where)
            except ValueError as exc:
                raise ValueError(f"{source}: {exc}") from None
            if dim in found and found[dim][0] != n:
                raise ValueError(f"{source}: {dim} is given twice with different values "
                                 f"({found[dim][1]}={found[dim][0]}, {where}={n})")
            found.setdefault(dim, (n, where))
        stack.extend(reversed(children))
    return {dim: found[dim][0] if dim in found else 1 for dim in PARALLEL_KEYS}, set(found)


def world_size(sizes: Mapping[str, int]) -> int:
    """tp x pp x max(dp, cp, dcp): data and context parallel ranks share the GPUs of one replica."""
    return sizes["tp"] * sizes["pp"] * max(sizes["dp"], sizes["cp"], sizes["dcp"])


def _model_name(config: Mapping[str, Any]) -> str:
    model = config.get("model")
    if isinstance(model, Mapping):
        model = model.get("id_or_path") or model.get("id") or model.get("name") or model.get("path")
    return model if isinstance(model, str) else ""


def estimate_requirements(task_config: Mapping[str, Any]) -> Requirements:
    """GPUs and memory per GPU for an autotuner task (or any serving config).

    The parallel sizes are read at any depth (``parameters: {"tp-size": [1, 2, 4]}`` works; a list
    counts as its largest value, as does ``{"type": "choice", "values": [...]}``); spellings
    ``tensor-parallel-size``, ``tp-size``, ``tp_size``, ``tp`` and likewise for pp, dp, cp and dcp.
    The memory per GPU follows the model size read from ``model`` (``id_or_path``): 20,000 MiB
    from 65B parameters, 12,000 MiB from 7B, else 8,000 MiB.
    """
    if not isinstance(task_config, Mapping):
        raise TypeError(f"task_config: expected a mapping (dict), got {type(task_config).__name__}")
    sizes, _ = parallelism(task_config)
    gpus = world_size(sizes)
    m = _PARAMS.search(_model_name(task_config).lower())
    params = float(m.group(1)) * 1e9 if m else 0.0
    memory = next(b for floor, b in MEMORY_TIERS if params >= floor)
    return Requirements(gpus=gpus, memory_per_gpu_bytes=memory, parallelism=sizes)


# --- recording ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """One reading of one GPU over a recording: a value per sample (``None``: not read) and its
    min, max and mean over the samples that have one (``None`` when none has)."""

    samples: tuple[float | None, ...]

    @property
    def _values(self) -> list[float]:
        return [v for v in self.samples if v is not None]

    @property
    def min(self) -> float | None:
        return min(self._values, default=None)

    @property
    def max(self) -> float | None:
        return max(self._values, default=None)

    @property
    def mean(self) -> float | None:
        vs = self._values
        return sum(vs) / len(vs) if vs else None

    def scaled(self, factor: float, digits: int = 3) -> dict[str, float | None]:
        """min/max/mean times ``factor``, rounded (the record JSON's units)."""
        out: dict[str, float | None] = {}
        for k, v in (("min", self.min), ("max", self.max), ("mean", self.mean)):
            out[k] = None if v is None else round(v * factor, digits)
        return out


# what a recording samples: the field table's rows with a ``record`` (read as the JSON views read them: SI,
# unrounded)
RECORDED: tuple[Field, ...] = tuple(f for f in FIELDS if f.record is not None)


@rows_dataclass(RECORDED, after="name", row_type=lambda f: Series)
class GpuRecording:
    """One GPU of a :class:`Recording`, in SI units: a :class:`Series` for each field the table's rows
    record (``utilization_ratio``, ``memory_used_bytes``, ``memory_used_ratio``, ``temperature_celsius``,
    ``power_watts`` ...). ``lost``: it was lost (``gpu_up 0``) or gone from the device list in at least
    one sample; those samples are ``None``, never 0."""

    index: int
    uuid: str
    name: str | None
    # the recorded rows, typed for type checkers (a row added later is a Series too)
    utilization_ratio: Series
    memory_used_bytes: Series
    memory_used_ratio: Series
    temperature_celsius: Series
    power_watts: Series
    energy_joules: float | None  # counter difference over the run; None when unsupported or reset
    lost: bool = False
    lost_at_seconds: float | None = None  # seconds since start of the first sample that found it lost
    lost_reason: str | None = None
    if TYPE_CHECKING:
        def __getattr__(self, name: str) -> Series: ...  # a recorded row the class does not annotate


@dataclass(frozen=True)
class Recording:
    """GPU use over an interval: what ``gpu-exporter record`` writes, as objects.

    ``timestamps``: seconds since the start, one per sample. ``command`` and ``exit_code`` are
    those of ``gpu-exporter record``; a :class:`Monitor` has no command (``()``, ``None``).
    """

    started: float  # Unix time
    duration_seconds: float
    interval_seconds: float
    timestamps: tuple[float, ...]
    gpus: Mapping[int, GpuRecording]
    command: tuple[str, ...] = ()
    exit_code: int | None = None

    @property
    def sample_count(self) -> int:
        return len(self.timestamps)

    @property
    def lost(self) -> list[int]:
        """Indices of the GPUs lost during the recording."""
        return [i for i, g in sorted(self.gpus.items()) if g.lost]

    def to_dict(self) -> dict[str, Any]:
        """Exactly the JSON document ``gpu-exporter record -o`` writes (legacy units: %, MiB, C, W)."""
        stats: dict[str, Any] = {}
        for number, g in sorted(self.gpus.items()):
            gpu: dict[str, Any] = {"name": g.name, "uuid": g.uuid}
            for f in RECORDED:
                assert f.record is not None
                series: Series = getattr(g, f.name)
                gpu[f.record.key] = series.scaled(f.record.times)
                if f.record.samples:
                    gpu[f.record.key]["samples"] = [None if v is None else round(v * f.record.times, 3)
                                                    for v in series.samples]
            stats[str(number)] = {
                **gpu,
                "energy_joules": None if g.energy_joules is None else round(g.energy_joules, 3),
                "lost": g.lost,
                "lost_at_seconds": None if g.lost_at_seconds is None else round(g.lost_at_seconds, 3),
                "lost_reason": g.lost_reason,
            }
        return {
            "command": list(self.command),
            "exit_code": self.exit_code,
            "started": iso_time(self.started),
            "interval_seconds": self.interval_seconds,
            "monitoring_duration_seconds": round(self.duration_seconds, 3),
            "sample_count": self.sample_count,
            "gpu_stats": stats,
            "timestamps": [round(t, 3) for t in self.timestamps],
        }


class _Track:
    """The samples of one GPU (by backend and UUID, so a renumbered GPU is not mixed up)."""

    def __init__(self, number: int, uuid: str, name: str | None, pad: int) -> None:
        self.number, self.uuid, self.name = number, uuid, name
        self.values: dict[str, list[float | None]] = {f.name: [None] * pad for f in RECORDED}
        self.energy_first: float | None = None
        self.energy_last: float | None = None
        self.lost_at: float | None = None
        self.lost_reason: str | None = None

    def add(self, g: GpuReading | None, t: float) -> None:
        if g is None or not g.up:
            if self.lost_at is None:
                self.lost_at = t
                self.lost_reason = "gone from the device list" if g is None else g.up_reason or "unreadable"
            for values in self.values.values():
                values.append(None)
            return
        src = GpuSource("", self.number, g)
        for f in RECORDED:
            self.values[f.name].append(f.read(src))
        if g.energy_joules is not None:
            if self.energy_first is None:
                self.energy_first = g.energy_joules
            self.energy_last = g.energy_joules

    def result(self) -> GpuRecording:
        energy = None
        if self.energy_first is not None and self.energy_last is not None and self.energy_last >= self.energy_first:
            energy = self.energy_last - self.energy_first  # a counter that went backwards (driver reload): None
        s = {k: Series(tuple(v)) for k, v in self.values.items()}
        return GpuRecording(index=self.number, uuid=self.uuid, name=self.name, **s, energy_joules=energy,
                            lost=self.lost_at is not None, lost_at_seconds=self.lost_at, lost_reason=self.lost_reason)


class Recorder:
    """Collects samples (thread-safe) and aggregates them into a :class:`Recording`."""

    def __init__(self, only: Iterable[int] | None = None) -> None:
        self._lock = threading.Lock()
        self.only = None if only is None else set(only)
        self.times: list[float] = []
        self._tracks: dict[tuple[str, str], _Track] = {}

    def add(self, snap: Snapshot, t: float) -> None:
        """One sample taken ``t`` seconds after the start."""
        with self._lock:
            n = len(self.times)
            seen: set[tuple[str, str]] = set()
            for number, backend, g in numbered(snap):
                key = (backend, g.uuid)
                track = self._tracks.get(key)
                if track is None:
                    if self.only is not None and number not in self.only:
                        continue
                    used = {tr.number for tr in self._tracks.values()}
                    if number in used:  # a new GPU took a lost one's index: keep both apart
                        number = max(used) + 1
                    track = self._tracks[key] = _Track(number, g.uuid, g.name, n)
                track.name = g.name or track.name
                track.add(g, t)
                seen.add(key)
            for key, track in self._tracks.items():
                if key not in seen:
                    track.add(None, t)
            self.times.append(t)

    def numbers(self) -> list[int]:
        with self._lock:
            return sorted(tr.number for tr in self._tracks.values())

    def latest(self) -> list[tuple[int, float | None, float | None]]:
        """(index, utilisation ratio, power W) of each GPU at the last sample."""
        with self._lock:
            return [(tr.number, tr.values["utilization_ratio"][-1], tr.values["power_watts"][-1])
                    for tr in sorted(self._tracks.values(), key=lambda tr: tr.number) if self.times]

    def result(self, started: float, duration: float, interval: float, command: Sequence[str] = (),
               exit_code: int | None = None) -> Recording:
        with self._lock:
            gpus = {tr.number: tr.result() for tr in self._tracks.values()}
            return Recording(started=started, duration_seconds=duration, interval_seconds=interval,
                             timestamps=tuple(self.times), gpus=gpus, command=tuple(command), exit_code=exit_code)


def sample(engine: Engine, recorder: Recorder, t0: float) -> bool:
    """Take one sample into ``recorder``; False (and a warning) when the collection failed."""
    snap = engine.scrape()
    failed = [n for n, st in snap.stats.items() if not st.success]
    if failed:
        log.warning("sample skipped: collection failed for backend %s", ", ".join(failed))
        return False
    recorder.add(snap, time.monotonic() - t0)
    return True


def _indices(gpus: object) -> set[int] | None:
    if gpus is None:
        return None
    if isinstance(gpus, str | bytes) or not isinstance(gpus, Iterable):
        raise TypeError(f"gpus: expected a list of GPU indices or None, got {type(gpus).__name__}")
    out = set()
    for i in gpus:
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"gpus: expected GPU indices (integers), got {type(i).__name__} {_short(i)}")
        if i < 0:
            raise ValueError(f"gpus: expected GPU indices >= 0, got {i}")
        out.add(i)
    if not out:
        raise ValueError("gpus: expected at least one GPU index, or None for every GPU")
    return out


class Monitor:
    """Samples the GPUs every ``interval`` seconds on a background thread (``gpu-exporter record``
    in-process). Use it as a context manager, or call :meth:`start` and :meth:`stop`.

    ``gpus``: the indices to record (default every GPU). One sample is taken at :meth:`start`
    and one at :meth:`stop`, so even a short run has a first and a last reading.
    """

    def __init__(self, interval: float = 1.0, gpus: Iterable[int] | None = None, backend: str = "auto") -> None:
        self.interval = check_interval(interval)
        self.gpus = _indices(gpus)
        self._settings = settings_for(backend)
        self.recording: Recording | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._exit: contextlib.ExitStack | None = None
        self._engine: Engine | None = None
        self._recorder = Recorder(self.gpus)
        self._t0 = 0.0
        self._started = 0.0

    def start(self) -> Monitor:
        """Initialise the backend (shared), take the first sample, start sampling; returns ``self``."""
        with self._lock:
            if self._exit is not None or self.recording is not None:
                raise RuntimeError("this Monitor was already started; create a new one")
            with contextlib.ExitStack() as stack:
                engine = stack.enter_context(session(self._settings))
                self._engine = engine
                self._started, self._t0 = time.time(), time.monotonic()
                if not sample(engine, self._recorder, self._t0):
                    raise GpuUnavailable("the first collection failed (see the warning logged)")
                missing = sorted((self.gpus or set()) - set(self._recorder.numbers()))
                if missing:
                    have = ", ".join(map(str, self._all_indices(engine))) or "none"
                    raise ValueError(f"gpus: no GPU {', '.join(map(str, missing))} on this machine "
                                     f"(indices: {have})")
                self._exit = stack.pop_all()
            self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)
            self._thread.start()
        return self

    @staticmethod
    def _all_indices(engine: Engine) -> list[int]:
        return [n for n, _, _ in numbered(engine.scrape())]

    def _run(self) -> None:
        next_t = self._t0 + self.interval
        while not self._stop.wait(max(0.0, next_t - time.monotonic())):
            self._sample()
            next_t += self.interval
            if next_t <= time.monotonic():  # a slow collection: skip the missed ticks, keep the rhythm
                next_t = time.monotonic() + self.interval

    def _sample(self) -> None:
        assert self._engine is not None
        try:
            sample(self._engine, self._recorder, self._t0)
        except Exception as exc:  # the monitor keeps sampling whatever one collection does
            log.warning("sample failed: %s: %s", type(exc).__name__, exc)
            log.debug("sample failed", exc_info=True)

    def stop(self) -> Recording:
        """Stop sampling, take the last sample, release the backend; returns the :class:`Recording`
        (also kept in :attr:`recording`). Calling it again returns the same recording."""
        with self._lock:
            if self.recording is not None:
                return self.recording
            if self._exit is None or self._thread is None:
                raise RuntimeError("this Monitor was not started")
            self._stop.set()
            self._thread.join()
            try:
                self._sample()
                duration = time.monotonic() - self._t0
            finally:
                self._exit.close()
            self.recording = self._recorder.result(self._started, duration, self.interval)
            return self.recording

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


__all__ = ["Availability", "GpuStatus", "InsufficientGpus", "Monitor", "Recording", "Requirements",
           "check_availability", "estimate_requirements", "query_gpus", "select_gpus", "wait_for_availability"]
