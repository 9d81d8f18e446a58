"""gpu-exporter: vendor-neutral GPU telemetry for Kubernetes, and a Python API for benchmark
harnesses and autotuners (docs/python-api.md)::

    import exporter
    for gpu in exporter.query_gpus():
        print(gpu.index, gpu.name, gpu.memory_free_bytes, gpu.utilization_ratio)

The API lives in :mod:`exporter.python_api` and is loaded on first use, so that
``gpu-exporter serve`` (which imports this package) never loads it.
"""

from typing import TYPE_CHECKING

from exporter.core.version import VERSION

__version__ = VERSION

__all__ = [
    "Availability",
    "GpuStatus",
    "GpuUnavailable",
    "InsufficientGpus",
    "Monitor",
    "Recording",
    "Requirements",
    "check_availability",
    "estimate_requirements",
    "query_gpus",
    "select_gpus",
    "wait_for_availability",
]

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ below loads the same names
    from exporter.python_api import (
        Availability,
        GpuStatus,
        GpuUnavailable,
        InsufficientGpus,
        Monitor,
        Recording,
        Requirements,
        check_availability,
        estimate_requirements,
        query_gpus,
        select_gpus,
        wait_for_availability,
    )
else:

    def __getattr__(name: str) -> object:
        if name not in __all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from exporter import python_api

        value = getattr(python_api, name)
        globals()[name] = value  # loaded once; later lookups do not come here
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
