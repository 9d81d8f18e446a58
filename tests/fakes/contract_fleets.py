"""One two-GPU fleet per backend, each served by the real exporter process (for the contract test).

The backends are the exporter's registry (``exporter.backends``), so a new backend is contract-tested with
no edit here; its fleet, when it needs a fake vendor library, is its own module in tests/fakes/fleets/.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from collections.abc import Callable, Iterator
from pathlib import Path

from exporter import backends
from tests.fakes import fleets as fleets_package
from tests.harness.exporter import ExporterProcess

Start = Callable[[Path, list[str]], ExporterProcess]


def fleets() -> dict[str, Start]:
    """Backend name -> how to start the exporter on its fleet, from the modules of tests/fakes/fleets/."""
    found: dict[str, Start] = {}
    for mod in pkgutil.iter_modules(fleets_package.__path__):
        module = importlib.import_module(f"{fleets_package.__name__}.{mod.name}")
        if module.BACKEND not in backends.registry():
            raise ValueError(f"tests/fakes/fleets/{mod.name}.py: no backend named {module.BACKEND!r}")
        found[module.BACKEND] = module.start
    return found


def fleet_env(backend: str, tmp: Path) -> dict[str, str] | None:
    """The environment in which ``backend`` finds its two-GPU fleet (its fleet module's ``env``, for a user of the
    Python API, which takes no flags); None when it has none (it needs no library, as ``simulated``)."""
    for mod in pkgutil.iter_modules(fleets_package.__path__):
        module = importlib.import_module(f"{fleets_package.__name__}.{mod.name}")
        if backend == module.BACKEND and hasattr(module, "env"):
            tmp.mkdir(parents=True, exist_ok=True)
            environment: dict[str, str] = module.env(tmp)
            return environment
    return None


BACKENDS = tuple(backends.ordered())
# where ``python -m exporter`` finds the package these backends came from (a test's copy of it, or this checkout)
PACKAGE_ROOT = Path(backends.__file__).resolve().parents[2]


@contextlib.contextmanager
def exporter_for(backend: str, tmp: Path, *args: str) -> Iterator[ExporterProcess]:
    """A running exporter reading a two-GPU fleet through ``backend`` (``args``: more flags)."""
    if backend not in backends.registry():
        raise ValueError(backend)
    tmp.mkdir(parents=True, exist_ok=True)
    common = ["--cache-ttl", "0", "--collection-timeout", "30", "--sysfs-root", str(tmp / "sys"), *args]
    start = fleets().get(backend)
    ex = start(tmp, common) if start else ExporterProcess(["--backend", backend, *common], cwd=PACKAGE_ROOT)
    with ex:
        yield ex
