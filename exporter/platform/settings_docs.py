"""The docs' settings tables and the example config's list of settings, rendered from settings rows, so that a
setting's flag, env twin, default and description are written once (``python -m exporter.settings_docs
--write-docs`` hands it each daemon's rows and writes the files):

- a Markdown table between ``<!-- settings:COMMAND -->`` (every row of the command) or
  ``<!-- settings:COMMAND name name ... -->`` (those rows) and ``<!-- /settings -->``: flag, environment
  variables (for ``profile`` the older names, as every flag also reads ``PROFILER_<FLAG>``), config file key,
  default, and the row's ``doc`` (else its help);
- in docs/exporter.example.yaml, between ``# settings:begin`` and ``# settings:end``, every setting of the
  exporter's own that the file does not set above, commented, at its default (its ``example`` where it has
  none); the backends' own settings are the backends' block (``python -m exporter.backends --write-docs``).

``tests/unit/platform/test_settings_docs.py`` fails while a generated part is stale.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from exporter.core.options import Setting
from exporter.platform.settings import shown_default

_TABLE = re.compile(r"(<!-- settings:(serve|profile)((?: [a-z_]+)*) -->\n).*?(<!-- /settings -->)", re.S)
_EXAMPLE = re.compile(r"(# settings:begin\n).*?(# settings:end)", re.S)


#: a command's settings rows and the prefix of the env variable each of its flags reads besides the row's own
#: names ("PROFILER_"; "" for serve, whose rows name theirs)
Rows = tuple[Sequence[Setting], str]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(row: Setting) -> str:
    if row.shown:
        return row.shown
    if row.default is None or row.default in ((), [], {}, ""):
        return ""
    return f"`{_cell(shown_default(row))}`"


def table(rows: Sequence[Setting], prefix: str) -> str:
    """The Markdown table of ``rows``: flag, env (besides ``<prefix><NAME>``), config file key (the flag's
    spelling, which the loader takes as it takes the row's name), default, description."""
    lines = ["| flag | env | config key | default | |", "|---|---|---|---|---|"]
    for r in rows:
        env = [e for e in (r.env, *r.twins) if e and not (prefix and e == prefix + r.name.upper())]
        lines.append(f"| `{r.flag}` | {', '.join(f'`{e}`' for e in env)} | `{r.flag.removeprefix('--')}` | "
                     f"{_default(r)} | {_cell(r.doc or r.help)} |")
    return "\n".join(lines) + "\n"


def render_tables(text: str, commands: Mapping[str, Rows]) -> str:
    """``text`` with each ``<!-- settings:COMMAND [name ...] -->`` block rewritten from ``commands``."""

    def block(m: re.Match[str]) -> str:
        rows, prefix = commands[m[2]]
        names = m[3].split()
        if names:
            by_name = {r.name: r for r in rows}
            unknown = [n for n in names if n not in by_name]
            if unknown:
                raise ValueError(f"<!-- settings:{m[2]} ... -->: no setting {unknown[0]!r}")
            rows = [by_name[n] for n in names]
        return m[1] + table(rows, prefix) + m[4]

    return _TABLE.sub(block, text)


def _yaml_value(row: Setting) -> str:
    v: Any = row.default
    if v is None:
        return row.example
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(map(str, v)) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {x}" for k, x in v.items()) + "}"
    return f"{v:g}" if isinstance(v, float) else str(v)


def render_example(text: str, rows: Sequence[Setting]) -> str:
    """docs/exporter.example.yaml with its block of the exporter's own settings (``rows``) rewritten: each one the
    file does not set above, commented, at its default (``example`` beside it, or in its place when it has
    none)."""
    head = text.split("# settings:begin", 1)[0]
    given: set[str] = set()
    for key, value in (yaml.safe_load(head) or {}).items():
        k = str(key).replace("-", "_").replace(".", "_")
        given |= {f"{k}_{sub}" for sub in value} if isinstance(value, dict) else {k}  # fields: {exclude: ...}
    lines = []
    for r in rows:
        if r.name in given:
            continue
        line = f"# {r.flag.removeprefix('--')}: {_yaml_value(r)}"
        if r.example and r.default is not None:
            line = f"{line:<36}# e.g. {r.example}"
        lines.append(line + "\n")
    return _EXAMPLE.sub(lambda m: m[1] + "".join(lines) + m[2], text)
