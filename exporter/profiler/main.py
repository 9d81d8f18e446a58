"""``gpu-exporter profile``: flags, wiring, and the run modes (loop, ``--once``, ``--dry-run``).

Exit status: 0 success; 1 a ``--once`` cycle had errors (or the loop could not start);
2 invalid flags (one line on stderr naming the flag, the value and what is allowed).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import socket
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from exporter.core import logs
from exporter.core.extras import MissingExtra, require
from exporter.platform import daemon, kube, settings, units
from exporter.platform.errors import ConfigError, fail, printable
from exporter.profiler import sources
from exporter.profiler.annotate import KubeError, NodeStore
from exporter.profiler.classify import Thresholds
from exporter.profiler.events import EventRecorder
from exporter.profiler.leader import ElectionConfig, LeaderElector, LeaseClient
from exporter.profiler.loop import Health, Profiler, make_server
from exporter.profiler.plan import PlanConfig, valid_prefix
from exporter.profiler.prom import PromClient, is_base_url, valid_header
from exporter.profiler.promql import MIN_QUERY_BYTES
from exporter.profiler.queries import QueryConfig, Reader
from exporter.profiler.taints import DeviceTaints

if TYPE_CHECKING:
    from exporter.platform.webconfig import WebConfig

log = logging.getLogger("exporter.profiler")

PROG = "gpu-exporter profile"
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def parse_duration(flag: str, value: str, lo: float, hi: float) -> float:
    """``"30m"``, ``"1800s"``, ``"1h"``, ``"90"`` (seconds) -> seconds, within [lo, hi]."""
    try:
        secs = units.parse_duration(value)
    except ValueError:
        raise ConfigError(f"{flag} {value!r}: expected a duration such as 90s, 30m, 1h or 1h30m") from None
    if not lo <= secs <= hi:
        raise ConfigError(f"{flag} {value!r}: must be between {_fmt_dur(lo)} and {_fmt_dur(hi)}")
    return secs


def _fmt_dur(s: float) -> str:
    for unit, f in (("h", 3600), ("m", 60)):
        if s >= f and s % f == 0:
            return f"{int(s // f)}{unit}"
    return f"{s:g}s"


def _ratio(flag: str, value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise ConfigError(f"{flag} {value!r}: expected a ratio between 0 and 1 (e.g. 0.3)") from None
    if not 0.0 < x <= 1.0:
        raise ConfigError(f"{flag} {value!r}: must be a ratio greater than 0 and at most 1 (0.3 means 30%)")
    return x


def _int(flag: str, value: str, lo: int, hi: int) -> int:
    try:
        x = int(value)
    except ValueError:
        raise ConfigError(f"{flag} {value!r}: expected a whole number from {lo} to {hi}") from None
    if not lo <= x <= hi:
        raise ConfigError(f"{flag} {value!r}: must be from {lo} to {hi}")
    return x




def _size(flag: str, value: str, lo: int, hi: int) -> int:
    """``16Mi``/``16MiB`` (2^20), ``16M`` (10^6), ``1048576`` -> bytes (Kubernetes quantity rules), within [lo, hi]."""
    try:
        n = units.parse_size(value)
    except ValueError:
        raise ConfigError(f"{flag} {value!r}: expected a size such as 16MiB, 512KiB or 1048576 "
                         "(Kubernetes quantities: 16M is 16 x 10^6 bytes, 16Mi and 16MiB 16 x 2^20)") from None
    if not lo <= n <= hi:
        raise ConfigError(f"{flag} {value!r}: must be from {lo} bytes (64KiB) to {hi} bytes (1GiB)")
    return n


def _headers(items: list[str]) -> dict[str, str]:
    """``['X-Scope-OrgID: a']`` -> {name: value}; a malformed or reserved header is a usage error."""
    out: dict[str, str] = {}
    for item in items:
        name, colon, value = item.partition(":")
        name, value = name.strip(), value.strip()
        if not colon or not valid_header(name, value):
            raise ConfigError(f"--prometheus-header {printable(item, 80)!r}: expected 'Name: value' with a header "
                             "name we do not set ourselves (not Host, Content-Type, ...) and a printable value")
        out[name] = value
    return out


# Environment names older than the PROFILER_<FLAG> twins, still read (after the PROFILER_ one).
ENV_PREFIX, CONFIG_ENV = "PROFILER_", "PROFILER_CONFIG"
ENV_TWINS = {"prometheus_url": "PROMETHEUS_URL", "leader_elect_namespace": "POD_NAMESPACE",
             "listen_port": "PROFILER_PORT", "log_level": "LOG_LEVEL", "log_format": "LOG_FORMAT"}


def build_parser() -> argparse.ArgumentParser:
    p = settings.OneLineParser(prog=PROG, description=(
        "Read GPU series back from Prometheus, classify each GPU's usage pattern over a window "
        "(idle, steady, periodic, bursty, growing, unknown) and write it to the Node's annotations. "
        "See docs/profiler.md and docs/annotations.md. Every flag also reads the environment variable "
        "PROFILER_<FLAG> (PROFILER_WINDOW for --window) and the YAML key of its name in --config FILE."))
    settings.add_config_flags(p, CONFIG_ENV)
    g = p.add_argument_group("Prometheus")
    g.add_argument("--prometheus-url", default=None,
                   help="base URL of the Prometheus HTTP API, e.g. http://prometheus:9090 (env PROMETHEUS_URL)")
    g.add_argument("--prometheus-token-file", help="file holding a bearer token, re-read on every request")
    g.add_argument("--prometheus-ca-file", help="CA bundle to verify an https Prometheus")
    g.add_argument("--prometheus-timeout", default="10s",
                   help="deadline of one HTTP attempt, from connect to the last byte (default 10s)")
    g.add_argument("--prometheus-max-response-bytes", default="16MiB",
                   help="largest answer read; a longer one is refused unread (default 16MiB; B, KiB, MiB, GiB)")
    g.add_argument("--prometheus-max-parse-bytes", default="32MiB",
                   help="memory one answer may take to parse; a larger one is refused while read and its shard "
                        "asked in halves (default 32MiB; bounds the profiler's memory, docs/profiler.md)")
    g.add_argument("--prometheus-max-query-bytes", default="16KiB",
                   help="longest query expression sent; longer ones are cut into more queries (default 16KiB, "
                        "VictoriaMetrics' -search.maxQueryLen; at least 8KiB; docs/profiler.md)")
    g.add_argument("--prometheus-latency-offset", default="0s",
                   help="evaluate each cycle this long before now, so that no answer holds points the store is "
                        "still filling in: 30s for VictoriaMetrics (its -search.latencyOffset; default 0s)")
    g.add_argument("--prometheus-header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="extra request header, repeatable (e.g. 'X-Scope-OrgID: team-a' for Mimir or Cortex)")
    g.add_argument("--prometheus-retries", default="2", help="extra attempts after a transient failure (default 2)")
    g.add_argument("--source", default="auto",
                   help="whose GPU series to read: gpu-exporter, dcgm (NVIDIA dcgm-exporter), amd (ROCm "
                        "device-metrics-exporter), or auto: whichever Prometheus holds, ours first on a node "
                        "with both (env PROFILER_SOURCE, default auto)")
    g.add_argument("--source-job", default=sources.DEFAULT_JOBS,
                   help="scrape jobs (a regular expression) whose series may name their node themselves "
                        "(Hostname, hostname, gpu_host_info) where the scrape sets no node label (env "
                        f"PROFILER_SOURCE_JOB, default {sources.DEFAULT_JOBS})")
    g.add_argument("--source-namespace", default=sources.DEFAULT_NAMESPACES,
                   help="namespaces (a regular expression; empty matches series without one) of those "
                        "series (env PROFILER_SOURCE_NAMESPACE, default "
                        f"{sources.DEFAULT_NAMESPACES})")
    g.add_argument("--node-label", default="node",
                   help="label holding the Kubernetes node name on GPU series (default node; series "
                        "without it are joined to gpu_host_info on instance)")
    c = p.add_argument_group("classification")
    c.add_argument("--window", default="30m", help="history each classification looks at (default 30m)")
    c.add_argument("--step", default="auto",
                   help="resolution of the utilisation range; auto: each GPU's own scrape interval (default)")
    c.add_argument("--hysteresis", default="2",
                   help="consecutive evaluations a new classification must hold before it is written (default 2)")
    c.add_argument("--idle-util", default="0.30",
                   help="idle-GPU count: window-mean utilisation below this ratio (default 0.30)")
    c.add_argument("--idle-mem", default="0.50",
                   help="idle-GPU count: window-mean memory used below this ratio (default 0.50)")
    k = p.add_argument_group("Kubernetes")
    k.add_argument("--annotation-prefix", default="gpu-exporter.io",
                   help="annotation key prefix (default gpu-exporter.io)")
    k.add_argument("--max-gpus-per-node", default="64",
                   help="GPUs annotated per node, lowest ids first; more are counted in omitted-gpus (default 64)")
    k.add_argument("--max-annotation-bytes", default="16384",
                   help="bound on our annotation keys and values per node; GPUs beyond it are left out from the "
                        "highest id and counted in omitted-gpus (default 16384, 2048 to 131072)")
    k.add_argument("--kubeconfig", help="kubeconfig file; default: in-cluster service account, else $KUBECONFIG")
    k.add_argument("--node-selector", help="label selector limiting the nodes listed and annotated")
    k.add_argument("--dry-run", action="store_true",
                   help="print the merge patches (one JSON document per line) instead of sending them")
    e = p.add_argument_group("replicas and Events")
    e.add_argument("--leader-elect", action="store_true",
                   help="run as one of several replicas: only the holder of a coordination.k8s.io/v1 Lease "
                        "reads and writes (not with --once or --dry-run)")
    e.add_argument("--leader-elect-namespace", default=None,
                   help="namespace of the Lease and of the Events (env POD_NAMESPACE; default: the service "
                        "account's namespace)")
    e.add_argument("--leader-elect-lease-name", default="gpu-exporter-profiler", help="name of the Lease")
    e.add_argument("--leader-elect-lease-duration", default="15s",
                   help="how long a silent leader's Lease is honoured before another replica takes over (default 15s)")
    e.add_argument("--leader-elect-renew-deadline", default="10s",
                   help="a leader that could not renew for this long stops writing (default 10s)")
    e.add_argument("--leader-elect-retry-period", default="2s",
                   help="time between attempts to acquire or renew the Lease (default 2s)")
    e.add_argument("--events", default="on", help="on or off: Events on a Node when a GPU turns growing or "
                                                  "allocated-idle (default on; not in a dry run)")
    e.add_argument("--health-condition", default="on",
                   help="on or off: set the GPUHealthy condition on each GPU node (needs RBAC patch on "
                        "nodes/status; env PROFILER_HEALTH_CONDITION, default on)")
    e.add_argument("--xid-severity", action="append", default=[], metavar="CODE=SEVERITY",
                   help="override an XID's severity from NVIDIA's catalogue: fatal (GPUHealthy False), warn (listed "
                        "in the message, still True) or ignore; repeatable or comma-separated, e.g. 13=fatal,79=warn "
                        "(a YAML list in --config)")
    e.add_argument("--device-taints", default="off",
                   help="on or off: on DRA clusters, a DeviceTaintRule (effect NoSchedule) for each failed or hung "
                        "GPU's devices, removed once it is healthy for --hysteresis cycles (needs "
                        "--health-condition on and the RBAC of the device-taints install; default off)")
    e.add_argument("--events-burst", default="25",
                   help="Events a node may get at once before its budget limits it (default 25, as client-go)")
    e.add_argument("--events-refill", default="5m",
                   help="each node gets one Event back per this interval, up to --events-burst (default 5m, as "
                        "client-go); one summary Event per cycle counts those suppressed")
    e.add_argument("--events-per-minute", default=None,
                   help="removed (issue 35): Events are limited per node, see --events-burst and --events-refill")
    r = p.add_argument_group("running")
    r.add_argument("--once", action="store_true", help="run one cycle and exit (cron style)")
    r.add_argument("--at", help="with --once: evaluate at this unix time instead of now (replay a past "
                                "window, e.g. with --dry-run after an incident)")
    r.add_argument("--interval", default="60s",
                   help="time between cycles (env PROFILER_INTERVAL, default 60s)")
    # One rule for both daemons: this machine only unless told otherwise (the manifests pass 0.0.0.0).
    r.add_argument("--listen-address", default="127.0.0.1",
                   help="address of /metrics and /healthz (default 127.0.0.1, this machine only; 0.0.0.0 or :: "
                        "listens on all addresses)")
    r.add_argument("--listen-port", default="9401",
                   help="port of /metrics and /healthz (env PROFILER_PORT, default 9401)")
    r.add_argument("--web.config.file", dest="web_config_file", default=None,
                   help="TLS and basic auth of /metrics and /healthz, in the exporter-toolkit format, as for "
                        "gpu-exporter serve (env PROFILER_WEB_CONFIG_FILE; docs/security.md)")
    r.add_argument("--log-level", default="info",
                   help="debug, info, warning or error (env LOG_LEVEL, default info)")
    r.add_argument("--log-format", default="text",
                   help="text or json, one object per line (env LOG_FORMAT, default text)")
    return p


@dataclass
class ProfilerSettings:
    prometheus_url: str
    token_file: str | None
    ca_file: str | None
    headers: dict[str, str]
    max_response_bytes: int
    max_parse_bytes: int
    timeout_s: float
    retries: int
    query: QueryConfig
    latency_offset_s: float
    plan: PlanConfig
    kubeconfig: str | None
    node_selector: str | None
    dry_run: bool
    once: bool
    at: float | None
    interval_s: float
    listen_address: str
    listen_port: int
    log_level: str
    log_format: str
    election: ElectionConfig | None = None
    events: bool = True
    device_taints: bool = False
    events_burst: int = 25
    events_refill_s: float = 300.0
    web: WebConfig | None = None  # --web.config.file: TLS and basic auth of /metrics and /healthz
    health: bool = True
    check_config: bool = False
    described: str = ""  # --check-config: the settings in effect


def _namespace(flag_value: str | None) -> str:
    if flag_value:
        return flag_value
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            ns = f.read().strip()
            if ns:
                return ns
    except OSError:
        pass
    return "default"


def _election(a: argparse.Namespace) -> ElectionConfig | None:
    if not a.leader_elect:
        return None
    if a.once or a.dry_run:
        raise ConfigError("--leader-elect: only for the loop (not with --once or --dry-run)")
    ns = _namespace(a.leader_elect_namespace)
    if not _DNS_LABEL.match(ns):
        raise ConfigError(f"--leader-elect-namespace {ns!r}: must be a Kubernetes namespace name")
    if not _DNS_SUBDOMAIN_NAME.match(a.leader_elect_lease_name):
        raise ConfigError(f"--leader-elect-lease-name {a.leader_elect_lease_name!r}: must be a lowercase DNS "
                         "subdomain such as gpu-exporter-profiler")
    identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    cfg = ElectionConfig(
        namespace=ns, name=a.leader_elect_lease_name, identity=identity[:128],
        lease_duration_s=parse_duration("--leader-elect-lease-duration", a.leader_elect_lease_duration, 1, 3600),
        renew_deadline_s=parse_duration("--leader-elect-renew-deadline", a.leader_elect_renew_deadline, 0.5, 3600),
        retry_period_s=parse_duration("--leader-elect-retry-period", a.leader_elect_retry_period, 0.1, 600),
    )
    problem = cfg.problem()
    if problem:
        raise ConfigError(f"--leader-elect-*: {problem}")
    return cfg


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_DNS_SUBDOMAIN_NAME = re.compile(r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


def parse_args(argv: list[str]) -> ProfilerSettings:
    """Parse and validate flags, environment and config file; raises ConfigError with a one-line message."""
    p = build_parser()
    p.set_defaults(**settings.layered_defaults(p, argv, ENV_PREFIX, CONFIG_ENV, ENV_TWINS))
    a = p.parse_args(argv)
    if not a.prometheus_url:
        raise ConfigError("--prometheus-url is required (or set PROMETHEUS_URL), e.g. http://prometheus:9090")
    if not is_base_url(a.prometheus_url):
        raise ConfigError(f"--prometheus-url {a.prometheus_url!r}: expected http://host:port or https://host:port")
    for flag, path in (("--prometheus-token-file", a.prometheus_token_file),
                       ("--prometheus-ca-file", a.prometheus_ca_file), ("--kubeconfig", a.kubeconfig)):
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"{flag} {path!r}: no such file")
    window = parse_duration("--window", a.window, 300, 86400)
    step: float | None = None
    if a.step != "auto":
        step = parse_duration("--step", a.step, 1, window / 16)
    if not _LABEL.match(a.node_label):
        raise ConfigError(f"--node-label {a.node_label!r}: must be a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
    if not valid_prefix(a.annotation_prefix):
        raise ConfigError(f"--annotation-prefix {a.annotation_prefix!r}: must be a lowercase DNS subdomain "
                         "such as gpu-exporter.io (at most 253 characters)")
    if a.source not in sources.CHOICES:
        raise ConfigError(f"--source {a.source!r}: must be one of {', '.join(sources.CHOICES)}")
    try:
        trust = sources.Trust(job=a.source_job, namespace=a.source_namespace)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    level = a.log_level.lower()
    if level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"--log-level {a.log_level!r}: must be one of debug, info, warning, error")
    if a.log_format not in ("text", "json"):
        raise ConfigError(f"--log-format {a.log_format!r}: must be text or json")
    if a.events_per_minute is not None:
        raise ConfigError(f"--events-per-minute {a.events_per_minute!r}: removed; Events are now limited per node "
                          "(--events-burst, default 25, and --events-refill, default 5m)")
    th = Thresholds(node_idle_util=_ratio("--idle-util", a.idle_util), node_idle_mem=_ratio("--idle-mem", a.idle_mem))
    return ProfilerSettings(
        prometheus_url=a.prometheus_url,
        token_file=a.prometheus_token_file,
        ca_file=a.prometheus_ca_file,
        headers=_headers(a.prometheus_header),
        max_response_bytes=_size("--prometheus-max-response-bytes", a.prometheus_max_response_bytes,
                                 64 * 1024, 1024**3),
        max_parse_bytes=_size("--prometheus-max-parse-bytes", a.prometheus_max_parse_bytes, 1024**2, 1024**3),
        timeout_s=parse_duration("--prometheus-timeout", a.prometheus_timeout, 0.1, 600),
        retries=_int("--prometheus-retries", a.prometheus_retries, 0, 10),
        query=QueryConfig(window_s=window, step_s=step, node_label=a.node_label, thresholds=th,
                          fresh_s=min(300.0, window / 2), source=a.source, trust=trust,
                          health=_on_off("--health-condition", a.health_condition),
                          xid_severity=_xid_severity(a.xid_severity),
                          max_query_bytes=_size("--prometheus-max-query-bytes", a.prometheus_max_query_bytes,
                                                MIN_QUERY_BYTES, 1024**3)),
        latency_offset_s=parse_duration("--prometheus-latency-offset", a.prometheus_latency_offset, 0, 3600),
        plan=PlanConfig(prefix=a.annotation_prefix, hysteresis=_int("--hysteresis", a.hysteresis, 1, 100),
                        thresholds=th,
                        max_gpus_per_node=_int("--max-gpus-per-node", a.max_gpus_per_node, 1, 4096),
                        max_annotation_bytes=_int("--max-annotation-bytes", a.max_annotation_bytes, 2048, 131072)),
        kubeconfig=a.kubeconfig,
        node_selector=a.node_selector,
        dry_run=a.dry_run,
        once=a.once,
        at=_at(a.at, a.once),
        interval_s=parse_duration("--interval", a.interval, 1, 86400),
        listen_address=a.listen_address,
        listen_port=_int("--listen-port", a.listen_port, 0, 65535),
        log_level=level,
        log_format=a.log_format,
        election=_election(a),
        events=_on_off("--events", a.events),
        device_taints=_device_taints(a),
        events_burst=_int("--events-burst", a.events_burst, 1, 1000),
        events_refill_s=parse_duration("--events-refill", a.events_refill, 1, 86400),
        web=_web_config(a.web_config_file),
        health=_on_off("--health-condition", a.health_condition),
        check_config=a.check_config,
        described=settings.describe(p, a, ENV_PREFIX) if a.check_config else "",
    )


def _web_config(path: str | None) -> WebConfig | None:
    """``--web.config.file``, loaded and checked now: a bad one is a usage error, never a server without auth."""
    if not path:
        return None
    from exporter.platform.webconfig import load

    try:
        return load(path)
    except ConfigError as exc:
        raise ConfigError(f"--web.config.file: {exc}") from None


def _at(value: str | None, once: bool) -> float | None:
    if value is None:
        return None
    if not once:
        raise ConfigError("--at: only with --once")
    try:
        t = float(value)
    except ValueError:
        raise ConfigError(f"--at {value!r}: expected a unix time in seconds, e.g. 1767225600") from None
    if not 946684800 <= t <= 4102444800:  # 2000-01-01 to 2100-01-01; also refuses nan and inf
        raise ConfigError(f"--at {value!r}: must be a unix time between 2000 and 2100")
    return t


def _xid_severity(items: list[str]) -> tuple[tuple[int | str, str], ...]:
    """``["13=fatal,79=warn", "ecc_corrected=warn"]`` -> checked pairs (exporter/core/xid.py)."""
    from exporter.core.xid import XidConfigError, load_overrides

    raw: dict[str, str] = {}
    for item in items:
        for part in filter(None, (p.strip() for p in item.split(","))):
            code, eq, sev = part.partition("=")
            if not eq or not code.strip():
                raise ConfigError(f"--xid-severity {printable(part, 60)!r}: expected CODE=SEVERITY, e.g. 13=fatal")
            if code.strip() in raw:
                raise ConfigError(f"--xid-severity: {printable(code.strip(), 20)} is given twice")
            raw[code.strip()] = sev
    try:
        return tuple(load_overrides(raw, "--xid-severity").items())
    except XidConfigError as exc:
        raise ConfigError(str(exc)) from None


def _device_taints(a: argparse.Namespace) -> bool:
    on = _on_off("--device-taints", a.device_taints)
    if on and not _on_off("--health-condition", a.health_condition):
        raise ConfigError("--device-taints on: needs --health-condition on (the rules follow the GPUs' health)")
    return on


def _on_off(flag: str, value: str) -> bool:
    v = value.strip().lower()
    if v not in ("on", "off", "true", "false", "1", "0"):
        raise ConfigError(f"{flag} {value!r}: must be on or off")
    return v in ("on", "true", "1")


def build_profiler(s: ProfilerSettings, out: IO[str] | None = None) -> Profiler:
    """Objects for ``s``; the Kubernetes client is optional only in a dry run."""
    client = PromClient(s.prometheus_url, timeout=s.timeout_s, retries=s.retries, token_file=s.token_file,
                        ca_file=s.ca_file, headers=s.headers, max_response_bytes=s.max_response_bytes,
                        max_parse_bytes=s.max_parse_bytes, max_query_bytes=s.query.max_query_bytes)
    store: NodeStore | None = None
    api: Any = None
    try:
        api = kube.api_client(s.kubeconfig, who=PROG)
        store = NodeStore(api, label_selector=s.node_selector, keep_prefix=s.plan.prefix)
    except (KubeError, kube.NoKubeConfig) as exc:
        if not s.dry_run:
            raise
        log.warning("dry run without a cluster (%s): planning from Prometheus alone, as if no node carried "
                    "annotations yet", exc)
    elector = None
    events = None
    if api is not None:
        ns = s.election.namespace if s.election else _namespace(None)
        if s.election is not None:
            # the replica's identity in the API server's audit log and in tests' request records
            api.user_agent = f"gpu-exporter-profiler/{s.election.identity}"
            elector = LeaderElector(LeaseClient(api, ns, s.election.name), s.election)
        if s.events and not s.dry_run:
            pod = os.environ.get("POD_NAME", "")
            summary = {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": pod} if pod else None
            events = EventRecorder(api, ns, burst=s.events_burst, refill_s=s.events_refill_s,
                                   summary_object=summary)
    taints = None
    if s.device_taints and api is not None:
        taints = DeviceTaints(api, hysteresis=s.plan.hysteresis, dry_run=s.dry_run, out=out or sys.stdout,
                              is_leader=elector.is_leader if elector is not None else None)
    elif s.device_taints:
        log.warning("--device-taints: no cluster in this dry run: no DeviceTaintRule is planned")
    return Profiler(Reader(client, s.query), store, s.plan, dry_run=s.dry_run, out=out, elector=elector,
                    events=events, health=s.health, latency_offset_s=s.latency_offset_s, taints=taints)


def run(argv: list[str], out: IO[str] | None = None,
        install_signals: bool = True, stop: threading.Event | None = None,
        on_ready: Callable[[Any], None] | None = None) -> int:
    """Entry point of ``gpu-exporter profile``. ``stop``/``on_ready`` let tests drive the loop."""
    try:
        s = parse_args(argv)
    except ConfigError as exc:
        return fail(PROG, exc)
    if s.check_config:
        sys.stdout.write(s.described)
        return 0
    try:
        require("kubernetes", PROG)  # an extra since issue 28: `make run` does not install it
    except MissingExtra as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 2
    logs.setup(s.log_level, s.log_format)
    try:
        prof = build_profiler(s, out)
    except (KubeError, kube.NoKubeConfig, ValueError) as exc:
        log.error("%s", exc)
        return 1
    if s.once:
        res = prof.run_cycle(at=s.at)
        return 0 if res.ok else 1

    stop = stop or threading.Event()
    thread = threading.Thread(target=prof.loop, args=(s.interval_s, stop), name="profiler-loop", daemon=True)
    election_stop = threading.Event()
    election = None
    if prof.elector is not None:
        election = threading.Thread(target=prof.elector.run, args=(election_stop,), name="leader-election",
                                    daemon=True)
    health = Health(prof, s.interval_s, stall_after_s=max(120.0, 2 * s.interval_s), thread=thread)
    try:
        server = make_server(s.listen_address, s.listen_port, prof.metrics, health, web=s.web)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s%s", s.listen_address, s.listen_port, exc.strerror or exc,
                  "; pick another with --listen-port (PROFILER_PORT)" if exc.errno == errno.EADDRINUSE else "")
        return 1
    if install_signals:
        def _stop(signum: int) -> None:
            log.info("signal %d: stopping", signum)
            stop.set()

        daemon.install_signals(server, _stop)  # SIGTERM, SIGINT; SIGHUP reloads --web.config.file
    server_thread = threading.Thread(target=server.serve_forever, name="profiler-http", daemon=True)
    server_thread.start()
    thread.start()
    if election is not None:
        election.start()
    log.info("profiler: %s every %s, window %s, /metrics on %s:%d%s%s", s.prometheus_url, _fmt_dur(s.interval_s),
             _fmt_dur(s.query.window_s), s.listen_address, server.server_address[1],
             " (dry run)" if prof.dry_run else "",
             "; this machine only: --listen-address 0.0.0.0 (or ::) listens on all addresses"
             if s.listen_address in ("127.0.0.1", "::1", "localhost") else "")
    if on_ready is not None:
        on_ready({"port": server.server_address[1], "profiler": prof, "health": health, "stop": stop})
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
        if election is not None:
            election_stop.set()  # after the loop: the lease is released once writes are over
            election.join(timeout=10)
    return 0
