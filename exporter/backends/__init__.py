"""Backend registry: every module in this package that defines ``BACKEND`` is a backend.

Adding a vendor means adding one file here with a ``BACKEND = MyBackend`` line and the
``families`` it fills (docs/extending.md). Everything else that names backends reads this
registry: ``--backend`` and its help, the start-up banners, the support table of
docs/metrics.md (:func:`support_table`, ``python -m exporter.backends --write-docs``) and the
JSON API's family list. Modules must import their vendor library lazily (inside ``init``) so
that discovery stays cheap.
"""

from __future__ import annotations

import functools
import importlib
import logging
import pkgutil
import re
import threading
import time
from pathlib import Path
from typing import NamedTuple

from exporter.backends.base import Backend, BackendUnavailable
from exporter.core import schema
from exporter.core.k8s_names import GpuResources, KubernetesNames
from exporter.core.lane import Job, Lane, LaneBusy
from exporter.core.options import BackendOptions, BackendSetting

log = logging.getLogger(__name__)
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
                unknown = sorted(n for n in (*cls.families, *cls.equivalents) if n not in schema.FAMILY_BY_NAME)
                if unknown:  # a typo would silently drop a column of the support table
                    raise ValueError(f"backend {cls.name!r} declares {schema.unknown_family_message(unknown[0])}")
                if cls.equivalents and not cls.tool:
                    raise ValueError(f"backend {cls.name!r} declares equivalents without the tool that shows them")
                cls.kubernetes.check(cls.name)
                for setting in cls.settings:
                    setting.check(cls.name)
                found[cls.name] = cls
        _registry = found
    return _registry


def names() -> list[str]:
    return sorted(registry())


def auto_order() -> list[str]:
    """Backends tried by ``--backend auto``, in order (never the simulated one)."""
    ranked = [(c.auto_priority, n) for n, c in registry().items() if c.auto_priority is not None]
    return [n for _, n in sorted(ranked)]


class HungInit:
    """A backend's init that has not returned within its deadline and still runs on :attr:`lane` as
    :attr:`job`: whoever keeps the backend adopts the lane (``Engine.adopt_init``); whoever gives it up
    calls :meth:`forsake`, so that a late init that succeeds does not leave a live library (and its
    XID watcher) behind."""

    def __init__(self, b: Backend) -> None:
        self.backend = b
        self.lane = Lane(f"collect-{b.name}", self._returned)
        self.job: Job = self.lane.submit(functools.partial(b.node_wide, "init", b.init), "init")
        self._lock = threading.Lock()
        self._forsaken = self._closed = False

    def _returned(self, what: str, seconds: float) -> None:  # on the lane, when the late init returns
        log.warning("backend %s: %s returned after %.1f s", self.backend.name, what, seconds)
        self._close_if_forsaken()

    def forsake(self) -> None:
        """Nobody will use the backend: shut it down once its init has returned (now, if it has)."""
        with self._lock:
            self._forsaken = True
        self._close_if_forsaken()

    def _close_if_forsaken(self) -> None:
        with self._lock:
            close = self._forsaken and self.job.finished and not self._closed
            self._closed = self._closed or close
        if close:
            self.lane.stop()
            try:
                self.backend.shutdown()
            except Exception:
                log.debug("shutdown of %s failed", self.backend.name, exc_info=True)


class Detected(NamedTuple):
    """What ``--backend auto`` found: the backend (None: none), why each one tried before it was skipped,
    and its init when that has not returned within the deadline."""

    backend: Backend | None
    reasons: list[str]
    hung_init: HungInit | None = None


def init_within(b: Backend, deadline: float) -> HungInit | None:
    """``b.init()`` on a lane of its own (exporter/core/lane.py), waited for at most ``deadline`` seconds, as
    one call about no GPU named ``init``: None when it returned, else the init still running (a wedged
    driver: the caller gives up waiting, and no second init goes behind it). Raises what init raised."""
    init = HungInit(b)
    end = time.monotonic() + deadline
    try:
        init.lane.wait(init.job, lambda: end - time.monotonic())
    except LaneBusy:
        return init
    finally:
        if init.job.finished:
            init.lane.stop()
    return None


