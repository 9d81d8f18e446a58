"""Backend registry: every module in this package that defines ``BACKEND`` is a backend.

Adding a vendor means adding one file here with a ``BACKEND = MyBackend`` line.
Modules must import their vendor library lazily (inside ``init``) so that
discovery stays cheap.
"""

from __future__ import annotations

import importlib
import pkgutil

from exporter.backends.base import Backend, BackendUnavailable
from exporter.core.options import BackendOptions

_registry: dict[str, type[Backend]] | None = None


def registry() -> dict[str, type[Backend]]:
    """Map of backend name -> class, discovered once."""
    global _registry
    if _registry is None:
        found: dict[str, type[Backend]] = {}
        for mod in pkgutil.iter_modules(__path__):
            if mod.name == "base" or mod.name.startswith("_"):
                continue
            module = importlib.import_module(f"{__name__}.{mod.name}")
            cls = getattr(module, "BACKEND", None)
            if cls is not None:
                found[cls.name] = cls
        _registry = found
    return _registry


def names() -> list[str]:
    return sorted(registry())


def auto_order() -> list[str]:
    """Backends tried by ``--backend auto``, in order (never the simulated one)."""
    ranked = [(c.auto_priority, n) for n, c in registry().items() if c.auto_priority is not None]
    return [n for _, n in sorted(ranked)]


def detect(options: BackendOptions) -> tuple[Backend | None, list[str]]:
    """``--backend auto``: the first real backend whose init() succeeds (initialised), or None.

    Also returns why each one tried before it was skipped ("nvml: libnvidia-ml.so.1 not found").
    """
    reasons: list[str] = []
    for name in auto_order():
        b = create(name, options)
        try:
            b.init()
        except Exception as exc:  # noqa: BLE001 - every probe failure is a reason to report, not a crash
            reasons.append(f"{name}: {exc}" if isinstance(exc, BackendUnavailable)
                           else f"{name}: {type(exc).__name__}: {exc}")
            continue
        return b, reasons
    return None, reasons


def create(name: str, options: BackendOptions) -> Backend:
    try:
        cls = registry()[name]
    except KeyError:
        raise BackendUnavailable(f"unknown backend {name!r}; known: {', '.join(names())}") from None
    return cls(options)


__all__ = ["Backend", "BackendOptions", "BackendUnavailable", "auto_order", "create", "detect", "names", "registry"]
