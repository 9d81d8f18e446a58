"""Kubernetes Events on a Node when one of its GPUs turns ``growing`` or ``allocated-idle``, and when
its ``GPUHealthy`` condition changes (health.py; the first setting included).

``kubectl describe node`` lists Events whose ``involvedObject`` is the Node (kind Node,
the node's name as its uid, as the kubelet records them), from any namespace; ours go to
the profiler's own namespace. An Event is recorded only when the published pattern changes
into one of those two (after the hysteresis), never again while it stays. The name is
derived from (node, GPU, pattern), so the same change later (the GPU recovered, then
leaked again) patches the existing Event's ``count`` and ``lastTimestamp`` instead of
creating another, as client-go's recorder does.

Rate limit: a token bucket of ``per_minute`` tokens, refilled continuously; an Event over
the limit is dropped and counted (``gpu_profiler_events_total{result="dropped"}``).

RBAC in that namespace: ``create`` and ``patch`` on ``events``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from exporter.profiler.prom import printable

log = logging.getLogger(__name__)

REASONS = {"growing": "GPUMemoryGrowing", "allocated-idle": "GPUAllocatedButIdle"}
COMPONENT = "gpu-exporter-profiler"


class EventRecorder:
    """Records Events through a ``kubernetes.client.ApiClient``; never raises."""

    def __init__(self, api_client: Any, namespace: str, per_minute: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, timeout: float = 5.0) -> None:
        from kubernetes import client

        self.api: Any = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.per_minute = per_minute
        self.clock = clock
        self.timeout = timeout
        self._tokens = per_minute
        self._last = clock()
        self._lock = threading.Lock()
        self.counts = {"created": 0, "updated": 0, "dropped": 0, "failed": 0}
        self._disabled = False
        self._counts: dict[str, int] = {}  # event name -> count we last wrote (oldest first)

    def _take(self) -> bool:
        with self._lock:
            now = self.clock()
            self._tokens = min(self.per_minute, self._tokens + (now - self._last) * self.per_minute / 60.0)
            self._last = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False

    def record(self, node: str, gpu: str, pattern: str, message: str) -> str:
        """Record one Event; returns the outcome (created, updated, dropped, failed)."""
        if pattern not in REASONS:
            return self._count("dropped")
        return self._count(self._record(node, f"{gpu}/{pattern}", REASONS[pattern], message, "Warning"))

    def record_condition(self, node: str, status: str, reason: str, message: str) -> str:
        """An Event for a transition of the node's GPUHealthy condition (its first setting included):
        reason ``GPUHealthy<status>`` (``GPUHealthyFalse``), Warning unless it turned True."""
        return self._count(self._record(node, f"GPUHealthy/{status}/{reason}", f"GPUHealthy{status}", message,
                                        "Normal" if status == "True" else "Warning"))

    def _count(self, outcome: str) -> str:
        with self._lock:
            self.counts[outcome] += 1
        return outcome

    def _record(self, node: str, what: str, reason: str, message: str, kind: str) -> str:
        from kubernetes.client.exceptions import ApiException

        if self._disabled:
            return "dropped"
        if not self._take():
            log.debug("event for node %s (%s) dropped: over %g per minute", node, what, self.per_minute)
            return "dropped"
        digest = hashlib.sha256(f"{node}/{what}".encode()).hexdigest()[:16]
        name = f"{node[:200]}.{digest}"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": self.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            "reason": reason, "message": message[:1024], "type": kind,
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            _done(self.api.create_namespaced_event(self.namespace, body, _preload_content=False,
                                                   _request_timeout=self.timeout))
            self._counts[name] = 1
            return "created"
        except ApiException as exc:
            if exc.status == 409:
                return self._bump(name, message, now)
            return self._failed(exc)
        except Exception as exc:  # noqa: BLE001 - an Event is best effort
            return self._failed(exc)

    def _bump(self, name: str, message: str, now: str) -> str:
        # the count comes from this process's memory, as client-go's correlator does: the
        # RBAC grants create and patch on events, not get
        count = self._counts.pop(name, 1) + 1
        self._counts[name] = count
        while len(self._counts) > 10000:
            self._counts.pop(next(iter(self._counts)))
        patch = {"count": count, "lastTimestamp": now, "message": message[:1024]}
        try:
            _done(self.api.patch_namespaced_event(name, self.namespace, patch, _preload_content=False,
                                                  _request_timeout=self.timeout))
            return "updated"
        except Exception as exc:  # noqa: BLE001
            return self._failed(exc)

    def _failed(self, exc: Exception) -> str:
        status = getattr(exc, "status", None)
        if status == 403:
            self._disabled = True
            log.warning("recording Events is forbidden (RBAC needs create and patch on events in namespace %s); "
                        "no more Events from this process", self.namespace)
        else:
            log.warning("recording an Event failed: %s", printable(f"{type(exc).__name__}: {exc}", 300))
        return "failed"


def _done(resp: Any) -> None:
    """Read the answer before the connection goes back to the pool: an unread body would be
    taken for the next answer's status line."""
    try:
        resp.data  # noqa: B018 - reading it is the point
    finally:
        resp.release_conn()
