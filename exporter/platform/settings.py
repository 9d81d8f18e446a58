"""The one settings loader of every daemon: a table of :class:`~exporter.core.options.Setting` rows in,
checked values out.

Precedence, the same for ``serve`` and ``profile``: the row's default < the YAML file (``--config FILE``
or its env variable) < the environment (the row's ``env``, then its older ``twins``; an empty value
is unset) < the command line. A YAML key is the row's name or its flag's spelling (``window``,
``web.config.file``, ``dry-run``); a mapping nests (``fields: {include: [...]}`` is ``fields_include``).
Every value, whatever its source, goes through its kind's parser, so every setting has one meaning
and one set of checks; a bad one is a :class:`~exporter.platform.errors.ConfigError`, one line:
``invalid <name> (<flag, env variable or config file>) = <value>: <what is allowed>``, exit status 2.
``--check-config`` is the command's: it validates everything and prints what it would run with.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from exporter.core.options import Setting
from exporter.platform import units
from exporter.platform.configfile import read_yaml
from exporter.platform.errors import ConfigError, shown_value


class OneLineParser(argparse.ArgumentParser):
    """argparse for every command: a usage error is one line, ``<message> (see <prog> --help)``, raised as a
    :class:`ConfigError` (the command prints ``<prog>: error: ...`` and exits 2), never a usage dump."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see {self.prog} --help)")


# --- the parsers of the kinds: (raw value) -> typed value, or ValueError(what is allowed) ---------------

_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _integer(lo: float, hi: float) -> Callable[[object], int]:
    low, high = int(lo), int(min(hi, 2**63))
    allowed = f"expected an integer in {low}..{high}"

    def parse(v: object) -> int:
        if isinstance(v, bool):
            raise ValueError(allowed)
        s = str(v).strip()
        # ASCII digits only, and few of them: int() would also take "1_000", "٣" and 5,000-digit strings
        if not isinstance(v, int) and not re.fullmatch(r"[+-]?[0-9]{1,18}", s):
            raise ValueError(allowed)
        n = v if isinstance(v, int) else int(s)
        if not low <= n <= high:
            raise ValueError(allowed)
        return n

    return parse


def _number(v: object, allowed: str) -> float:
    s = str(v).strip().lower()
    if isinstance(v, bool) or not _DECIMAL.fullmatch(s):  # float() would also take "nan", "inf", "1_0", "٣"
        raise ValueError(allowed)
    return float(s)


def _seconds(lo: float, hi: float) -> Callable[[object], float]:
    allowed = f"expected a duration in {lo:g}..{hi:g} seconds (e.g. 10, 0.5, 30s, 5m, 1h)"

    def parse(v: object) -> float:
        if isinstance(v, bool):
            raise ValueError(allowed)
        try:
            x = units.parse_duration(str(v).strip().lower())  # the one duration parser: 1h30m, 250ms, seconds
        except ValueError:
            x = _number(v, allowed)  # a signed or exponent number: refused by the range below unless in it
        if not lo <= x <= hi:  # also rejects an overflow to inf
            raise ValueError(allowed)
        return x

    return parse


def _ratio(lo: float, hi: float) -> Callable[[object], float]:
    allowed = f"expected a ratio greater than {lo:g} and at most {hi:g} (0.3 means 30%)"

    def parse(v: object) -> float:
        x = _number(v, allowed)
        if not lo < x <= hi:
            raise ValueError(allowed)
        return x

    return parse


def _size(lo: float, hi: float) -> Callable[[object], int]:
    def parse(v: object) -> int:
        if isinstance(v, bool):
            raise ValueError(f"expected a size, {units.SIZE_EXAMPLES}")
        n = units.parse_size(str(v))  # the one size parser (Kubernetes quantity rules)
        if not lo <= n <= hi:
            raise ValueError(f"expected a size in {lo:.0f}..{hi:.0f} bytes ({units.SIZE_EXAMPLES})")
        return n

    return parse


def parse_bool(v: object) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in _TRUE or s in _FALSE:
        return s in _TRUE
    raise ValueError("expected true or false (on or off, yes or no, 1 or 0)")


def _choice(options: Sequence[str], aliases: Mapping[str, str]) -> Callable[[object], str]:
    def parse(v: object) -> str:
        s = str(v).strip().lower()
        s = aliases.get(s, s)
        if s not in options:
            raise ValueError(f"expected one of: {', '.join(options)}")
        return s

    return parse


def _path(v: object) -> str:
    s = str(v).strip()
    if not s:
        raise ValueError("expected a file path")
    return s


def _file(v: object) -> str:
    s = _path(v)
    if not os.path.isfile(s):
        raise ValueError("no such file")
    return s


