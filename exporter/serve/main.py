"""``gpu-exporter serve``: pick backends, start the engine and the HTTP server."""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from exporter import backends
from exporter.backends.base import Backend
from exporter.core import logs
from exporter.core.options import BackendOptions
from exporter.platform.errors import ConfigError, fail
from exporter.serve import config

if TYPE_CHECKING:
    from exporter.core.engine import Engine
    from exporter.k8s.podresources import PodAttribution
    from exporter.k8s.resourceslices import ResourceSliceWatch

log = logging.getLogger("exporter")
PROG = "gpu-exporter serve"



def _production_hint() -> str:
    """"Use --backend nvml|amdsmi|... in production": the real backends, from the registry."""
    return f"Use --backend {'|'.join(backends.auto_order())} in production."


def simulated_banner() -> str:
    return ("NO GPU FOUND: serving SIMULATED GPU data (backend=simulated). These numbers are not real. "
            f"{_production_hint()}")


def simulated_chosen(scenario: str) -> str:
    """--backend simulated chosen on purpose: no GPU was looked for, so none was "not found"."""
    return (f"serving SIMULATED GPU data (backend=simulated, scenario {scenario}): these numbers are not real. "
            f"{_production_hint()}")


def options_from(settings: config.Settings) -> BackendOptions:
    return BackendOptions.from_settings(settings)


def choose_backends(settings: config.Settings,
                    options: BackendOptions) -> tuple[list[Backend], backends.Detected | None]:
    """Backends to run, and what ``auto`` found (:class:`~exporter.backends.Detected`: initialised, or with
    its init still running); explicit backends are not initialised yet.

    ``auto`` tries each real backend in order and keeps the first that initialises, or whose init does
    not return within the init deadline (a wedged driver: served stalled, exporter/core/engine.py); it
    falls back to ``simulated`` only with ``--allow-simulated``, with a loud warning.
    Explicit backends are kept even when they fail now: the engine retries their init on
    every collection and reports the failure in gpu_exporter_collector_success.
    """
    from exporter.core.engine import init_deadline

    if settings.backend == "auto":
        found = backends.detect(options, init_deadline(settings.collection_timeout, settings.call_deadline))
        if found.backend is not None:
            if found.hung_init is not None:
                log.warning("backend auto: using %s, stalled: its init did not return within %g s (a wedged "
                            "driver); it is read from the first collection after init returns", found.backend.name,
                            init_deadline(settings.collection_timeout, settings.call_deadline))
            else:
                log.info("backend auto: using %s", found.backend.name)
            return [found.backend], found
        detail = "; ".join(found.reasons) or "no backends known"
        if settings.allow_simulated:
            log.warning("%s (auto-detection: %s)", simulated_banner(), detail)
            return [backends.create("simulated", options)], None
        log.error("no GPU backend available (%s); serving exporter self-metrics only", detail)
        return [], None
    chosen: list[Backend] = []
    for name in settings.backend.split(","):
        b = backends.create(name, options)
        if name == "simulated":
            log.warning("%s", simulated_chosen(settings.simulated_scenario))
        chosen.append(b)
    return chosen, None


def open_engine(settings: config.Settings, options: BackendOptions) -> Engine:
    """The backends chosen (:func:`choose_backends`) in an engine with the settings' timing."""
    from exporter.core.engine import Engine
    from exporter.core.host import host_info

    chosen, found = choose_backends(settings, options)
    engine = Engine(chosen, host_info(), options.fields, settings.collection_interval, settings.collection_timeout,
                    settings.cache_ttl, settings.call_deadline, settings.xid_severity)
    if found is not None and found.backend is not None:
        if found.hung_init is not None:
            engine.adopt_init(found.backend.name, found.hung_init)
        else:
            engine.mark_initialised(found.backend.name)
    return engine


def _pod_attribution_starts(settings: config.Settings) -> bool:
    mode = settings.pod_attribution
    sock = settings.pod_resources_socket
    return mode == "on" or (mode == "auto" and os.path.isdir(os.path.dirname(sock) or "."))


