"""Layered settings for an argparse command: every flag has an environment twin and a YAML key.

Precedence, as for ``gpu-exporter serve``: the flag's default < the YAML file (``--config FILE``
or its env variable) < the environment < the command line. Each option ``--some-flag`` reads
the env variable ``<PREFIX>SOME_FLAG`` (dots and dashes become underscores), and the YAML key
``some-flag``; a few historical names (``PROMETHEUS_URL``, ``LOG_LEVEL`` ...) are kept as extra
twins. Values from the file and the environment are strings, parsed and validated by the
command exactly as a flag's, so every setting has one meaning and one set of checks.
``--check-config`` is the command's: it validates everything and prints what it would run with.
"""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from exporter.platform.configfile import ConfigError, read_yaml, shown_value


class OneLineParser(argparse.ArgumentParser):
    """argparse for every command: a usage error is one line, ``<message> (see <prog> --help)``, raised as a
    :class:`ConfigError` (the command prints ``<prog>: error: ...`` and exits 2), never a usage dump."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see {self.prog} --help)")


_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}
_SKIP = {"help", "config_file", "check_config"}


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.dest not in _SKIP]


def _long(action: argparse.Action) -> str:
    return max(action.option_strings, key=len).lstrip("-")


def env_name(prefix: str, action: argparse.Action) -> str:
    return prefix + _long(action).upper().replace("-", "_").replace(".", "_")


def _value(action: argparse.Action, raw: Any, where: str) -> Any:
    """A file or env value in the form argparse would have produced from the flag."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        word = str(raw).strip().lower() if isinstance(raw, str | bool) else ""
        word = {"True": "true", "False": "false"}.get(str(raw), word)
        if word not in _TRUE | _FALSE:
            raise ConfigError(f"{where} = {shown_value(raw)}: expected true or false")
        on = word in _TRUE
        return on if isinstance(action, argparse._StoreTrueAction) else not on
    if isinstance(action, argparse._AppendAction):
        items = raw if isinstance(raw, list) else [raw]
        if not all(isinstance(i, str | int | float) and not isinstance(i, bool) for i in items):
            raise ConfigError(f"{where} = {shown_value(raw)}: expected a list of strings")
        return [str(i) for i in items]
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ConfigError(f"{where} = {shown_value(raw)}: expected a string or a number")
    return str(raw)


def layered_defaults(parser: argparse.ArgumentParser, argv: Sequence[str], env_prefix: str, config_env: str,
                     twins: Mapping[str, str] | None = None,
                     environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The defaults that the YAML file and the environment give ``parser``'s options (apply them with
    ``parser.set_defaults`` before parsing ``argv``). ``twins``: dest -> an extra, older env name."""
    env = os.environ if environ is None else environ
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", dest="config_file", default=env.get(config_env))
    known, _ = pre.parse_known_args(list(argv))
    options = _options(parser)
    by_key = {_long(a): a for a in options}
    out: dict[str, Any] = {}
    if known.config_file:
        doc = read_yaml(known.config_file, "config file")
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise ConfigError(f"config file {known.config_file}: expected a mapping of settings at the top level")
        for key, raw in doc.items():
            action = by_key.get(str(key)) or by_key.get(str(key).replace("_", "-"))
            if action is None:
                near = difflib.get_close_matches(str(key), list(by_key), n=1)
                hint = f"; did you mean {near[0]}?" if near else ""
                raise ConfigError(f"config file {known.config_file}: unknown setting {shown_value(key)}{hint}")
            out[action.dest] = _value(action, raw, f"{key} (config file {known.config_file})")
    for action in options:
        for name in (env_name(env_prefix, action), (twins or {}).get(action.dest)):
            if name and name in env:
                out[action.dest] = _value(action, env[name], f"{name} (env)")
                break
    return out


def add_config_flags(parser: argparse.ArgumentParser, config_env: str) -> None:
    parser.add_argument("--config", dest="config_file", metavar="FILE",
                        help=f"YAML file of settings, keyed by flag name without the dashes (env {config_env}); "
                             "precedence: default < file < environment < flag")
    parser.add_argument("--check-config", action="store_true", help="validate the settings, print them, exit")


def describe(parser: argparse.ArgumentParser, namespace: argparse.Namespace, env_prefix: str) -> str:
    """The settings in effect as YAML-like lines (``--check-config``), one per option."""
    lines = []
    for action in _options(parser):
        value = getattr(namespace, action.dest, None)
        lines.append(f"{_long(action)}: {shown_value(value) if isinstance(value, str) else value}"
                     f"  # env {env_name(env_prefix, action)}")
    return "\n".join(lines) + "\n"