def _text(v: object) -> str:
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        raise ValueError("expected a string or a number")
    s = str(v).strip()
    if not s or not s.isprintable():
        raise ValueError("expected one line of text")
    return s


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
LOG_LEVELS = ("debug", "info", "warning", "error")


def parse_address(v: object) -> str:
    """A listen address: an IP address (normalised) or a host name."""
    import ipaddress

    s = str(v).strip()
    allowed = "expected an IP address or host name, e.g. 0.0.0.0, :: or 127.0.0.1"
    if ":" in s or re.fullmatch(r"[0-9.]+", s):  # looks like an IP address: it must be one (not 999.1.1.1)
        try:
            return str(ipaddress.ip_address(s))
        except ValueError:
            raise ValueError(allowed) from None
    if len(s) > 253 or not all(_HOST_LABEL.fullmatch(x) for x in s.removesuffix(".").split(".")):
        raise ValueError(allowed)
    return s


def parser_of(row: Setting) -> Callable[[object], Any]:
    """The parser of ``row``'s kind, with its range or choices."""
    if row.kind == "custom" and row.parse is not None:
        return row.parse
    return {
        "path": lambda: _path,
        "file": lambda: _file,
        "seconds": lambda: _seconds(row.low, row.high),
        "integer": lambda: _integer(row.low, row.high),
        "ratio": lambda: _ratio(row.low, row.high if row.high != math.inf else 1.0),
        "bool": lambda: parse_bool,
        "size": lambda: _size(row.low, row.high),
        "choice": lambda: _choice(row.choices, dict(row.aliases)),
        "text": lambda: _text,
    }[row.kind]()


# --- the loader ----------------------------------------------------------------------------------


def check_unique(rows: Sequence[Setting]) -> None:
    """Each name, flag and env variable belongs to one row (a backend's setting needs its own)."""
    for key in ("name", "flag", "env"):
        values = [getattr(s, key) for s in rows if getattr(s, key)]
        twice = next((v for v in values if values.count(v) > 1), None)
        if twice is not None:
            raise ValueError(f"two settings have the {key} {twice!r}: a backend's setting needs its own")


def shown_default(row: Setting) -> str:
    d = row.default
    if row.kind == "seconds" and isinstance(d, int | float):
        return units.format_duration(d)
    if row.kind == "size" and isinstance(d, int) and d > 0:
        for suffix, f in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
            if d % f == 0:
                return f"{d // f}{suffix}"
    if isinstance(d, bool):
        return "true" if d else "false"
    if isinstance(d, list | tuple):
        return ",".join(map(str, d)) or "none"
    return f"{d:g}" if isinstance(d, float) else str(d)


def help_of(row: Setting) -> str:
    env = [e for e in (row.env, *row.twins) if e]
    text = row.help
    if row.default is not None and "default" not in text:
        text += f" (default {shown_default(row)})"
    if env:
        text += f" (env {' or '.join(env)})"
    return text.replace("%", "%%")


def build_parser(rows: Sequence[Setting], prog: str, description: str, config_env: str,
                 groups: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """argparse for ``rows``: ``--config``, ``--check-config`` and one flag per row (a bool row's flag
    alone means true). ``groups``: row name -> the --help heading it starts."""
    p = OneLineParser(prog=prog, description=description)
    p.add_argument("--config", dest="config_file", metavar="FILE", default=None,
                   help=f"YAML file of settings, keyed by setting or flag name (env {config_env}); "
                        "precedence: default < file < environment < flag")
    p.add_argument("--check-config", action="store_true", help="validate the settings, print them, exit")
    group: Any = p
    for row in rows:
        if groups and row.name in groups:
            group = p.add_argument_group(groups[row.name])
        if row.kind == "bool":
            group.add_argument(row.flag, dest=row.name, nargs="?", const="true", default=None, metavar="true|false",
                               help=help_of(row) + "; a bare flag means true")
        elif row.repeat:
            group.add_argument(row.flag, dest=row.name, action="append", default=None, help=help_of(row))
        else:
            group.add_argument(row.flag, dest=row.name, default=None, help=help_of(row))
    return p


@dataclass
class Loaded:
    """What the loader found: every row's value by name (its default when unset), and where each came from."""

    values: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)  # name -> "default", "config", "env", "flag"
    given: dict[str, tuple[str, Any]] = field(default_factory=dict)  # name -> (where, the value as written)
    config_file: str | None = None
    check_config: bool = False


