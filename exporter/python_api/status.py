"""The state of each GPU now: :class:`GpuStatus` (the field table's ``status`` rows, the index across
backends and the score) and :func:`query_gpus`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exporter.core.readings import GpuReading
from exporter.core.snapshot import Snapshot
from exporter.core.views import FIELDS, Field, GpuSource, numbered, status_values
from exporter.python_api.checks import settings_for
from exporter.python_api.rows import rows_dataclass
from exporter.python_api.sessions import read, session

FREE_WEIGHT, IDLE_WEIGHT = 0.6, 0.4  # score = 0.6 x free-memory fraction + 0.4 x (1 - utilisation)


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
