"""The Python API for benchmark harnesses and autotuners (``import exporter``; docs/python-api.md).

Every function reads the GPUs through the exporter's own backends and
:class:`~exporter.core.engine.Engine`, as ``/metrics`` does, and the CLI tools ``snapshot``,
``record`` and ``pick`` are thin layers over this package: scoring, selection and aggregation
exist once, here. Its modules: ``checks`` (argument checks), ``sessions`` (one shared backend
initialisation), ``status`` (``GpuStatus``, ``query_gpus``), ``selection`` (choosing GPUs),
``requirements`` (GPUs a parallel run needs), ``recording`` (``Monitor``, ``Recording``) and
``rows`` (classes made from the GPU field table).

Units are SI (bytes, ratio 0-1, celsius, watts, joules, seconds). A reading that cannot be
taken is ``None``, never 0. Bad arguments raise :class:`ValueError` or :class:`TypeError` with
a one-line message; a GPU backend that cannot be used raises :class:`GpuUnavailable` (a
:class:`RuntimeError`).

Thread safety: callers that use the same backend at the same time (two :class:`Monitor`
objects, concurrent :func:`query_gpus` calls) share one backend initialisation and one
collection thread; the backend is shut down when the last of them is done.
"""

from exporter.python_api.recording import GpuRecording, Monitor, Recording, Series
from exporter.python_api.requirements import Requirements, estimate_requirements
from exporter.python_api.selection import (
    Availability,
    InsufficientGpus,
    check_availability,
    select_gpus,
    wait_for_availability,
)
from exporter.python_api.sessions import GpuUnavailable
from exporter.python_api.status import GpuStatus, query_gpus

__all__ = ["Availability", "GpuRecording", "GpuStatus", "GpuUnavailable", "InsufficientGpus", "Monitor", "Recording",
           "Requirements", "Series", "check_availability", "estimate_requirements", "query_gpus", "select_gpus",
           "wait_for_availability"]
