"""Backend registry: every module in this package that defines ``BACKEND`` is a backend.

Adding a vendor means adding one file here with a ``BACKEND = MyBackend`` line.
Modules must import their vendor library lazily (inside ``init``) so that
discovery stays cheap.
"""

from __future__ import annotations

import importlib
import pkgutil

from exporter.backends.base import Backend, BackendOptions, BackendUnavailable

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


def create(name: str, options: BackendOptions) -> Backend:
    try:
        cls = registry()[name]
    except KeyError:
        raise BackendUnavailable(f"unknown backend {name!r}; known: {', '.join(names())}") from None
    return cls(options)


__all__ = ["Backend", "BackendOptions", "BackendUnavailable", "auto_order", "create", "names", "registry"]