def start_dra(settings: config.Settings, environ: dict[str, str] | None = None) -> ResourceSliceWatch | None:
    """This node's ResourceSlices, for DRA-claimed GPUs (``--dra-attribution``).

    ``on`` without what it needs (NODE_NAME, the kubernetes package, an API configuration, pod
    attribution that starts) is a :class:`ConfigError`; ``auto`` then stays off and says so once.
    The API server itself
    is asked in the background: ``auto`` turns off for good when it serves no ResourceSlices or
    forbids them, ``on`` keeps asking.
    """
    mode = settings.dra_attribution
    if mode == "off" or (mode == "auto" and not _pod_attribution_starts(settings)):
        return None
    env = os.environ if environ is None else environ
    node = env.get("NODE_NAME", "").strip()
    from exporter.core.extras import MissingExtra
    from exporter.platform import kube

    problem = None
    api_client = None
    try:
        if not node:
            raise RuntimeError("NODE_NAME is not set (the DaemonSet sets it from spec.nodeName)")
        api_client = kube.api_client(who="--dra-attribution")  # lazy: only DRA attribution loads the client
    except (MissingExtra, RuntimeError) as exc:
        problem = str(exc)
    if problem is None and not _pod_attribution_starts(settings):
        # on, but the claims would never be read: never accept it and serve without (issue 38)
        problem = (f"needs pod attribution, which --pod-attribution auto leaves off here: the directory of "
                   f"--pod-resources-socket {settings.pod_resources_socket!r} does not exist")
    if problem is not None:
        if mode == "on":
            raise ConfigError(f"--dra-attribution on: {problem}")
        log.info("DRA attribution off (auto): %s", problem)
        return None
    from exporter.k8s.resourceslices import ResourceSliceWatch

    # every backend's DRA drivers and their attributes, as the pod attribution's resources (not only the running ones)
    slices = ResourceSliceWatch(api_client, node, backends.gpu_resources().dra_attributes, auto=mode == "auto")
    slices.start()
    return slices


def start_attribution(settings: config.Settings, engine: Engine,
                      dra: ResourceSliceWatch | None = None) -> PodAttribution | None:
    """Pod attribution from the kubelet's pod-resources socket (``--pod-attribution``).

    ``auto`` starts when the socket's directory exists (the kubelet may still be starting:
    the thread waits for the socket itself), so plain hosts never load gRPC.
    """
    sock = settings.pod_resources_socket
    if not _pod_attribution_starts(settings):
        return None
    from exporter.k8s.podresources import PodAttribution

    attribution = PodAttribution(sock, interval=settings.pod_resources_interval,
                                 timeout=min(5.0, settings.pod_resources_interval),
                                 dra=dra.resolve if dra is not None else None,
                                 resources=backends.gpu_resources())  # every backend's, not only the running ones
    engine.gpu_labels = attribution.labels_for
    engine.mig_labels = attribution.mig_labels_for
    engine.observers.append(attribution.update_gpus)
    engine.family_sources.append(attribution.families)
    attribution.start()
    log.info("pod attribution from %s every %gs", sock, settings.pod_resources_interval)
    return attribution


def start_process_attribution(settings: config.Settings, engine: Engine) -> tuple[Any, Any] | None:
    """Per-pod readings on shared GPUs (``--per-process``): the background builder and the pods watch.

    Raises ``MissingExtra`` (the kubernetes package is not installed) before anything starts.
    Without an API configuration (not in a pod, no ``KUBECONFIG``) it runs without the watch:
    only processes outside any pod are attributed.
    """
    if not settings.per_process:
        return None
    from exporter.k8s import watch

    watch.import_client("--per-process")  # --proc-root was checked with the other settings
    from exporter.core.host import node_name
    from exporter.k8s.processes import ProcessAttribution, pod_summary

    attribution = ProcessAttribution(settings.proc_root)
    engine.observers.append(attribution.observe)
    engine.family_sources.append(attribution.families)
    attribution.start()
    from exporter.platform import kube

    try:
        api = kube.api_client(who="--per-process")
    except kube.NoKubeConfig as exc:
        log.warning("per-process attribution without pod names: %s; processes in pods are left out", exc)
        return attribution, None
    from kubernetes import client

    node = node_name()
    pods = watch.Watcher("pods", client.CoreV1Api(watch.no_retries(api)).list_pod_for_all_namespaces,
                         attribution.pods_changed,
                         field_selector=f"spec.nodeName={node}", keep=pod_summary)
    engine.family_sources.append(pods.families)
    pods.start()
    log.info("per-process attribution: PIDs from %s, pods of node %s from a watch", settings.proc_root, node)
    return attribution, pods


def limit_malloc_arenas(environ: dict[str, str] | None = None) -> bool:
    """At most two glibc malloc arenas, unless ``MALLOC_ARENA_MAX`` says otherwise.

    glibc gives each thread that allocates its own arena; with the HTTP, I/O, collector and
    event threads, freed memory stays spread over them. Two arenas keep RSS with the data
    (64 GPUs after 10,000 scrapes: 52 MiB with the default, 33 MiB with two). Not glibc (musl):
    nothing to tune. Returns whether the limit was set.
    """
    env = os.environ if environ is None else environ
    if "MALLOC_ARENA_MAX" in env:
        return False  # glibc read the operator's own setting at start-up
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(-8, 2))  # M_ARENA_MAX


