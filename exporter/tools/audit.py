"""The single-machine tools' common layer (``snapshot``, ``record``, ``pick``, ``diff``): one-line
errors, safe file writes, the backend flags, one-shot readings, the audit that ``snapshot`` takes
and the rule that ``diff`` applies to two of them.

The audit is the ``/stats`` view of :mod:`exporter.core.views` (the JSON API serves the same
view), and every reading goes through the exporter's own :class:`~exporter.core.engine.Engine`
and backends, so ``/metrics``, ``/stats``, ``snapshot``, ``record`` and ``pick`` always agree.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import math
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from exporter.core.engine import Engine
from exporter.core.fields import Field, Rise
from exporter.core.options import Settings
from exporter.core.snapshot import Snapshot
from exporter.core.views import FIELDS, PowerTracker, format_bytes, stats_view
from exporter.platform.errors import ConfigError, one_line
from exporter.python_api import sessions

log = logging.getLogger(__name__)
T = TypeVar("T")


def check_writable(path: str) -> None:
    """Fail now, not after the benchmark, when ``path`` cannot be written (ConfigError naming it, exit 2).

    A regular or new file is written by :func:`write_file` as a temporary file in its directory,
    so one is created and removed here; anything else (``/dev/stdout``, a FIFO) must be writable.
    """
    target = os.path.realpath(path)
    try:
        try:
            st: os.stat_result | None = os.stat(target)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        if st is not None and not stat.S_ISREG(st.st_mode):
            if not os.access(target, os.W_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            return
        fd, tmp = _create_temp(os.path.dirname(target), os.path.basename(target))
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}", code=2) from None


def write_file(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all; raises ConfigError naming the file.

    A regular file (or a new one) is written as a temporary file in the same directory and
    renamed over ``path`` (``os.replace``), so a full disk or a crash never leaves a truncated
    file; the temporary file is removed on error. A symbolic link is followed (its target is
    replaced, the link kept). Anything else that exists (``/dev/stdout``, ``/dev/full``, a
    FIFO, a directory) is opened and written directly: renaming over it would replace it.
    """
    target = os.path.realpath(path)
    tmp: str | None = None
    try:
        try:
            st: os.stat_result | None = os.stat(target)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            with open(target, "w", encoding="utf-8") as f:
                f.write(text)
            return
        fd, tmp = _create_temp(os.path.dirname(target), os.path.basename(target))
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if st is not None:
                os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode))  # replacing a file keeps its permissions
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the name points at it
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}", code=1) from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass  # the write error raised above is what the user needs


def _create_temp(directory: str, base: str) -> tuple[int, str]:
    """A new file ``.<base>.<random>.tmp`` in ``directory``: (descriptor, path).

    Created with mode 0666 so the umask applies as it would to the file itself
    (tempfile.mkstemp would make it 0600).
    """
    for _ in range(100):
        name = os.path.join(directory, f".{base}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", directory)


# --- the CLI side: flags, backends, one reading ------------------------------------------------------


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    """The flags every tool shares with ``serve`` (environment and ``--config`` work the same)."""
    g = p.add_argument_group("backend (as for gpu-exporter serve)")
    from exporter import backends  # the registry imports only light modules

    g.add_argument("--backend", default=None,
                   help=f"auto | {' | '.join(backends.ordered())}, or a comma list (default auto; "
                        "env EXPORTER_BACKEND). auto never falls back to simulated")
    g.add_argument("--simulated-gpus", default=None, help="GPU count of --backend simulated (default 4)")
    g.add_argument("--config", dest="config_file", default=None, help="the exporter's YAML config file")


def setup_logging() -> None:
    """Warnings from the backends go to stderr; stdout stays clean for JSON and indices."""
    from exporter.core import logs

    logs.setup("warning", "text")


def settings_from(args: argparse.Namespace) -> Settings:
    """The tool's settings: its backend flags over the environment and ``--config``, as for ``serve``."""
    from exporter.serve import config

    argv: list[str] = []
    for flag, value in (("--backend", args.backend), ("--simulated-gpus", args.simulated_gpus),
                        ("--config", args.config_file)):
        if value is not None:
            argv.append(f"{flag}={value}")  # "=": a value starting with "-" is a value, not a flag
    return config.load(argv)


@contextlib.contextmanager
def open_session(args: argparse.Namespace) -> Iterator[Engine]:
    """The backends of ``args``, initialised now and shared as the Python API shares them
    (:func:`exporter.python_api.sessions.session`); a failure is a :class:`ConfigError`."""
    settings = settings_from(args)
    with contextlib.ExitStack() as stack:
        try:
            engine = stack.enter_context(sessions.session(settings))
        except sessions.GpuUnavailable as exc:
            raise ConfigError(str(exc).replace("use backend 'simulated'", "pass --backend simulated"),
                              code=1) from None
        try:
            yield engine
        except sessions.GpuUnavailable as exc:  # a collection failed while the tool was using the engine
            raise ConfigError(str(exc).replace("see the warning logged", "see the warning above"),
                              code=1) from None