def detect(options: BackendOptions, init_deadline: float) -> Detected:
    """``--backend auto``: the first real backend whose init() succeeds (initialised), or None.

    Each init is waited for at most ``init_deadline`` seconds (:func:`init_within`): a wedged driver
    must not wedge the start. An init still running then means that vendor's library is there and
    its driver does not answer: that backend is the one found, with its running init
    (:attr:`Detected.hung_init`), for the engine to publish stalled until it returns. The reasons
    say why each one tried before it was skipped ("nvml: libnvidia-ml.so.1 not found").
    """
    reasons: list[str] = []
    for name in auto_order():
        b = create(name, options)
        try:
            hung = init_within(b, init_deadline)
        except Exception as exc:  # noqa: BLE001 - every probe failure is a reason to report, not a crash
            reasons.append(f"{name}: {exc}" if isinstance(exc, BackendUnavailable)
                           else f"{name}: {type(exc).__name__}: {exc}")
            continue
        if hung is not None:
            reasons.append(f"{name}: init did not return within {init_deadline:g} s")
        return Detected(b, reasons, hung)
    return Detected(None, reasons)


def ordered() -> list[str]:
    """Backends in documentation order: those of ``--backend auto`` first, then the others by name."""
    auto = auto_order()
    return auto + [n for n in names() if n not in auto]


def supporters(family: str) -> list[str]:
    """Backends that fill ``family``, in documentation order."""
    return [n for n in ordered() if registry()[n].fills(family)]


def support_table() -> str:
    """Which backend fills which family (docs/metrics.md), from each backend's ``families``."""
    cols = ordered()
    rows = ["| family | " + " | ".join(cols) + " | when |", "|---|" + "---|" * len(cols) + "---|"]
    for f in schema.FAMILIES:
        if f.scope == "self":
            continue
        cells = " | ".join("yes" if registry()[b].fills(f.name) else "no" for b in cols)
        rows.append(f"| `{f.name}` | {cells} | {f.when or 'always'} |")
    return "\n".join(rows) + "\n"


DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def equivalents() -> dict[str, dict[str, str]]:
    """The backends' own tools' equivalents (``Backend.equivalents``): tool -> family -> what it shows."""
    out: dict[str, dict[str, str]] = {}
    for name in ordered():
        cls = registry()[name]
        if cls.equivalents:
            out.setdefault(cls.tool, {}).update(cls.equivalents)
    return out


def render_docs(text: str) -> str:
    """``text`` (docs/metrics.md) with its generated blocks replaced: the schema's families (a column per vendor
    tool, the backends' tools included) and the support table."""
    return schema.render_blocks(text, {"families": schema.markdown_table(equivalents()),
                                       "support-table": support_table()})


# Where the docs name the backends: inline spans ``<!-- backends:KIND -->...<!-- /backends -->`` that
# ``python -m exporter.backends --write-docs`` rewrites from the registry (KIND: auto, the --backend auto order;
# all, every backend; real, the real backends)
NAMED_IN = tuple(DOCS.parents[1] / name for name in ("README.md", "docs/alerts.md", "docs/cli.md",
                                                    "docs/python-api.md"))
_SPAN = re.compile(r"(<!-- backends:(auto|all|real) -->)(.*?)(<!-- /backends -->)", re.S)


def _listed(names: list[str], last: str) -> str:
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) < 2 else f"{', '.join(quoted[:-1])}{last}{quoted[-1]}"


def backend_list(kind: str) -> str:
    """The backends as the docs name them: ``auto`` in --backend auto order ("`a`, then `b`"), ``all`` every
    backend, ``real`` every backend but the simulated ones ("`a`, `b` or `c`")."""
    if kind == "auto":
        return ", then ".join(f"`{n}`" for n in auto_order())
    names = ordered() if kind == "all" else auto_order()
    return _listed(names, " or ")