def host_port(address: str, port: int) -> str:
    """``address:port`` as a URL writes it: an IPv6 address in brackets (``[::1]:9400``)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def check_listen_address(address: str, port: int) -> str | None:
    """Why ``address`` cannot be listened on (a host name that does not resolve), or None.
    --check-config runs it so that a setting it passes does not fail the start."""
    try:
        socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        return f"invalid address = {address!r}: does not resolve ({getattr(exc, 'strerror', None) or exc})"
    return None


def loopback_hint(address: str) -> str:
    """A note for a listener only this machine can reach (the default, 127.0.0.1)."""
    import ipaddress

    try:
        loopback = ipaddress.ip_address(address).is_loopback
    except ValueError:
        loopback = address == "localhost"
    return "; this machine only: --address 0.0.0.0 (or ::) listens on all addresses" if loopback else ""


def main(argv: Sequence[str]) -> int:
    limit_malloc_arenas()  # before any thread allocates
    try:
        settings = config.load(argv)
    except ConfigError as exc:
        return fail(PROG, exc)
    logs.setup(settings.log_level, settings.log_format)
    web = None
    if settings.web_config_file:
        from exporter.platform import webconfig

        try:
            web = webconfig.load(settings.web_config_file)
        except ConfigError as exc:
            return fail(PROG, exc)
    if settings.check_config:
        from exporter.core.schema import FAMILIES

        problem = check_listen_address(settings.address, settings.port)
        if problem:
            return fail(PROG, ConfigError(problem))

        fields = options_from(settings).fields
        doc = settings.as_dict()
        # what the field selection means, read from the schema: published, collected only, off
        doc["families"] = {f.name: "published" if fields.exposed(f.name) else
                           "collected" if fields.enabled(f.name) else "off" for f in FAMILIES}
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return 0

    from exporter.serve.http import build_server

    try:
        dra = start_dra(settings)  # before any backend: a bad setting is the only line printed
    except ConfigError as exc:
        return fail(PROG, exc)
    options = options_from(settings)
    engine = open_engine(settings, options)
    from exporter.core.extras import MissingExtra

    try:
        per_pod = start_process_attribution(settings, engine)
    except MissingExtra as exc:
        engine.stop()
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 2
    attribution = start_attribution(settings, engine, dra)
    if dra is not None:
        engine.family_sources.append(dra.families)
    try:
        server = build_server(engine, settings.address, settings.port, settings.metrics_path,
                              settings.ready_max_age, settings.max_connections, settings.read_timeout, web,
                              probe_port=settings.probe_port or None)
    except OSError as exc:
        # a port another process holds: say which setting moves ours (make run passes PORT= to --port)
        hint = ("; pick another with --port (EXPORTER_PORT; make run PORT=...)"
                if exc.errno == errno.EADDRINUSE else "")
        sys.stderr.write(f"{PROG}: error: cannot listen on {host_port(settings.address, settings.port)}: "
                         f"{exc.strerror or exc}{hint}\n")
        return 2 if isinstance(exc, socket.gaierror) else 1  # a host name that does not resolve is bad input
    from exporter.serve.api import register

    register(server, engine, settings.metrics_path)  # JSON API (/api/v1/monitoring/gpu-metrics, /stats), live page

    from exporter.platform import daemon

    daemon.install_signals(server, lambda signum: server.shutdown())  # SIGHUP reloads --web.config.file
    names = ",".join(b.name for b in engine.backends) or "none"
    scheme = "https" if web is not None and web.ssl_context is not None else "http"
    log.info("serving %s://%s%s (backend %s%s)%s", scheme, host_port(settings.address, server.server_address[1]),
             settings.metrics_path, names, ", basic auth" if web is not None and web.users else "",
             loopback_hint(settings.address))
    if server.probe_address is not None:
        log.info("probes: http://%s/healthz and /readyz (plain HTTP, the probe paths only)",
                 host_port(settings.address, server.probe_address[1]))
    try:
        server.serve_forever(poll_interval=daemon.SIGNAL_POLL_S)
    finally:
        server.server_close()
        if attribution is not None:
            attribution.stop()
        for part in per_pod or ():
            if part is not None:
                part.stop()
        if dra is not None:
            dra.stop()
        engine.stop()
    return 0
