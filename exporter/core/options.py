"""Settings: the one settings object, with the one set of defaults.

Every setting of every daemon is a :class:`Setting` row (flag, env twin, YAML key, kind and default
written once), read by the one loader (exporter/platform/settings.py). ``exporter.serve.config`` is
serve's table of rows and fills :class:`Settings` (whose field defaults are the rows' defaults);
everything else (backends, engine, tools) reads its defaults from here. A setting only one backend
needs is a row in that backend's file (``Backend.settings``), which ``serve`` loads like its own;
its value is in ``Settings.backend_settings``.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from exporter.core import schema


@dataclass
class Settings:
    backend: str = "auto"
    allow_simulated: bool = False
    address: str = "127.0.0.1"
    port: int = 9400
    metrics_path: str = "/metrics"
    collection_interval: float = 0.0
    collection_timeout: float = 5.0
    call_deadline: float = 1.0  # seconds one vendor call on one GPU may take before the GPU is hung
    cache_ttl: float = 1.0
    ready_max_age: float = 60.0
    log_level: str = "info"
    log_format: str = "text"
    fields_include: list[str] = field(default_factory=list)
    fields_exclude: list[str] = field(default_factory=list)
    sysfs_root: str = "/sys"
    simulated_gpus: int = 4
    simulated_scenario: str = "healthy"
    per_process: bool = False
    proc_root: str = "/proc"
    pcie_throughput: bool = False
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    pod_resources_interval: float = 10.0
    pod_attribution: str = "auto"
    dra_attribution: str = "auto"
    web_config_file: str | None = None
    max_connections: int = 64
    read_timeout: float = 10.0
    probe_port: int = 0  # 0: none; else a plain-HTTP listener for /healthz and /readyz alone
    #: XID code or RAS/ECC event -> severity, over NVIDIA's catalogue (exporter/core/xid.py)
    xid_severity: dict[int | str, str] = field(default_factory=dict)
    config_file: str | None = None
    check_config: bool = False
    #: the backends' own settings (``Backend.settings``) by name, every one present (its default when unset)
    backend_settings: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        """A backend's setting reads like the others (``settings.command_timeout``)."""
        extra = self.__dict__.get("backend_settings")
        if extra is not None and name in extra:
            return extra[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "backend_settings"}
        return {**out, **self.backend_settings}


#: how a setting's text is parsed and checked (exporter/platform/settings.py): a path, an existing file, a
#: duration in seconds (exporter/platform/units.py: 30s, 5m, 1h or a number) in low..high, an integer in
#: low..high, a ratio in (low, high], true/false, a size in bytes (Kubernetes quantity rules: 16Mi, 16M) in
#: low..high, one of choices, one line of text, or the command's own ``parse`` (custom)
SETTING_KINDS = ("path", "seconds", "integer", "bool", "size", "choice", "file", "ratio", "text", "custom")


@dataclass(frozen=True)
class Setting:
    """One setting of a daemon or a backend, declared once: the row of every settings table.

    The loader (exporter/platform/settings.py) gives it the flag ``flag``, the env twin ``env`` (then the
    older names in ``twins``) and the YAML key ``name`` (or the flag's spelling), lists it in ``--help``
    with its default and in ``--check-config``, and parses and checks it up front (a bad value: one line
    naming it, exit status 2). ``serve`` and ``profile`` are tables of these rows; a backend declares
    its own in its file (``Backend.settings``) and reads the value with ``self.setting(name)``.
    """

    name: str  # attribute, YAML key and ``Backend.setting`` key: lower case and underscores
    flag: str  # --some-flag
    env: str | None  # its environment twin
    kind: str  # one of SETTING_KINDS
    help: str  # --help text; the default is added to it unless it says its default itself
    default: Any = None  # the value when unset (None: unset), already parsed
    low: float = 0.0  # seconds, integer, ratio, size: the allowed range
    high: float = math.inf
    choices: tuple[str, ...] = ()  # choice: the allowed values, lower case
    twins: tuple[str, ...] = ()  # older environment names, read when ``env`` is not set
    parse: Callable[[Any], Any] | None = None  # custom: the value from its text, or ValueError(what is allowed)
    repeat: bool = False  # the flag may be given again (a YAML list; the env twin: a comma list)
    aliases: tuple[tuple[str, str], ...] = ()  # choice: other spellings of a choice (warn -> warning)
    example: str = ""  # a value to show where it has no default (docs/exporter.example.yaml), else beside it
    # the docs' settings tables (exporter/platform/settings_docs.py): its description there, in Markdown
    # ("": its help), and its default as the table shows it when the value alone does not say it ("": the value)
    doc: str = ""
    shown: str = ""

    def check(self, owner: str) -> None:
        """ValueError naming ``owner`` (the backend) and the culprit when the declaration cannot work."""
        problem = None
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            problem = "name: expected lower-case letters, digits and underscores"
        elif self.name in {f.name for f in fields(Settings)}:
            problem = "name: already a setting of the exporter"
        elif not re.fullmatch(r"--[a-z][a-z0-9.-]*", self.flag):
            problem = f"flag {self.flag!r}: expected --lower-case-words"
        elif self.env is not None and not re.fullmatch(r"[A-Z][A-Z0-9_]*", self.env):
            problem = f"env {self.env!r}: expected UPPER_CASE"
        elif self.kind not in SETTING_KINDS:
            problem = f"kind {self.kind!r}: expected one of {', '.join(SETTING_KINDS)}"
        elif self.kind == "choice" and not self.choices:
            problem = "kind 'choice' without choices"
        elif (self.kind == "custom") != (self.parse is not None):
            problem = "a parse function goes with kind 'custom', and only with it"
        if problem:
            raise ValueError(f"backend {owner!r} declares setting {self.name!r}: {problem}")


