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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from exporter.core import logs
from exporter.core.extras import MissingExtra, require
from exporter.core.options import Setting
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
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_DNS_SUBDOMAIN_NAME = re.compile(r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


def _url(v: object) -> str:
    s = str(v).strip()
    if not is_base_url(s):
        raise ValueError("expected http://host:port or https://host:port")
    return s


def _header(v: object) -> tuple[str, str]:
    """``'X-Scope-OrgID: a'`` -> (name, value); a malformed or reserved header is refused."""
    name, colon, value = str(v).partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not valid_header(name, value):
        raise ValueError("expected 'Name: value' with a header name we do not set ourselves (not Host, "
                         "Content-Type, ...) and a printable value")
    return name, value


def _step(v: object) -> float | None:
    if str(v).strip().lower() == "auto":
        return None
    try:
        return units.parse_duration(str(v).strip())
    except ValueError:
        raise ValueError("expected auto or a duration such as 30s or 1m") from None


def _regex(flag: str) -> Callable[[object], str]:
    def parse(v: object) -> str:
        try:
            return sources.check_regex(flag, str(v))
        except ValueError as exc:  # its text names the flag and the value, which the loader's line names too
            raise ValueError(str(exc).split(": ", 1)[-1]) from None

    return parse


def _matching(ok: Callable[[str], object], allowed: str) -> Callable[[object], str]:
    """A text setting that ``ok`` accepts, else ValueError(allowed)."""
    def parse(v: object) -> str:
        s = str(v).strip()
        if not ok(s):
            raise ValueError(allowed)
        return s

    return parse


def _unix_time(v: object) -> float:
    allowed = "expected a unix time in seconds between 2000 and 2100, e.g. 1767225600"
    try:
        t = float(str(v).strip())
    except ValueError:
        raise ValueError(allowed) from None
    if not 946684800 <= t <= 4102444800:  # 2000-01-01 to 2100-01-01; also refuses nan and inf
        raise ValueError(allowed)
    return t


def _removed(instead: str) -> Callable[[object], Any]:
    def parse(v: object) -> Any:
        raise ValueError(f"removed; {instead}")

    return parse


ENV_PREFIX, CONFIG_ENV = "PROFILER_", "PROFILER_CONFIG"


def _row(name: str, kind: str, help_: str, default: Any = None, flag: str | None = None,
         twins: tuple[str, ...] = (), **kw: Any) -> Setting:
    """A row whose flag is ``--<name with dashes>`` and whose env twin is ``PROFILER_<NAME>``."""
    return Setting(name, flag or "--" + name.replace("_", "-"), ENV_PREFIX + name.upper(), kind, help_,
                   default, twins=twins, **kw)


def _custom(name: str, parse: Callable[[object], Any], help_: str, default: Any = None, **kw: Any) -> Setting:
    return _row(name, "custom", help_, default, parse=parse, **kw)


# Every setting of ``gpu-exporter profile``: flag, env twin (and the older names still read after it),
# YAML key, kind, default and docs text, once each (docs/profiler.md's table is generated from them:
# python -m exporter.settings_docs --write-docs).
ROWS: tuple[Setting, ...] = (
    _custom("prometheus_url", _url, "base URL of the Prometheus HTTP API, e.g. http://prometheus:9090",
            twins=("PROMETHEUS_URL",),
            doc="base URL of the HTTP API; a path prefix is kept (`http://host/prometheus`)",
            shown="(required)"),
    _row("prometheus_token_file", "file", "file holding a bearer token, re-read on every request",
         doc="bearer token, re-read on every request (projected tokens rotate)"),
    _row("prometheus_ca_file", "file", "CA bundle to verify an https Prometheus",
         doc="CA bundle for an `https` Prometheus",
         shown="system CAs"),
    _row("prometheus_timeout", "seconds", "deadline of one HTTP attempt, from connect to the last byte", 10.0,
         low=0.1, high=600,
         doc="one deadline per HTTP attempt, from connect to the last byte: a server that trickles its "
             "answer is cut off at it"),
    _row("prometheus_max_response_bytes", "size", "largest answer read; a longer one is refused unread",
         16 << 20, low=64 << 10, high=1 << 30,
         doc="the largest answer read (64KiB to 1GiB; sizes as Kubernetes quantities, `16M` is 10^6 x 16: "
             "[cli.md](cli.md#sizes-and-durations)); a longer one is refused before it is parsed "
             "(`prometheus_response_too_large`) and the shard or batch that asked for it is split in two"),
    _row("prometheus_max_parse_bytes", "size", "memory one answer may take to parse; a larger one is refused "
         "while read and its shard asked in halves (bounds the profiler's memory, docs/profiler.md)",
         32 << 20, low=1 << 20, high=1 << 30,
         doc="memory one answer may take to parse and convert (1MiB to 1GiB), counted from its tokens "
             "while it is read; a larger one is refused (`prometheus_response_too_large`) and its shard "
             "or batch split. Bounds the profiler's memory (see the hostile-server list below)"),
    _row("prometheus_max_query_bytes", "size", "longest query expression sent; longer ones are cut into more queries "
         "(VictoriaMetrics' -search.maxQueryLen; docs/profiler.md)", 16 << 10, low=MIN_QUERY_BYTES, high=1 << 30,
         doc="the longest query expression sent (8KiB to 1GiB): a shard's aggregates are cut into more "
             "queries rather than exceed it, range batches hold as many UUIDs as fit, and a longer query "
             "is refused before it is sent (`prometheus_query_too_long`). Set it to the store's limit: "
             "VictoriaMetrics' `-search.maxQueryLen` (default 16 KiB), Mimir's "
             "`max_query_expression_size_bytes` ([Bytes per query](#queries))"),
    _row("prometheus_latency_offset", "seconds", "evaluate each cycle this long before now, so that no answer holds "
         "points the store is still filling in: 30s for VictoriaMetrics (its -search.latencyOffset)", 0.0,
         high=3600,
         doc="evaluate each cycle this long before now, so that no answer holds points the store is still "
             "filling in: `30s` for VictoriaMetrics (its `-search.latencyOffset`, "
             "[Stores](#stores-victoriametrics-thanos-mimir))"),
    _custom("prometheus_header", _header, "extra request header 'NAME: VALUE', repeatable (e.g. "
            "'X-Scope-OrgID: team-a' for Mimir or Cortex)", (), repeat=True,
            doc="`'Name: value'`, repeatable: an extra header on every request, e.g. `'X-Scope-OrgID: "
                "team-a'` for Mimir, Cortex or a Thanos tenancy proxy (see "
                "[Stores](#stores-victoriametrics-thanos-mimir))"),
    _row("prometheus_retries", "integer", "extra attempts after a transient failure", 2, high=10,
         doc="extra attempts after a connection error, timeout, 5xx or 429, with exponential backoff and "
             "full jitter"),
    _row("source", "choice", "whose GPU series to read: gpu-exporter, dcgm (NVIDIA dcgm-exporter), amd (ROCm "
         "device-metrics-exporter), or auto: whichever Prometheus holds, ours first on a node with both",
         "auto", choices=tuple(sources.CHOICES),
         doc="whose GPU series to read: `gpu-exporter`, `dcgm` (NVIDIA dcgm-exporter), `amd` (ROCm "
             "device-metrics-exporter) or `auto` (see [Sources](#sources))"),
    _custom("source_job", _regex("--source-job"), "scrape jobs (a regular expression) whose series may name their "
            "node themselves (Hostname, hostname, gpu_host_info) where the scrape sets no node label",
            sources.DEFAULT_JOBS,
            doc="scrape jobs (a regular expression, fully anchored) whose series may name their own node "
                "(`Hostname`, `hostname`, `kubernetes_node`, `gpu_host_info{node}`) where the scrape sets "
                "no node label (see [Node identity](#node-identity))"),
    _custom("source_namespace", _regex("--source-namespace"), "namespaces (a regular expression; empty matches "
            "series without one) of those series", sources.DEFAULT_NAMESPACES,
            doc="namespaces of those series (a regular expression; the empty alternative matches series "
                "without a `namespace` label)"),
    _custom("node_label", _matching(_LABEL.match, "expected a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"),
            "label holding the Kubernetes node name on GPU series (series without it are "
            "joined to gpu_host_info on instance)", "node",
            doc="label holding the node name on GPU series, set by the scrape (see [Node "
                "identity](#node-identity))"),
    _row("window", "seconds", "history each classification looks at", 1800.0, low=300, high=86400,
         doc="history each classification looks at (5m to 24h)"),
    _custom("step", _step, "resolution of the utilisation range, at most a sixteenth of the window; auto: each "
            "GPU's own scrape interval (default auto)",
            doc="resolution of the utilisation range; `auto` is each GPU's own scrape interval: window / "
                "(samples - 0.5) (the denser half of the window instead when the halves differ by more "
                "than a tenth: a GPU that appeared mid-window), snapped to a usual interval (1, 2, 3, 5, "
                "10, 15, 20, 30, 45, 60, 90, 120 s, ...) within 12% so that a few missed scrapes do not "
                "stretch it, else rounded to a whole second (at least 5 s and window/500): a step even "
                "slightly longer than the scrape interval skips a sample now and then, and that beat "
                "looks like a period. It is the GPU's own, never a median of the GPUs that share its "
                "shard: that made a GPU's pattern depend on the fleet's size "
                "(tests/unit/profiler/test_fleet_size.py)",
            shown="`auto`"),
    _row("hysteresis", "integer", "consecutive evaluations a new classification must hold before it is written",
         2, low=1, high=100,
         doc="consecutive evaluations a new classification must hold before it is written"),
    _row("idle_util", "ratio", "idle-GPU count: window-mean utilisation below this ratio", 0.30, high=1.0,
         doc="the idle-GPU count's rule: window-mean utilisation below this ratio"),
    _row("idle_mem", "ratio", "idle-GPU count: window-mean memory used below this ratio", 0.50, high=1.0,
         doc="the idle-GPU count's rule: window-mean memory used below this ratio of the total"),
    _custom("annotation_prefix", _matching(valid_prefix, "expected a lowercase DNS subdomain such as "
                                           "gpu-exporter.io (at most 253 characters)"),
            "annotation key prefix", "gpu-exporter.io",
            doc="a lowercase DNS subdomain"),
    _row("max_gpus_per_node", "integer", "GPUs annotated per node, lowest ids first; more are counted in "
         "omitted-gpus", 64, low=1, high=4096,
         doc="GPUs annotated per node (lowest ids); the rest counted in `omitted-gpus`"),
    _row("max_annotation_bytes", "integer", "bound on our annotation keys and values per node; GPUs beyond it "
         "are left out from the highest id and counted in omitted-gpus", 16384, low=2048, high=131072,
         doc="bound on our keys and values per node (2048 to 131072)"),
    _row("kubeconfig", "file", "kubeconfig file; default: in-cluster service account, else $KUBECONFIG",
         doc="order: this flag, the in-cluster service account, then `$KUBECONFIG` / `~/.kube/config`. "
             "Credentials are refreshed at most once a second (the projected service-account token, or an "
             "exec plugin's once expired), not before every request",
         shown="in-cluster"),
    _row("node_selector", "text", "label selector limiting the nodes listed and annotated",
         doc="label selector for the node list (e.g. `nvidia.com/gpu.present=true`)",
         shown="all nodes"),
    _row("dry_run", "bool", "print the merge patches (one JSON document per line) instead of sending them", False,
         doc="print the merge patches instead of sending them (works without a cluster, see below)"),
    _row("leader_elect", "bool", "run as one of several replicas: only the holder of a coordination.k8s.io/v1 "
         "Lease reads and writes (not with --once or --dry-run)", False,
         doc="run as one of several replicas (see [Replicas](#replicas)); the shipped Deployment sets it"),
    _custom("leader_elect_namespace", _matching(_DNS_LABEL.match, "expected a Kubernetes namespace name"),
            "namespace of the Lease and of the Events (default: the service account's namespace)",
            twins=("POD_NAMESPACE",),
            doc="namespace of the Lease and of the Events",
            shown="the service account's"),
    _custom("leader_elect_lease_name", _matching(_DNS_SUBDOMAIN_NAME.match, "expected a lowercase DNS subdomain "
                                                 "such as gpu-exporter-profiler"),
            "name of the Lease", "gpu-exporter-profiler"),
    _row("leader_elect_lease_duration", "seconds", "how long a silent leader's Lease is honoured before another "
         "replica takes over", 15.0, low=1, high=3600,
         doc="as client-go's: how long a silent leader's Lease is honoured; at least "
             "`--leader-elect-renew-deadline` plus `--leader-elect-retry-period`"),
    _row("leader_elect_renew_deadline", "seconds", "a leader that could not renew for this long stops writing",
         10.0, low=0.5, high=3600,
         doc="as client-go's: a leader that could not renew for this long stops writing"),
    _row("leader_elect_retry_period", "seconds", "time between attempts to acquire or renew the Lease", 2.0,
         low=0.1, high=600,
         doc="as client-go's: time between attempts to acquire or renew the Lease"),
    _row("events", "bool", "on or off: Events on a Node when a GPU turns growing or allocated-idle (not in a "
         "dry run)", True,
         doc="Events on a Node when a GPU turns `growing` or `allocated-idle`, and on each transition of "
             "`GPUHealthy` (see [Events](#events))"),
    _row("health_condition", "bool", "on or off: set the GPUHealthy condition on each GPU node (needs RBAC patch "
         "on nodes/status)", True,
         doc="set the `GPUHealthy` Node condition (see [GPU "
             "health](#gpu-health-the-gpuhealthy-node-condition)); needs `patch` on `nodes/status`"),
    _row("xid_severity", "text", "override an XID's severity from NVIDIA's catalogue: CODE=SEVERITY, fatal "
         "(GPUHealthy False), warn (listed in the message, still True) or ignore; repeatable or comma-separated, "
         "e.g. 13=fatal,79=warn (a YAML list in --config)", (), repeat=True,
         doc="`CODE=fatal|warn|ignore`, repeatable: an XID's severity for `GPUHealthy` (see [GPU "
             "health](#gpu-health-the-gpuhealthy-node-condition))",
         shown="NVIDIA's catalogue"),
    _row("device_taints", "bool", "on or off: on DRA clusters, a DeviceTaintRule (effect NoSchedule) for each "
         "failed or hung GPU's devices, removed once it is healthy for --hysteresis cycles (needs --health-condition "
         "on and the RBAC of the device-taints install)", False,
         doc="on DRA clusters, a `DeviceTaintRule` for each failed GPU's devices (see [Device "
             "taints](#device-taints))"),
    _row("events_burst", "integer", "Events a node may get at once before its budget limits it (as client-go)",
         25, low=1, high=1000,
         doc="each node's Event budget: this many at once, then one back per `--events-refill` "
             "(client-go's spam filter)"),
    _row("events_refill", "seconds", "each node gets one Event back per this interval, up to --events-burst (as "
         "client-go); one summary Event per cycle counts those suppressed", 300.0, low=1, high=86400,
         doc="each node gets one Event back per this interval, up to `--events-burst`; one summary Event "
             "per cycle counts those suppressed"),
    _custom("events_per_minute", _removed("Events are now limited per node (--events-burst, default 25, and "
                                          "--events-refill, default 5m)"),
            "removed (issue 35): Events are limited per node, see --events-burst and --events-refill",
            doc="removed (issue 35: it was a fleet-wide limit); refused with exit 2: Events are limited "
                "per node by `--events-burst` and `--events-refill`"),
    _row("once", "bool", "run one cycle and exit (cron style)", False,
         doc="one cycle, then exit: 0 if it had no error, 1 otherwise (for a CronJob)"),
    _custom("at", _unix_time, "with --once: evaluate at this unix time instead of now (replay a past window, "
            "e.g. with --dry-run after an incident)",
            doc="with `--once`: evaluate at this unix time (replay a past window, e.g. with `--dry-run` "
                "after an incident)",
            shown="now"),
    _row("interval", "seconds", "time between cycles", 60.0, low=1, high=86400,
         doc="start-to-start time between cycles"),
    # One rule for both daemons: this machine only unless told otherwise (the manifests pass 0.0.0.0).
    _custom("listen_address", settings.parse_address, "address of /metrics and /healthz (default 127.0.0.1, this "
            "machine only; 0.0.0.0 or :: listens on all addresses)", "127.0.0.1",
            doc="`/metrics`, `/healthz` (not in `--once`); this machine only unless told otherwise, as "
                "`serve` (the Deployment passes `--listen-address=0.0.0.0`)"),
    _row("listen_port", "integer", "port of /metrics and /healthz", 9401, high=65535, twins=("PROFILER_PORT",),
         doc="port of `/metrics` and `/healthz` (see `--listen-address`)"),
    _row("probe_port", "integer", "a second port for the kubelet's probes: /healthz only, plain HTTP whatever the web "
         "config, its own connections, so no TLS handshake or greedy client of --listen-port is in a probe's way "
         "(0 = none; docs/security.md)", 0, high=65535,
         doc="a second port for the kubelet's probes: `/healthz` alone, plain HTTP whatever the web "
             "config, with its own connections, so no TLS handshake or greedy client of `--listen-port` "
             "is in a probe's way ([security.md](security.md)); the same port as `--listen-port` exits 2",
         shown="`0` (none)"),
    _row("web_config_file", "path", "TLS and basic auth of /metrics and /healthz, in the exporter-toolkit "
         "format, as for gpu-exporter serve; SIGHUP reloads it (docs/security.md)", flag="--web.config.file",
         doc="TLS, client certificates and basic auth of `/metrics` and `/healthz`, in the "
             "exporter-toolkit format, as for `serve` ([security.md](security.md)); `/healthz` stays open "
             "to probes without credentials and then says only `ok` / `not ok`. `SIGHUP` reloads it at "
             "once. A bad file exits 2; Helm: `profiler.webConfig.secretName` (and `.tls`), "
             "docs/deploy.md",
         shown="none"),
    _row("log_level", "choice", "debug, info, warning or error", "info", choices=settings.LOG_LEVELS,
         aliases=(("warn", "warning"),), twins=("LOG_LEVEL",),
         doc="`debug`, `info`, `warning` or `error`"),
    _row("log_format", "choice", "text or json, one object per line", "text", choices=("text", "json"),
         twins=("LOG_FORMAT",),
         doc="`text`, or `json`: one object per line"),
)
settings.check_unique(ROWS)
GROUPS = {"prometheus_url": "Prometheus", "window": "classification", "annotation_prefix": "Kubernetes",
          "leader_elect": "replicas and Events", "once": "running"}


def build_parser() -> argparse.ArgumentParser:
    return settings.build_parser(ROWS, PROG, (
        "Read GPU series back from Prometheus, classify each GPU's usage pattern over a window "
        "(idle, steady, periodic, bursty, growing, unknown) and write it to the Node's annotations. "
        "See docs/profiler.md and docs/annotations.md. Every flag also reads the environment variable "
        "PROFILER_<FLAG> (PROFILER_WINDOW for --window) and the YAML key of its name in --config FILE."),
        CONFIG_ENV, GROUPS)


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
    probe_port: int
    log_level: str
    log_format: str
    election: ElectionConfig | None = None
    # the Events' namespace (and the Lease's): --leader-elect-namespace (POD_NAMESPACE), else the service
    # account's, with or without --leader-elect
    namespace: str = "default"
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


def _election(v: dict[str, Any]) -> ElectionConfig | None:
    if not v["leader_elect"]:
        return None
    if v["once"] or v["dry_run"]:
        raise ConfigError("--leader-elect: only for the loop (not with --once or --dry-run)")
    ns = _namespace(v["leader_elect_namespace"])
    if not _DNS_LABEL.match(ns):
        raise ConfigError(f"--leader-elect-namespace {ns!r}: must be a Kubernetes namespace name")
    identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    cfg = ElectionConfig(namespace=ns, name=v["leader_elect_lease_name"], identity=identity[:128],
                         lease_duration_s=v["leader_elect_lease_duration"],
                         renew_deadline_s=v["leader_elect_renew_deadline"],
                         retry_period_s=v["leader_elect_retry_period"])
    problem = cfg.problem()
    if problem:
        raise ConfigError(f"--leader-elect-*: {problem}")
    return cfg




def parse_args(argv: list[str], environ: Mapping[str, str] | None = None) -> ProfilerSettings:
    """Flags, environment and config file (the one loader, over ROWS) -> ProfilerSettings; ConfigError (one line)."""
    loaded = settings.load(ROWS, argv, build_parser(), CONFIG_ENV, environ)
    v = loaded.values
    if not v["prometheus_url"]:
        raise ConfigError("--prometheus-url is required (or set PROMETHEUS_URL), e.g. http://prometheus:9090")
    window = v["window"]
    step = v["step"]
    if step is not None and not 1 <= step <= window / 16:
        most = units.format_duration(window / 16)
        raise settings.invalid(loaded, "step", f"expected auto or a duration between 1s and {most} (a sixteenth of "
                               "--window)")
    if v["at"] is not None and not v["once"]:
        raise ConfigError("--at: only with --once")
    if v["probe_port"] and v["probe_port"] == v["listen_port"]:
        raise ConfigError(f"invalid probe_port = {v['probe_port']}: the same as --listen-port; the probes need a "
                          "port of their own (or 0 for none)")
    if v["device_taints"] and not v["health_condition"]:
        raise ConfigError("--device-taints on: needs --health-condition on (the rules follow the GPUs' health)")
    trust = sources.Trust(job=v["source_job"], namespace=v["source_namespace"])
    th = Thresholds(node_idle_util=v["idle_util"], node_idle_mem=v["idle_mem"])
    return ProfilerSettings(
        prometheus_url=v["prometheus_url"],
        token_file=v["prometheus_token_file"],
        ca_file=v["prometheus_ca_file"],
        headers=dict(v["prometheus_header"]),
        max_response_bytes=v["prometheus_max_response_bytes"],
        max_parse_bytes=v["prometheus_max_parse_bytes"],
        timeout_s=v["prometheus_timeout"],
        retries=v["prometheus_retries"],
        query=QueryConfig(window_s=window, step_s=step, node_label=v["node_label"], thresholds=th,
                          fresh_s=min(300.0, window / 2), source=v["source"], trust=trust,
                          health=v["health_condition"], pci=v["device_taints"],
                          xid_severity=_xid_severity(v["xid_severity"]),
                          max_query_bytes=v["prometheus_max_query_bytes"]),
        latency_offset_s=v["prometheus_latency_offset"],
        plan=PlanConfig(prefix=v["annotation_prefix"], hysteresis=v["hysteresis"], thresholds=th,
                        max_gpus_per_node=v["max_gpus_per_node"], max_annotation_bytes=v["max_annotation_bytes"]),
        kubeconfig=v["kubeconfig"],
        node_selector=v["node_selector"],
        dry_run=v["dry_run"],
        once=v["once"],
        at=v["at"],
        interval_s=v["interval"],
        listen_address=v["listen_address"],
        listen_port=v["listen_port"],
        probe_port=v["probe_port"],
        log_level=v["log_level"],
        log_format=v["log_format"],
        election=_election(v),
        namespace=_namespace(v["leader_elect_namespace"]),
        events=v["events"],
        device_taints=v["device_taints"],
        events_burst=v["events_burst"],
        events_refill_s=v["events_refill"],
        web=_web_config(v["web_config_file"]),
        health=v["health_condition"],
        check_config=loaded.check_config,
        described=settings.describe(ROWS, v) if loaded.check_config else "",
    )


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


def _web_config(path: str | None) -> WebConfig | None:
    """``--web.config.file``, loaded and checked now: a bad one is a usage error, never a server without auth."""
    if not path:
        return None
    from exporter.platform.webconfig import load

    try:
        return load(path)
    except ConfigError as exc:
        raise ConfigError(f"--web.config.file: {exc}") from None


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
        ns = s.election.namespace if s.election else s.namespace
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
        server = make_server(s.listen_address, s.listen_port, prof.metrics, health, web=s.web,
                             probe_port=s.probe_port or None)
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
    log.info("profiler: %s every %s, window %s, /metrics on %s:%d%s%s", s.prometheus_url,
             units.format_duration(s.interval_s),
             units.format_duration(s.query.window_s), s.listen_address, server.server_address[1],
             " (dry run)" if prof.dry_run else "",
             "; this machine only: --listen-address 0.0.0.0 (or ::) listens on all addresses"
             if s.listen_address in ("127.0.0.1", "::1", "localhost") else "")
    if on_ready is not None:
        on_ready({"port": server.server_address[1], "profiler": prof, "health": health, "stop": stop})
    try:
        # Python runs a signal's handler in the main thread only when it next executes bytecode: a signal
        # the kernel delivered to another thread would wait for ever behind a bare stop.wait()
        while not stop.wait(daemon.SIGNAL_POLL_S):
            pass
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
        if election is not None:
            election_stop.set()  # after the loop: the lease is released once writes are over
            election.join(timeout=10)
    return 0
