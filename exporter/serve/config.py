"""Settings for ``gpu-exporter serve``: its table of :class:`~exporter.core.options.Setting` rows.

The one loader (exporter/platform/settings.py) reads them: precedence default < YAML file
(``--config``/``EXPORTER_CONFIG``) < environment < flag, every value validated up front; a bad one
raises :class:`ConfigError`, which the CLI turns into exit code 2 and one line naming the setting,
the bad value and what is allowed. A row's default is :class:`Settings`' (the one set of defaults).
A backend's own settings (``Backend.settings``: ``--rocm-smi-path``, ``--command-timeout``) are rows
declared in its file and join this table.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from exporter.backends.simulated import SCENARIOS  # a light module: the table of scenarios
from exporter.core.options import DEFAULTS, FieldFilter, Setting, Settings
from exporter.platform import settings as loader
from exporter.platform.errors import ConfigError

__all__ = ["SPECS", "ConfigError", "Settings", "build_parser", "load"]

PROG = "gpu-exporter serve"
CONFIG_ENV = "EXPORTER_CONFIG"


# --- serve's own checks (the kinds' parsers are the loader's) ---------------------------------

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


def _xid_severity(v: object) -> dict[int | str, str]:
    """XID code or RAS/ECC event -> fatal | warn | ignore: a YAML mapping, or ``48=fatal,13=ignore`` (flag, env)."""
    from exporter.core import xid

    raw: object = v
    if isinstance(v, str):
        pairs = [p.strip() for p in v.split(",") if p.strip()]
        if any("=" not in p for p in pairs):
            raise ValueError("expected CODE=SEVERITY pairs separated by commas, e.g. 48=fatal,13=ignore")
        raw = dict(p.split("=", 1) for p in pairs)
        if len(raw) != len(pairs):
            raise ValueError("each XID code or event at most once")
    try:
        return dict(xid.load_overrides(raw, "xid_severity"))
    except xid.XidConfigError as exc:
        raise ValueError(str(exc).removeprefix("xid_severity: ")) from None


# --- the settings table --------------------------------------------------------------------


def _row(name: str, env: str | None, kind: str, help_: str, **kw: Any) -> Setting:
    """A row of serve's: flag ``--<name with dashes>``, default the one in :class:`Settings`."""
    flag = kw.pop("flag", "--" + name.replace("_", "-"))
    return Setting(name, flag, env, kind, help_, kw.pop("default", getattr(DEFAULTS, name)), **kw)


def _custom(name: str, env: str | None, parse: Any, help_: str, **kw: Any) -> Setting:
    return _row(name, env, "custom", help_, parse=parse, **kw)


def _backend_rows() -> tuple[Setting, ...]:
    from exporter import backends  # the registry imports only light modules

    return tuple(backends.settings())


_ON_OFF = ("auto", "on", "off")