def read(engine: Engine) -> Snapshot:
    """One fresh collection from every backend; a failed backend is an error, not missing GPUs."""
    try:
        return sessions.read(engine)
    except sessions.GpuUnavailable as exc:
        raise ConfigError(str(exc).replace("see the warning logged", "see the warning above"),
                          code=1) from None


def checked(check: Callable[[], T], flag: str) -> T:
    """Run an argument check of the Python API; its ValueError/TypeError becomes a usage error naming ``flag``."""
    try:
        return check()
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{flag}: {str(exc).split(': ', 1)[-1]}", code=2) from None


def take_audit(engine: Engine, window: float, tracker: PowerTracker | None = None) -> dict[str, Any]:
    """The ``/stats`` view from two readings ``window`` seconds apart (for the average power)."""
    tracker = tracker or PowerTracker()
    snap = read(engine)
    power = tracker.observe(snap)
    if window > 0:
        time.sleep(window)  # the average power needs an interval; this is its length
        snap = read(engine)
        power = tracker.observe(snap)
    return stats_view(snap, power)


# --- the audit rule ---------------------------------------------------------------------------------

HOST_FIXED = ("node_name", "processor", "kernel", "driver_version", "cuda_version")
# the /stats keys of the field table's rows whose rule is "fixed" (exporter/core/schema.py): identity, memory
# total, PCIe links ...
GPU_FIXED = tuple(f.stats_key for f in FIELDS if f.diff == "fixed" and f.stats_key)
# the fields whose rule is "rise" (memory in use, power), each with its limit: their rows say how much
RISES: tuple[Field, ...] = tuple(f for f in FIELDS if f.diff == "rise" and f.rise and f.stats_key)
IGNORABLE = (*(f"host.{f}" for f in HOST_FIXED), *GPU_FIXED, "p2p", *(f.rise.check for f in RISES if f.rise))


def rise_of(f: Field) -> Rise:
    assert f.rise is not None  # RISES holds only fields with one
    return f.rise


#: how much each "rise" check allows, by check name (``memory``, ``power``); a check not given has its row's
#: limit
Limits = dict[str, float]


# unit symbols in diff's report of a rise
UNIT_SYMBOLS = {"watts": "W", "celsius": "°C", "hertz": "Hz", "seconds": "s", "joules": "J", "ratio": ""}


