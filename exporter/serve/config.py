"""Settings for ``gpu-exporter serve``: flags, their environment twins and a YAML file.

Precedence: built-in default < YAML file (``--config``/``EXPORTER_CONFIG``) < environment < flag.
Every value is validated up front; a bad one raises :class:`ConfigError`, which the CLI turns
into exit code 2 and one line naming the setting, the bad value and what is allowed. A backend's own
settings (``Backend.settings``: ``--rocm-smi-path``, ``--command-timeout``) are declared in its file
and join this table with the parser of their kind (:func:`_backend_spec`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from exporter.backends.simulated import SCENARIOS  # a light module: the table of scenarios
from exporter.core.options import BackendSetting, FieldFilter, Settings
from exporter.platform import units
from exporter.platform.configfile import ConfigError, read_yaml, shown_value
from exporter.platform.settings import OneLineParser


def _fail(setting: str, source: str, value: object, allowed: str) -> NoReturn:
    raise ConfigError(f"invalid {setting} ({source}) = {shown_value(value)}: {allowed[:200]}")


# --- value parsers: (raw value) -> typed value, raising ValueError(allowed) -------------------

_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")


def _int_range(lo: int, hi: int) -> Callable[[object], int]:
    def parse(v: object) -> int:
        if isinstance(v, bool):
            raise ValueError(f"expected an integer in {lo}..{hi}")
        s = str(v).strip()
        # ASCII digits only, and few of them: int() would also take "1_000", "٣" and 5,000-digit strings
        if not isinstance(v, int) and not re.fullmatch(r"[+-]?[0-9]{1,18}", s):
            raise ValueError(f"expected an integer in {lo}..{hi}")
        n = v if isinstance(v, int) else int(s)
        if not lo <= n <= hi:
            raise ValueError(f"expected an integer in {lo}..{hi}")
        return n

    return parse


def _seconds(lo: float, hi: float) -> Callable[[object], float]:
    def parse(v: object) -> float:
        allowed = f"expected a duration in {lo:g}..{hi:g} seconds (e.g. 10, 0.5, 30s, 5m, 1h)"
        if isinstance(v, bool):
            raise ValueError(allowed)
        s = str(v).strip().lower()
        try:
            x = units.parse_duration(s)  # the one duration parser: 1h, 1m30s, 250ms or bare seconds
        except ValueError:
            if not _DECIMAL.fullmatch(s):  # float() would also take "nan", "inf", "1_0" and non-ASCII digits
                raise ValueError(allowed) from None
            x = float(s)  # a signed or exponent number: refused by the range below unless in it
        if not (lo <= x <= hi):  # also rejects an overflow to inf
            raise ValueError(allowed)
        return x

    return parse


def _choice(options: Sequence[str], aliases: Mapping[str, str] | None = None) -> Callable[[object], str]:
    def parse(v: object) -> str:
        s = str(v).strip().lower()
        s = (aliases or {}).get(s, s)
        if s not in options:
            raise ValueError(f"expected one of: {', '.join(options)}")
        return s

    return parse


def _bool(v: object) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false")


def _str_list(v: object) -> list[str]:
    """Metric family names or globs over them; each must match a family of the schema."""
    if isinstance(v, list | tuple):
        items = [str(x).strip() for x in v]
    else:
        items = [x.strip() for x in str(v).split(",")]
    out = [x for x in items if x]
    for x in out:
        if not all(c.isalnum() or c in "_*?[]" for c in x):
            raise ValueError("expected metric family names or globs, e.g. gpu_clock_*,gpu_fan_speed_ratio")
    FieldFilter(include=out)  # the filter's own check: FieldSelectionError (a ValueError) names the nearest
    return out


# Paths the server answers itself: the metrics path may not shadow them (exporter/serve/http.py, api.py).
RESERVED_PATHS = ("/", "/healthz", "/readyz", "/api/v1/monitoring/gpu-metrics", "/api/v1/families", "/stats")
_PATH_SEGMENT = re.compile(r"(?:[A-Za-z0-9._~-]|%[0-9A-Fa-f]{2})+")


def _path_prefix(v: object) -> str:
    s = str(v).strip()
    segments = s.split("/")[1:]
    # "//host" would be a link to another site on the landing page; ".." and odd characters are never needed
    if not s.startswith("/") or not all(_PATH_SEGMENT.fullmatch(x) and x not in (".", "..") for x in segments):
        raise ValueError("expected an absolute URL path such as /metrics (letters, digits, - . _ ~ between slashes)")
    if s in RESERVED_PATHS:
        raise ValueError(f"{s} is served by the exporter itself; choose another path such as /metrics")
    return s


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def _address(v: object) -> str:
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


def _backend(v: object) -> str:
    from exporter import backends  # the registry imports only light modules

    names = ["auto", *backends.names()]
    parts = [p.strip().lower() for p in str(v).split(",") if p.strip()]
    if not parts or any(p not in names for p in parts) or ("auto" in parts and len(parts) > 1):
        raise ValueError(f"expected auto, or one or more of {', '.join(names[1:])} separated by commas")
    if len(set(parts)) != len(parts):  # two instances of one backend would publish the same series twice
        raise ValueError("each backend at most once")
    if "simulated" in parts and len(parts) > 1:  # fake GPUs among real ones would pass for real
        raise ValueError("simulated only on its own (--backend simulated), never mixed with real GPUs")
    return ",".join(parts)


def _scenario(v: object) -> str:
    return _choice(tuple(SCENARIOS))(v)


def _file(v: object) -> str:
    s = str(v).strip()
    if not s:
        raise ValueError("expected a file path")
    return s


def _size(v: object) -> int:
    if isinstance(v, bool):
        raise ValueError(f"expected a size, {units.SIZE_EXAMPLES}")
    return units.parse_size(str(v))  # the one size parser (Kubernetes quantity rules)


# --- the settings table --------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    name: str  # attribute and YAML key
    flag: str
    env: str | None
    parse: Callable[[object], Any]
    help: str
    backend: bool = False  # a backend's own setting (Settings.backend_settings)
    default: Any = None  # a backend setting's default (the exporter's own: Settings)


def _backend_spec(s: BackendSetting) -> Spec:
    """A backend's declared setting as a row of the table, parsed like the exporter's own of its kind."""
    parse: Callable[[object], Any] = {
        "path": lambda: _file,
        "seconds": lambda: _seconds(s.low, s.high),
        "integer": lambda: _int_range(int(s.low), int(min(s.high, 2**63))),
        "bool": lambda: _bool,
        "size": lambda: _size,
        "choice": lambda: _choice(s.choices),
    }[s.kind]()
    return Spec(s.name, s.flag, s.env, parse, s.help, backend=True, default=s.default)


def _backend_specs() -> tuple[Spec, ...]:
    from exporter import backends  # the registry imports only light modules

    return tuple(_backend_spec(s) for s in backends.settings())


SPECS: tuple[Spec, ...] = (
    Spec("backend", "--backend", "EXPORTER_BACKEND", _backend,
         "auto | {backends}, or a comma list (default auto)"),
    Spec("allow_simulated", "--allow-simulated", "EXPORTER_ALLOW_SIMULATED", _bool,
         "let --backend auto fall back to the simulated backend when no GPU is found (never in production)"),
    Spec("address", "--address", "EXPORTER_ADDRESS", _address,
         "listen address (default 127.0.0.1, this machine only; 0.0.0.0 or :: listens on all addresses)"),
    Spec("port", "--port", "EXPORTER_PORT", _int_range(1, 65535), "listen port (default 9400)"),
    Spec("metrics_path", "--metrics-path", "METRICS_PATH", _path_prefix, "metrics path (default /metrics)"),
    Spec("collection_interval", "--collection-interval", "COLLECTION_INTERVAL", _seconds(0, 3600),
         "seconds between background collections; 0 = collect on scrape (default 0)"),
    Spec("collection_timeout", "--collection-timeout", "COLLECTION_TIMEOUT", _seconds(0.01, 300),
         "seconds a scrape waits for a collection before answering with what it has (default 5)"),
    Spec("call_deadline", "--call-deadline", "CALL_DEADLINE", _seconds(0.01, 300),
         "seconds a vendor call on one GPU may take before that GPU is published as hung (gpu_up 0) and the "
         "other GPUs go on; below --collection-timeout (default 1, or a fifth of a collection timeout under 5; "
         "docs/reliability.md)"),
    Spec("cache_ttl", "--cache-ttl", "SCRAPE_CACHE_TTL", _seconds(0, 60),
         "collect-on-scrape: reuse a collection that finished less than this ago (default 1; 0 = never)"),
    Spec("ready_max_age", "--ready-max-age", "READY_MAX_AGE", _seconds(1, 86400),
         "/readyz fails when the last successful collection is older than this (default 60)"),
    Spec("log_level", "--log-level", "LOG_LEVEL", _choice(("debug", "info", "warning", "error"), {"warn": "warning"}),
         "debug | info | warning | error (default info)"),
    Spec("log_format", "--log-format", "LOG_FORMAT", _choice(("text", "json")), "text | json (default text)"),
    Spec("fields_include", "--fields-include", "FIELDS_INCLUDE", _str_list,
         "only these metric families (comma list, globs allowed)"),
    Spec("fields_exclude", "--fields-exclude", "FIELDS_EXCLUDE", _str_list,
         "drop these metric families (comma list, globs allowed)"),
    Spec("sysfs_root", "--sysfs-root", "SYSFS_ROOT", _file, "sysfs mount for the PCI bus count (default /sys)"),
    Spec("simulated_gpus", "--simulated-gpus", "SIMULATED_GPUS", _int_range(1, 64),
         "GPU count of the simulated backend (default 4)"),
    Spec("simulated_scenario", "--simulated-scenario", "SIMULATED_SCENARIO", _scenario,
         "state the simulated GPUs show: " + " | ".join(SCENARIOS) + " (default healthy; docs/cli.md)"),
    Spec("per_process", "--per-process", "EXPORTER_PER_PROCESS", _bool,
         "per-process readings: per-pod utilisation and memory on shared GPUs (needs --proc-root and a "
         "pods watch), and per-PID memory series (unbounded cardinality; default false)"),
    Spec("proc_root", "--proc-root", "PROC_ROOT", _file,
         "the host's /proc, mounted read-only, for --per-process's PID-to-pod mapping (default /proc)"),
    Spec("pcie_throughput", "--pcie-throughput", "EXPORTER_PCIE_THROUGHPUT", _bool,
         "read PCIe TX/RX throughput (about 40 ms per GPU per collection on NVIDIA, 20 ms for each "
         "direction; default false)"),
    *_backend_specs(),  # every backend's own (--rocm-smi-path, --command-timeout), declared in its file
    Spec("pod_resources_socket", "--pod-resources-socket", "POD_RESOURCES_SOCKET", _file,
         "kubelet pod-resources socket for pod attribution"),
    Spec("pod_resources_interval", "--pod-resources-interval", "POD_RESOURCES_INTERVAL", _seconds(1, 3600),
         "seconds between pod-resources List calls (default 10)"),
    Spec("pod_attribution", "--pod-attribution", "POD_ATTRIBUTION", _choice(("auto", "on", "off")),
         "auto (when the socket exists) | on | off (default auto)"),
    Spec("dra_attribution", "--dra-attribution", "DRA_ATTRIBUTION", _choice(("auto", "on", "off")),
         "map DRA-claimed GPUs to pods through this node's ResourceSlices (needs NODE_NAME and RBAC): "
         "auto (on when the API server answers) | on | off (default auto)"),
    Spec("web_config_file", "--web.config.file", "WEB_CONFIG_FILE", _file,
         "exporter-toolkit web config (TLS, basic auth)"),
    Spec("max_connections", "--max-connections", "EXPORTER_MAX_CONNECTIONS", _int_range(1, 10000),
         "requests answered at once; more get 503 at once (connections waiting for a request hold no slot; "
         "default 64)"),
    Spec("read_timeout", "--read-timeout", "EXPORTER_READ_TIMEOUT", _seconds(0.1, 300),
         "seconds a connection has for its TLS handshake and whole request, and an answer for its write "
         "(default 10)"),
)

_SPEC_BY_NAME = {s.name: s for s in SPECS}


def _check_unique(specs: Sequence[Spec]) -> None:
    """A backend's setting may not take the name, flag or env variable of another setting."""
    for key in ("name", "flag", "env"):
        values = [getattr(s, key) for s in specs if getattr(s, key)]
        twice = next((v for v in values if values.count(v) > 1), None)
        if twice is not None:
            raise ValueError(f"two settings have the {key} {twice!r}: a backend's setting needs its own")