BackendSetting = Setting  # a backend's own setting (``Backend.settings``) is a row like every other


class FieldSelectionError(ValueError):
    """A ``--fields-include``/``--fields-exclude`` entry that names no family (one line, names the nearest)."""


@dataclass
class FieldFilter:
    """Which metric families are collected and which are published, from include/exclude lists.

    Entries are family names or shell globs over family names (``gpu_clock_*``); every entry
    must match at least one family, else :class:`FieldSelectionError`. Rules, the same on
    every backend:

    - ``enabled(family)``: the family is collected. Without ``include`` every family is, except
      the excluded; with ``include`` only the included ones (minus the excluded). A backend asks
      with exact family names only and makes no vendor call for a family that is not enabled.
    - ``exposed(family)``: the family is on ``/metrics``: enabled, and on by default or selected
      by ``include`` (the GPU-pair topology is collected for the JSON API but not published by
      default). Families that are not filterable (self-metrics) are always published.
    """

    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    _enabled: dict[str, bool] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for entry in (*self.include, *self.exclude):
            if not schema.match(entry):
                raise FieldSelectionError(schema.unknown_family_message(entry))
        # every family's answer once, here: backends ask per GPU per collection
        for row in schema.FAMILIES:
            inc = not self.include or any(fnmatch.fnmatchcase(row.name, p) for p in self.include)
            self._enabled[row.name] = not row.filterable or (
                inc and not any(fnmatch.fnmatchcase(row.name, p) for p in self.exclude))

    def enabled(self, family: str) -> bool:
        try:
            return self._enabled[family]
        except KeyError:
            schema.family(family)  # raises, naming the nearest family: backends ask by exact name, never a glob
            raise

    def any_enabled(self, *families: str) -> bool:
        return any(self.enabled(f) for f in families)

    def exposed(self, family: str) -> bool:
        return self.enabled(family) and (bool(self.include) or schema.family(family).default)


DEFAULTS = _D = Settings()  # the one set of defaults


@dataclass
class BackendOptions:
    """What a backend needs from :class:`Settings` (its defaults are the settings' defaults)."""

    fields: FieldFilter = field(default_factory=FieldFilter)
    sysfs_root: str = _D.sysfs_root
    simulated_gpus: int = _D.simulated_gpus
    simulated_scenario: str = _D.simulated_scenario  # exporter.backends.simulated.SCENARIOS
    per_process: bool = _D.per_process  # per-PID series are unbounded cardinality: opt-in
    pcie_throughput: bool = _D.pcie_throughput  # about 40 ms per GPU per read on NVIDIA: opt-in
    call_deadline: float = _D.call_deadline  # seconds a vendor call about one GPU may take (backends/base.py)
    backend_settings: dict[str, Any] = field(default_factory=dict)  # Backend.settings' values, by name

    @classmethod
    def from_settings(cls, s: Settings) -> BackendOptions:
        return cls(fields=FieldFilter(include=s.fields_include, exclude=s.fields_exclude),
                   sysfs_root=s.sysfs_root, simulated_gpus=s.simulated_gpus,
                   simulated_scenario=s.simulated_scenario, per_process=s.per_process,
                   pcie_throughput=s.pcie_throughput, call_deadline=s.call_deadline,
                   backend_settings=dict(s.backend_settings))