def _flatten(doc: Mapping[Any, Any], rows: Sequence[Setting], path: str,
             nests: Sequence[str]) -> dict[str, tuple[str, Any]]:
    """A config file's keys -> {row name: (the key as written, value)}. A key is a row's name or its flag's
    spelling; a key of ``nests`` holds a mapping of the rest (``fields: {include: [...]}``); null is unset."""
    by_key = {r.name: r for r in rows}
    out: dict[str, tuple[str, Any]] = {}
    for key, value in doc.items():
        k = str(key).replace("-", "_").replace(".", "_")  # the flag's spelling works too (web.config.file)
        if k in nests:
            subs = sorted(n[len(k) + 1:] for n in by_key if n.startswith(k + "_"))
            if not isinstance(value, dict | None):
                raise ConfigError(f"config file {path}: {key} must be a mapping with {' and/or '.join(subs)} "
                                  f"({key}: {{{': [...], '.join(subs)}: [...]}}), not {type(value).__name__}")
            for sub, v in (value or {}).items():
                if f"{k}_{sub}" not in by_key:
                    raise ConfigError(f"config file {path}: unknown key {key}.{sub}: expected {', '.join(subs)}")
                if v is not None:
                    out[f"{k}_{sub}"] = (f"{key}.{sub}", v)
            continue
        if k not in by_key:
            # every key a file takes, spelt as the flags (docs/exporter.example.yaml); underscores work too
            keys = sorted({r.flag.removeprefix("--") for r in rows} | set(nests))
            near = difflib.get_close_matches(str(key), keys, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise ConfigError(f"config file {path}: unknown setting {shown_value(key)}{hint}; known: {', '.join(keys)}")
        if value is not None:
            out[k] = (str(key), value)
    return out


def load(rows: Sequence[Setting], argv: Sequence[str], parser: argparse.ArgumentParser, config_env: str,
         environ: Mapping[str, str] | None = None, nests: Sequence[str] = ()) -> Loaded:
    """The values of ``rows`` from their defaults, the YAML file, the environment and ``argv`` (parsed by
    ``parser``, from :func:`build_parser`); ConfigError (one line) for anything bad. ``nests``: YAML keys that
    hold a mapping of settings named ``<key>_<sub>``."""
    env = os.environ if environ is None else environ
    ns = parser.parse_args(list(argv))
    by_name = {r.name: r for r in rows}
    out = Loaded({r.name: r.default for r in rows}, {r.name: "default" for r in rows},
                 check_config=bool(ns.check_config))
    out.config_file = ns.config_file or env.get(config_env) or None
    layers: list[tuple[str, dict[str, tuple[str, Any]]]] = []
    if out.config_file:
        doc = read_yaml(out.config_file, "config file")
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise ConfigError(f"config file {out.config_file}: expected a mapping of settings at the top level")
        layers.append(("config", _flatten(doc, rows, out.config_file, nests)))
    from_env: dict[str, tuple[str, Any]] = {}
    for r in rows:
        name = next((e for e in (r.env, *r.twins) if e and env.get(e, "") != ""), None)
        if name is not None:
            from_env[r.name] = (name, env[name])
    layers.append(("env", from_env))
    layers.append(("flag", {r.name: (r.flag, getattr(ns, r.name)) for r in rows if getattr(ns, r.name) is not None}))
    for source, values in layers:
        for name, (where, raw) in values.items():
            row = by_name[name]
            shown = f"config {out.config_file}" if source == "config" else where
            out.values[name] = _parse(row, raw, shown, source)
            out.sources[name] = source
            out.given[name] = (shown, raw)
    return out


def invalid(loaded: Loaded, name: str, allowed: str) -> ConfigError:
    """The one-line error of a value that its own check passed but the command's cross-check refuses."""
    where, raw = loaded.given.get(name, ("default", loaded.values.get(name)))
    return ConfigError(f"invalid {name} ({where}) = {shown_value(raw)}: {allowed}")


def _parse(row: Setting, raw: Any, where: str, source: str) -> Any:
    parse = parser_of(row)
    try:
        if row.repeat:
            items = raw if isinstance(raw, list) else [raw]
            return [parse(i) for i in items if str(i).strip()]
        if isinstance(raw, list | dict) and row.kind != "custom":
            raise ValueError("expected a string or a number")
        return parse(raw)
    except ValueError as exc:
        raise ConfigError(f"invalid {row.name} ({where}) = {shown_value(raw)}: {str(exc)[:200]}") from None


def describe(rows: Sequence[Setting], values: Mapping[str, Any]) -> str:
    """The settings in effect as YAML-like lines (``--check-config``), one per row, naming its env twin."""
    lines = []
    for r in rows:
        value = values.get(r.name)
        shown = shown_value(value) if isinstance(value, str) else value
        lines.append(f"{r.flag.lstrip('-')}: {shown}" + (f"  # env {r.env}" if r.env else ""))
    return "\n".join(lines) + "\n"