_check_unique(SPECS)


def build_parser(prog: str = "gpu-exporter serve") -> argparse.ArgumentParser:
    p = OneLineParser(prog=prog, description="Serve GPU metrics for Prometheus.")
    p.add_argument("--config", dest="config_file", default=None, help="YAML config file (env EXPORTER_CONFIG)")
    p.add_argument("--check-config", action="store_true", help="validate the settings, print them, exit")
    from exporter import backends  # the registry imports only light modules

    known = " | ".join(backends.ordered())  # every backend file in exporter/backends/, so --help lists a new one
    for s in SPECS:
        env = f" (env {s.env})" if s.env else ""
        s = dataclasses.replace(s, help=s.help.replace("{backends}", known))
        if s.parse is _bool:
            p.add_argument(s.flag, dest=s.name, nargs="?", const="true", default=None, metavar="true|false",
                           help=s.help + " (a bare flag means true)" + env)
        else:
            p.add_argument(s.flag, dest=s.name, default=None, help=s.help + env)
    return p


def _load_yaml(path: str) -> dict[str, Any]:
    data = read_yaml(path, "config file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of settings at the top level")
    flat: dict[str, Any] = {}
    for key, value in data.items():
        k = str(key).replace("-", "_").replace(".", "_")  # the flag's spelling works too (web.config.file)
        if k == "fields":  # fields: {include: [...], exclude: [...]} (an empty entry selects nothing)
            if not isinstance(value, dict | None):
                raise ConfigError(f"config file {path}: fields must be a mapping with include and/or exclude "
                                  f"lists (fields: {{include: [...], exclude: [...]}}), not {type(value).__name__}")
            for sub, v in (value or {}).items():
                if sub not in ("include", "exclude"):
                    raise ConfigError(f"config file {path}: unknown key fields.{sub}: expected include, exclude")
                flat[f"fields_{sub}"] = v
            continue
        if k not in _SPEC_BY_NAME:
            # every key a file takes, spelt as the flag (docs/exporter.example.yaml); underscores work too
            known = ", ".join(sorted([s.flag.removeprefix("--") for s in SPECS] + ["fields"]))
            raise ConfigError(f"config file {path}: unknown setting {key!r}; known: {known}")
        flat[k] = value
    return flat