def get_dotted(d: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = d
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    return cur


def _show(v: Any) -> str:
    """A value from a snapshot file, as one short line (a file must not forge output lines)."""
    if v is None:
        return "null (not reported)"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    text = one_line(str(v))
    return text if len(text) <= 80 else text[:77] + "..."


def _risen(f: Field, g: Mapping[str, Any], other: Mapping[str, Any]) -> tuple[Any, str]:
    """A "rise" field's value and what it is called: the field when both audits have it, else the field
    its rule names ``instead`` (the instantaneous power for the average), else the field."""
    rise, key = rise_of(f), f.stats_key or f.name
    if rise.instead and (get_dotted(g, key) is None or get_dotted(other, key) is None):
        return get_dotted(g, rise.instead), rise.instead_what or rise.instead
    return get_dotted(g, key), rise.what


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _index(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31


# the /stats keys diff subtracts (the "rise" fields and those they fall back to): numbers or null in a file
RISE_KEYS = tuple(dict.fromkeys(k for f in RISES for k in (rise_of(f).instead, f.stats_key) if k))


def check_audit(doc: Any, name: str) -> dict[str, Any]:
    """A loaded snapshot file whose every field ``diff`` reads has the right type, else a
    ConfigError (exit 2) naming the file and the first bad field."""

    def bad(where: str, expected: str) -> NoReturn:
        raise ConfigError(f"{name}: not a gpu-exporter snapshot ({where}: expected {expected}; write one with: "
                        "gpu-exporter snapshot --json -o FILE)", code=2)

    if not isinstance(doc, dict):
        bad("top level", "a JSON object")
    if not isinstance(doc.get("host"), dict):
        bad("host", "an object")
    if not isinstance(doc.get("gpus"), list):
        bad("gpus", "a list")
    for i, g in enumerate(doc["gpus"]):
        if not isinstance(g, dict):
            bad(f"gpus[{i}]", "an object")
        if not _index(g.get("index")):
            bad(f"gpus[{i}].index", "an integer >= 0")
        if not isinstance(g.get("backend", ""), str):
            bad(f"gpus[{i}].backend", "a string")
        for f in RISE_KEYS:
            if g.get(f) is not None and not _number(g[f]):
                bad(f"gpus[{i}].{f}", "a finite number or null")
    p2p = doc.get("p2p", [])
    if not isinstance(p2p, list):
        bad("p2p", "a list")
    for i, p in enumerate(p2p):
        if not isinstance(p, dict):
            bad(f"p2p[{i}]", "an object")
        for f in ("gpu", "peer"):
            if not _index(p.get(f)):
                bad(f"p2p[{i}].{f}", "an integer >= 0")
        if not isinstance(p.get("backend", ""), str):
            bad(f"p2p[{i}].backend", "a string")
        if p.get("p2p") is not None and not isinstance(p["p2p"], dict):
            bad(f"p2p[{i}].p2p", "an object or null")
    return doc


def diff_audits(before: Mapping[str, Any], after: Mapping[str, Any], limits: Limits,
                ignore: Sequence[str] = ()) -> list[str]:
    """What changed between two audits, one line each; empty when the system is the same.

    Fields that must not change during a run (GPU models, PCIe links, P2P, processor, driver)
    must be identical; the "rise" fields (memory in use, power) must not have risen beyond ``limits``
    (by check name; a check not in it has its row's limit).
    """
    skip = set(ignore)
    out: list[str] = []
    for f in HOST_FIXED:
        a, b = before["host"].get(f), after["host"].get(f)
        if f"host.{f}" not in skip and a != b:
            out.append(f"host: {f} changed: {_show(a)} -> {_show(b)}")

    def key(g: Mapping[str, Any]) -> tuple[str, int]:
        return (str(g.get("backend", "")), int(g["index"]))

    old = {key(g): g for g in before["gpus"]}
    new = {key(g): g for g in after["gpus"]}
    several = len({k[0] for k in (*old, *new)}) > 1

    def label(k: tuple[str, int]) -> str:
        return f"{k[0]} gpu {k[1]}" if several else f"gpu {k[1]}"

    for k in sorted(old.keys() - new.keys()):
        out.append(f"{label(k)}: missing after the run (was {old[k].get('name')} {old[k].get('uuid')})")
    for k in sorted(new.keys() - old.keys()):
        out.append(f"{label(k)}: new after the run ({new[k].get('name')} {new[k].get('uuid')})")
    for k in sorted(old.keys() & new.keys()):
        a, b = old[k], new[k]
        for f in GPU_FIXED:
            va, vb = get_dotted(a, f), get_dotted(b, f)
            if f not in skip and va != vb:
                out.append(f"{label(k)}: {f} changed: {_show(va)} -> {_show(vb)} (must not change)")
        for rf in RISES:
            rise = rise_of(rf)
            (va, what), (vb, _) = _risen(rf, a, b), _risen(rf, b, a)
            limit = limits.get(rise.check, rise.limit)
            if rise.check not in skip and va is not None and vb is not None and vb - va > limit:
                out.append(f"{label(k)}: {what} rose by {_rise_text(rf.unit or '', va, vb, limit)}: a foreign load?")
    if "p2p" not in skip:
        out.extend(_diff_p2p(before.get("p2p", []), after.get("p2p", []), several))
    return list(dict.fromkeys(out))  # a symmetric P2P change is reported once


def _rise_text(unit: str, va: float, vb: float, limit: float) -> str:
    """``512.0 MiB (1.0 GiB -> 1.5 GiB; limit 256.0 MiB)``, ``45.0 W (100.0 -> 145.0 W; limit 30 W)``."""
    if unit == "bytes":
        return f"{format_bytes(vb - va)} ({format_bytes(va)} -> {format_bytes(vb)}; limit {format_bytes(limit)})"
    symbol = UNIT_SYMBOLS.get(unit, unit)
    return f"{vb - va:.1f} {symbol} ({va:.1f} -> {vb:.1f} {symbol}; limit {limit:g} {symbol})".replace("  ", " ")


def _diff_p2p(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]],
              several: bool) -> list[str]:
    def key(p: Mapping[str, Any]) -> tuple[str, int, int]:
        return (str(p.get("backend", "")), int(p["gpu"]), int(p["peer"]))

    old = {key(p): p for p in before}
    new = {key(p): p for p in after}
    out: list[str] = []
    for k in sorted(old.keys() | new.keys()):
        lo, hi = sorted(k[1:])
        where = f"p2p {k[0] + ' ' if several else ''}gpu {lo} <-> {hi}"
        a, b = old.get(k), new.get(k)
        if a is None or b is None:
            out.append(f"{where}: {'appeared' if a is None else 'disappeared'}")
            continue
        if a.get("topology_level") != b.get("topology_level"):
            out.append(f"{where}: topology_level changed: {_show(a.get('topology_level'))} -> "
                       f"{_show(b.get('topology_level'))}")
        pa, pb = a.get("p2p") or {}, b.get("p2p") or {}
        for cap in sorted(set(pa) | set(pb)):
            if pa.get(cap) != pb.get(cap):
                out.append(f"{where}: {cap} changed: {_show(pa.get(cap))} -> {_show(pb.get(cap))}")
    return out
