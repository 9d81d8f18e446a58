"""Reading a settings or web config file: one YAML reader for every daemon.

A bad file is a :class:`~exporter.platform.errors.ConfigError` naming it (one line, exit status 2).
"""

from __future__ import annotations

from typing import Any

from exporter.platform.errors import ConfigError, shown_value

__all__ = ["MAX_YAML_BYTES", "MAX_YAML_DEPTH", "ConfigError", "read_yaml", "shown_value"]


MAX_YAML_BYTES = 1 << 20
MAX_YAML_DEPTH = 32


def read_yaml(path: str, what: str) -> Any:
    """The document in the YAML file ``path``, or :class:`ConfigError` naming ``what`` and ``path``.

    Hostile or broken files end in one line, never a traceback: a leading BOM is dropped, bytes that
    are not UTF-8, more than 1 MiB, nesting deeper than 32 levels, aliases (billion laughs) and
    values PyYAML cannot build (a 5,000-digit integer, a bad ``!!timestamp``) are errors. Dates stay
    strings: no setting is a date.
    """
    import yaml

    class Loader(yaml.SafeLoader):
        yaml_implicit_resolvers = {k: [r for r in v if r[0] != "tag:yaml.org,2002:timestamp"]
                                   for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}

    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError(f"{what} {path}: larger than {MAX_YAML_BYTES >> 20} MiB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path}: not UTF-8 (byte {exc.start})") from None
    try:
        depth = 0  # checked on the event stream, before PyYAML recurses into the nodes
        for event in yaml.parse(text, Loader=Loader):
            if isinstance(event, yaml.AliasEvent):
                raise ConfigError(f"{what} {path}: YAML aliases (*name) are not supported")
            depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
            if depth > MAX_YAML_DEPTH:
                raise ConfigError(f"{what} {path}: nested deeper than {MAX_YAML_DEPTH} levels")
        return yaml.load(text, Loader=Loader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{what} {path}{where}: not valid YAML") from None
    except (ValueError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
        # PyYAML's constructors raise these for values such as a 5,000-digit integer or "!!timestamp x"
        raise ConfigError(f"{what} {path}: a value cannot be read ({type(exc).__name__}: {str(exc)[:80]})") from None