def load(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Parse flags, environment and config file into validated :class:`Settings`."""
    env = os.environ if environ is None else environ
    ns = build_parser().parse_args(list(argv))
    settings = Settings()
    settings.backend_settings = {s.name: s.default for s in SPECS if s.backend}
    settings.check_config = bool(ns.check_config)
    config_file = ns.config_file or env.get("EXPORTER_CONFIG") or None
    settings.config_file = config_file
    layers: list[tuple[str, dict[str, Any]]] = []
    if config_file:
        layers.append((f"config {config_file}", _load_yaml(config_file)))
    layers.append(("env", {s.name: env[s.env] for s in SPECS if s.env and env.get(s.env, "") != ""}))
    layers.append(("flag", {s.name: getattr(ns, s.name) for s in SPECS if getattr(ns, s.name) is not None}))
    for source, values in layers:
        for name, raw in values.items():
            spec = _SPEC_BY_NAME[name]
            where = spec.flag if source == "flag" else spec.env if source == "env" else source
            try:
                value = spec.parse(raw)
            except ValueError as exc:
                _fail(name, str(where), raw, str(exc))
            if spec.backend:
                settings.backend_settings[name] = value
            else:
                setattr(settings, name, value)
    if settings.simulated_scenario != "healthy" and "simulated" not in settings.backend.split(",") and not (
            settings.backend == "auto" and settings.allow_simulated):
        raise ConfigError(f"invalid simulated_scenario = {settings.simulated_scenario!r}: only the simulated "
                          "backend has scenarios; add --backend simulated")
    if not any("call_deadline" in values for _, values in layers):  # the default: a fifth of the timeout, at most 1 s
        settings.call_deadline = min(settings.call_deadline, settings.collection_timeout / 5)
    elif settings.call_deadline >= settings.collection_timeout:
        raise ConfigError(f"invalid call_deadline = {settings.call_deadline:g}: must be below collection_timeout "
                          f"({settings.collection_timeout:g}), or one hung GPU costs every scrape its whole wait")
    if settings.dra_attribution == "on" and settings.pod_attribution == "off":
        raise ConfigError("invalid dra_attribution = 'on' with pod_attribution = 'off': DRA devices are found "
                          "through the kubelet's pod-resources API; set --pod-attribution auto or on")
    if settings.per_process and not os.path.isdir(os.path.join(settings.proc_root, "self")):
        raise ConfigError(f"invalid proc_root = {settings.proc_root!r}: not a proc filesystem (no self/ in it); "
                          "--per-process reads PIDs' cgroups there: mount the host's /proc read-only and point "
                          "--proc-root (PROC_ROOT) at it")
    return settings