EXAMPLE = DOCS.with_name("exporter.example.yaml")
_SETTINGS_BLOCK = re.compile(r"(# backend-settings:begin\n).*?(# backend-settings:end)", re.S)


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def render_example(text: str) -> str:
    """docs/exporter.example.yaml with its block of the backends' own settings rewritten: one commented line
    each, at its default (its example where it has none)."""
    lines = "".join(f"# {s.flag.removeprefix('--')}: {_shown(s.default if s.default is not None else s.example)}\n"
                    for s in settings())
    return _SETTINGS_BLOCK.sub(lambda m: m[1] + lines + m[2], text)


def runtime_label() -> str:
    """What the host's ``cuda_version`` is the version of: the real backends' ``runtime``, each once, in
    ``--backend auto`` order ("CUDA/ROCm")."""
    return "/".join(dict.fromkeys(r for r in (registry()[n].runtime for n in auto_order()) if r)) or "runtime"


def floors_table() -> str:
    """The README's "Supported versions (floors)": a row per real backend (``--backend auto`` order), its
    declared ``floor`` and ``below_floor``."""
    rows = ["| backend | floor | what happens below it |", "|---|---|---|"]
    for name in auto_order():
        cls = registry()[name]
        rows.append(f"| `{name}` | {cls.floor or 'not declared (Backend.floor)'} | {cls.below_floor or '-'} |")
    return "\n".join(rows) + "\n"


_FLOORS = "<!-- floors:begin -->"


def render_names(text: str) -> str:
    """``text`` with every inline span naming the backends rewritten from the registry, and its floors table
    (``<!-- floors:begin -->``, the README's) from the backends' declared floors."""
    text = _SPAN.sub(lambda m: m[1] + backend_list(m[2]) + m[4], text)
    return schema.render_blocks(text, {"floors": floors_table()}) if _FLOORS in text else text


def gpu_resources() -> GpuResources:
    """Every backend's Kubernetes names (device-plugin resources, index prefix, DRA drivers) by vendor, for
    the pod attribution. Backends of one vendor (amdsmi, rocm-smi) declare the same names."""
    by_vendor: dict[str, KubernetesNames] = {}
    owner: dict[str, str] = {}
    for name in ordered():
        cls = registry()[name]
        own = cls.kubernetes
        if not own.declared:
            continue
        if by_vendor.setdefault(cls.vendor, own) != own:  # which one would attribute the vendor's pods?
            raise ValueError(f"backends {owner[cls.vendor]!r} and {name!r} of vendor {cls.vendor!r} declare different "
                             "Kubernetes names; declare them once and share them")
        owner.setdefault(cls.vendor, name)
    return GpuResources(by_vendor)


def settings() -> list[BackendSetting]:
    """Every backend's own settings (``Backend.settings``), once each, in documentation order. Two backends
    may share a setting by declaring the same one; one name, flag or env variable declared twice differently
    is an error."""
    out: dict[str, tuple[str, BackendSetting]] = {}
    for name in ordered():
        for s in registry()[name].settings:
            for owner, other in out.values():
                clash = [k for k in ("name", "flag", "env") if getattr(s, k) is not None and getattr(s, k) ==
                         getattr(other, k)]
                if clash and s != other:
                    raise ValueError(f"backends {owner!r} and {name!r} declare different settings with the same "
                                     f"{clash[0]} {getattr(s, clash[0])!r}")
            out.setdefault(s.name, (name, s))
    return [s for _, s in out.values()]


def create(name: str, options: BackendOptions) -> Backend:
    try:
        cls = registry()[name]
    except KeyError:
        raise BackendUnavailable(f"unknown backend {name!r}; known: {', '.join(names())}") from None
    return cls(options)


__all__ = [
    "Backend",
    "BackendOptions",
    "BackendUnavailable",
    "Detected",
    "auto_order",
    "backend_list",
    "create",
    "detect",
    "equivalents",
    "floors_table",
    "gpu_resources",
    "init_within",
    "names",
    "ordered",
    "registry",
    "render_docs",
    "render_example",
    "render_names",
    "runtime_label",
    "settings",
    "support_table",
    "supporters",
]