SPECS: tuple[Setting, ...] = (
    _custom("backend", "EXPORTER_BACKEND", _backend, "auto | {backends}, or a comma list"),
    _row("allow_simulated", "EXPORTER_ALLOW_SIMULATED", "bool",
         "let --backend auto fall back to the simulated backend when no GPU is found (never in production)"),
    _custom("address", "EXPORTER_ADDRESS", loader.parse_address,
            "listen address (default 127.0.0.1, this machine only; 0.0.0.0 or :: listens on all addresses)"),
    _row("port", "EXPORTER_PORT", "integer", "listen port", low=1, high=65535),
    _custom("metrics_path", "METRICS_PATH", _path_prefix, "metrics path"),
    _row("collection_interval", "COLLECTION_INTERVAL", "seconds",
         "seconds between background collections; 0 = collect on scrape", high=3600),
    _row("collection_timeout", "COLLECTION_TIMEOUT", "seconds",
         "seconds a scrape waits for a collection before answering with what it has", low=0.01, high=300),
    _row("call_deadline", "CALL_DEADLINE", "seconds",
         "seconds a vendor call on one GPU may take before that GPU is published as hung (gpu_up 0) and the "
         "other GPUs go on; below --collection-timeout (default 1, or a fifth of a collection timeout under 5; "
         "docs/reliability.md)", low=0.01, high=300),
    _row("cache_ttl", "SCRAPE_CACHE_TTL", "seconds",
         "collect-on-scrape: reuse a collection that finished less than this ago (0 = never)", high=60),
    _row("ready_max_age", "READY_MAX_AGE", "seconds",
         "/readyz fails when the last successful collection is older than this", low=1, high=86400),
    _row("log_level", "LOG_LEVEL", "choice", "debug | info | warning | error", choices=loader.LOG_LEVELS,
         aliases=(("warn", "warning"),)),
    _row("log_format", "LOG_FORMAT", "choice", "text | json", choices=("text", "json")),
    _custom("fields_include", "FIELDS_INCLUDE", _str_list, "only these metric families (comma list, globs allowed)"),
    _custom("fields_exclude", "FIELDS_EXCLUDE", _str_list, "drop these metric families (comma list, globs allowed)"),
    _row("sysfs_root", "SYSFS_ROOT", "path", "sysfs mount for the PCI bus count"),
    _row("simulated_gpus", "SIMULATED_GPUS", "integer", "GPU count of the simulated backend", low=1, high=64),
    _row("simulated_scenario", "SIMULATED_SCENARIO", "choice",
         "state the simulated GPUs show: " + " | ".join(SCENARIOS) + " (docs/cli.md)", choices=tuple(SCENARIOS)),
    _row("per_process", "EXPORTER_PER_PROCESS", "bool",
         "per-process readings: per-pod utilisation and memory on shared GPUs (needs --proc-root and a "
         "pods watch), and per-PID memory series (unbounded cardinality)"),
    _row("proc_root", "PROC_ROOT", "path", "the host's /proc, mounted read-only, for --per-process's PID-to-pod "
         "mapping"),
    _row("pcie_throughput", "EXPORTER_PCIE_THROUGHPUT", "bool",
         "read PCIe TX/RX throughput (about 40 ms per GPU per collection on NVIDIA, 20 ms for each direction)"),
    _custom("xid_severity", "XID_SEVERITY", _xid_severity,
            "override the severity of XID codes or RAS/ECC events (fatal | warn | ignore), e.g. 48=fatal,13=ignore "
            "(default: NVIDIA's XID catalogue, exporter/core/xid.py; docs/metrics.md)",
            example="{48: fatal, 13: ignore, ecc_corrected: warn}"),
    *_backend_rows(),  # every backend's own (--rocm-smi-path, --command-timeout), declared in its file
    _row("pod_resources_socket", "POD_RESOURCES_SOCKET", "path", "kubelet pod-resources socket for pod attribution"),
    _row("pod_resources_interval", "POD_RESOURCES_INTERVAL", "seconds", "seconds between pod-resources List calls",
         low=1, high=3600),
    _row("pod_attribution", "POD_ATTRIBUTION", "choice", "auto (when the socket exists) | on | off",
         choices=_ON_OFF, doc="`auto` (when the kubelet's pod-resources directory exists), `on`, `off`"),
    _row("dra_attribution", "DRA_ATTRIBUTION", "choice",
         "map DRA-claimed GPUs to pods through this node's ResourceSlices (needs NODE_NAME and RBAC): "
         "auto (on when the API server answers) | on | off", choices=_ON_OFF,
         doc="`auto` (on when the API server answers), `on`, `off`: map GPUs claimed through Dynamic Resource "
             "Allocation through this node's ResourceSlices; needs `NODE_NAME`, a ServiceAccount token (or "
             "`KUBECONFIG` outside a cluster) and `get`/`list`/`watch` on `resourceslices`"),
    _row("web_config_file", "WEB_CONFIG_FILE", "path", "exporter-toolkit web config (TLS, basic auth); SIGHUP "
         "reloads it", flag="--web.config.file", example="/etc/gpu-exporter/web-config.yml"),
    _row("max_connections", "EXPORTER_MAX_CONNECTIONS", "integer",
         "requests answered at once; more get 503 at once (connections waiting for a request hold no slot)",
         low=1, high=10000),
    _row("read_timeout", "EXPORTER_READ_TIMEOUT", "seconds",
         "seconds a connection has for its TLS handshake and whole request, and an answer for its write",
         low=0.1, high=300),
    _row("probe_port", "EXPORTER_PROBE_PORT", "integer",
         "a second port for the kubelet's probes: /healthz and /readyz only, plain HTTP whatever the web config, "
         "its own connections, so no TLS handshake or greedy client of --port is in a probe's way (0 = none: "
         "probes on --port)", low=0, high=65535),
)
loader.check_unique(SPECS)
_BACKEND_NAMES = frozenset(r.name for r in _backend_rows())


def described_rows() -> list[Setting]:
    """SPECS as ``--help`` and docs/cli.md's table show them: ``{backends}`` is every backend of the registry."""
    from exporter import backends  # the registry imports only light modules

    known = " | ".join(backends.ordered())  # every backend file in exporter/backends/, so --help lists a new one
    return [dataclasses.replace(r, help=r.help.replace("{backends}", known)) for r in SPECS]


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    return loader.build_parser(described_rows(), prog, "Serve GPU metrics for Prometheus.", CONFIG_ENV)


def load(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Parse flags, environment and config file into validated :class:`Settings`."""
    loaded = loader.load(SPECS, argv, build_parser(), CONFIG_ENV, environ, nests=("fields",))
    settings = Settings()
    for name, value in loaded.values.items():
        value = list(value) if isinstance(value, list) else value  # never the row's own default list
        if name in _BACKEND_NAMES:
            settings.backend_settings[name] = value
        else:
            setattr(settings, name, value)
    settings.check_config = loaded.check_config
    settings.config_file = loaded.config_file
    if settings.simulated_scenario != "healthy" and "simulated" not in settings.backend.split(",") and not (
            settings.backend == "auto" and settings.allow_simulated):
        raise ConfigError(f"invalid simulated_scenario = {settings.simulated_scenario!r}: only the simulated "
                          "backend has scenarios; add --backend simulated")
    if loaded.sources["call_deadline"] == "default":  # the default: a fifth of the timeout, at most 1 s
        settings.call_deadline = min(settings.call_deadline, settings.collection_timeout / 5)
    elif settings.call_deadline >= settings.collection_timeout:
        raise ConfigError(f"invalid call_deadline = {settings.call_deadline:g}: must be below collection_timeout "
                          f"({settings.collection_timeout:g}), or one hung GPU costs every scrape its whole wait")
    if settings.dra_attribution == "on" and settings.pod_attribution == "off":
        raise ConfigError("invalid dra_attribution = 'on' with pod_attribution = 'off': DRA devices are found "
                          "through the kubelet's pod-resources API; set --pod-attribution auto or on")
    if settings.probe_port and settings.probe_port == settings.port:
        raise ConfigError(f"invalid probe_port = {settings.probe_port}: the same as --port; the probes need a port "
                          "of their own (or 0 for none)")
    if settings.per_process and not os.path.isdir(os.path.join(settings.proc_root, "self")):
        raise ConfigError(f"invalid proc_root = {settings.proc_root!r}: not a proc filesystem (no self/ in it); "
                          "--per-process reads PIDs' cgroups there: mount the host's /proc read-only and point "
                          "--proc-root (PROC_ROOT) at it")
    return settings
