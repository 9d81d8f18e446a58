"""The one Kubernetes API client builder, for every daemon (``serve``'s watches, the profiler's writes).

Where the configuration comes from, as ``kubectl`` looks: an explicit kubeconfig file (the
profiler's ``--kubeconfig``), else the in-cluster service account in a pod, else ``$KUBECONFIG``
or ``~/.kube/config``. The ``kubernetes`` package's global configuration is never touched, and
the client's credential refresh runs at most once a second (:func:`throttle_refresh`).
The ``kubernetes`` package is imported here only, lazily: ``serve`` without a Kubernetes feature
never loads it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from exporter.core.extras import require


class NoKubeConfig(RuntimeError):
    """No Kubernetes API configuration works; ``str()`` is one line with each place's reason."""


REFRESH_EVERY_S = 1.0


def throttle_refresh(api_client: Any, every_s: float = REFRESH_EVERY_S,
                     clock: Callable[[], float] = time.monotonic) -> Any:
    """Run the client's credential refresh at most once per ``every_s`` seconds; returns ``api_client``.

    The kubernetes client calls ``configuration.refresh_api_key_hook`` before every request, and
    both of its loaders re-apply their whole configuration there: the in-cluster one and a
    kubeconfig's (which also runs an exec plugin again once its token has expired). Setting the
    host re-reads every environment variable for a proxy, and a pod has one per Service of its
    namespace: 0.2 ms of CPU a request on the bench machine, a third of a node patch's client
    CPU, 4 s of a 10,000-node first cycle. Once a second still picks up a rotated token in
    time: the in-cluster loader rereads its token file once a minute, and an exec plugin's token
    is refreshed within a second of its expiry.
    """
    cfg = api_client.configuration
    hook = getattr(cfg, "refresh_api_key_hook", None)
    if hook is None:
        return api_client
    lock = threading.Lock()
    last = [-math.inf]

    def refresh(conf: Any) -> None:
        now = clock()
        with lock:
            if now - last[0] < every_s:
                return
            last[0] = now
        try:
            hook(conf)
        finally:
            conf.refresh_api_key_hook = refresh  # both loaders' hooks install themselves again

    cfg.refresh_api_key_hook = refresh
    return api_client


def api_client(kubeconfig: str | None = None, who: str = "the Kubernetes API",
               clock: Callable[[], float] = time.monotonic) -> Any:
    """An ``ApiClient`` from ``kubeconfig`` if given, else in-cluster, else ``$KUBECONFIG``/``~/.kube/config``.

    Raises :class:`~exporter.core.extras.MissingExtra` (naming ``who`` and the ``k8s`` extra) without the
    ``kubernetes`` package, and :class:`NoKubeConfig` (one line with the reasons) when no configuration works.
    """
    require("kubernetes", who)
    from kubernetes import client, config

    if kubeconfig:
        try:
            return throttle_refresh(config.new_client_from_config(config_file=kubeconfig), clock=clock)
        except Exception as exc:  # noqa: BLE001 - any loader error is a bad kubeconfig
            raise NoKubeConfig(f"--kubeconfig {kubeconfig}: {exc}") from None
    reasons = []
    try:
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return throttle_refresh(client.ApiClient(cfg), clock=clock)
    except Exception as exc:  # noqa: BLE001 - not in a pod (or no token): try the kubeconfig
        reasons.append(f"in-cluster: {exc}")
    try:
        return throttle_refresh(config.new_client_from_config(), clock=clock)
    except Exception as exc:  # noqa: BLE001
        reasons.append(f"kubeconfig: {exc}")
    raise NoKubeConfig("no Kubernetes configuration found (" + "; ".join(reasons) + ")")
