"""Kubernetes Events on a Node when one of its GPUs turns ``growing`` or ``allocated-idle``, and when
its ``GPUHealthy`` condition changes (health.py; never for its first setting: the condition's own
``lastTransitionTime`` records that).

``kubectl describe node`` lists Events whose ``involvedObject`` is the Node (kind Node,
the node's name as its uid, as the kubelet records them), from any namespace; ours go to
the profiler's own namespace. An Event is recorded only when the published pattern changes
into one of those two (after the hysteresis), never again while it stays, and never for a GPU's
first pattern (a first setting: its annotation records it; loop.py decides). The name is
derived from (node, GPU, pattern), so the same change later (the GPU recovered, then
leaked again) patches the existing Event's ``count`` and ``lastTimestamp`` instead of
creating another, as client-go's recorder does.

Budget: per node, as client-go's ``EventSourceObjectSpamFilter`` (k8s.io/client-go
tools/record/events_cache.go: a token bucket per source and object, burst 25, refilled at
1/300 per second): each node has ``burst`` tokens and gets one back every ``refill_s``
seconds, continuously. A node whose GPUs flap loses its own Events only; 500 nodes failing at
once each get theirs. An Event over its node's budget is suppressed and counted
(``gpu_profiler_events_total{result="dropped"}``); :meth:`EventRecorder.end_cycle` then records
one summary Event naming how many were suppressed that cycle and on how many nodes.

Memory: a bucket is kept only while it is below full; a full one is the same as none, so the
cycle end forgets them (at most the nodes that recorded an Event within ``burst·refill_s``).

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
SUMMARY_REASON = "GPUEventsSuppressed"
BURST = 25  # client-go's defaultSpamBurst
REFILL_S = 300.0  # one token every 5 minutes: client-go's defaultSpamQPS (1/300)
KEEP_FULL = 10000  # buckets at most kept between cycles (only non-full ones are kept at all)


class NodeBudget:
    """A token bucket per node: ``burst`` tokens, one back every ``refill_s`` seconds (continuously)."""

    def __init__(self, burst: int = BURST, refill_s: float = REFILL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if burst < 1 or not refill_s > 0:
            raise ValueError("an Event budget needs burst >= 1 and refill_s > 0")
        self.burst = float(burst)
        self.refill_s = float(refill_s)
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # node -> (tokens, when counted)
        self._lock = threading.Lock()

    def _level(self, node: str, now: float) -> float:
        tokens, when = self._buckets.get(node, (self.burst, now))
        return min(self.burst, tokens + max(0.0, now - when) / self.refill_s)

    def take(self, node: str) -> bool:
        """Spend one of ``node``'s tokens; False (nothing spent) when it has none."""
        with self._lock:
            now = self.clock()
            tokens = self._level(node, now)
            if tokens < 1.0:
                self._buckets[node] = (tokens, now)
                return False
            self._buckets[node] = (tokens - 1.0, now)
            return True

    def tokens(self, node: str) -> float:
        with self._lock:
            return self._level(node, self.clock())

    def forget_full(self) -> None:
        """Drop the buckets that are full again (the same as having none); bound what is left."""
        with self._lock:
            now = self.clock()
            self._buckets = {n: b for n, b in self._buckets.items() if self._level(n, now) < self.burst}
            while len(self._buckets) > KEEP_FULL:  # the oldest first: a node seen long ago
                self._buckets.pop(next(iter(self._buckets)))

    def __len__(self) -> int:
        return len(self._buckets)


class EventRecorder:
    """Records Events through a ``kubernetes.client.ApiClient``; never raises."""

    def __init__(self, api_client: Any, namespace: str, burst: int = BURST, refill_s: float = REFILL_S,
                 clock: Callable[[], float] = time.monotonic, timeout: float = 5.0,
                 summary_object: dict[str, str] | None = None) -> None:
        from kubernetes import client

        self.api: Any = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.budget = NodeBudget(burst, refill_s, clock)
        self.timeout = timeout
        self._lock = threading.Lock()
        self.counts = {"created": 0, "updated": 0, "dropped": 0, "failed": 0}
        self._disabled = False
        self._counts: dict[str, int] = {}  # event name -> count we last wrote (oldest first)
        self._suppressed: dict[str, int] = {}  # this cycle: node -> Events over its budget
        # what the summary Event is about: the profiler's Pod where known (POD_NAME), else its namespace
        self.summary_object = summary_object or {"apiVersion": "v1", "kind": "Namespace", "name": namespace,
                                                 "uid": namespace}

    def record(self, node: str, gpu: str, pattern: str, message: str) -> str:
        """Record one Event; returns the outcome (created, updated, dropped, failed)."""
        if pattern not in REASONS:
            return self._count("dropped")
        return self._count(self._record(node, f"{gpu}/{pattern}", REASONS[pattern], message, "Warning"))

    def record_condition(self, node: str, status: str, reason: str, message: str) -> str:
        """An Event for a transition of the node's GPUHealthy condition (never its first setting):
        reason ``GPUHealthy<status>`` (``GPUHealthyFalse``), Warning unless it turned True."""
        return self._count(self._record(node, f"GPUHealthy/{status}/{reason}", f"GPUHealthy{status}", message,
                                        "Normal" if status == "True" else "Warning"))

    def _count(self, outcome: str) -> str:
        with self._lock:
            self.counts[outcome] += 1
        return outcome

    def end_cycle(self) -> str | None:
        """One summary Event when this cycle suppressed any (how many, on how many nodes, the first
        few named); None when none was. Forgets full buckets. Call once per cycle."""
        with self._lock:
            suppressed, self._suppressed = self._suppressed, {}
        self.budget.forget_full()
        if not suppressed or self._disabled:
            return None
        total = sum(suppressed.values())
        names = sorted(suppressed)
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        message = (f"{total} Event{'s' if total != 1 else ''} suppressed this cycle on {len(names)} "
                   f"node{'s' if len(names) != 1 else ''} over their budget ({self.budget.burst:g} at once, then "
                   f"one every {self.budget.refill_s:g}s per node): {shown}")
        return self._create(self.summary_object, "summary", SUMMARY_REASON, message, "Warning")

    def _record(self, node: str, what: str, reason: str, message: str, kind: str) -> str:
        if self._disabled:
            return "dropped"
        if not self.budget.take(node):
            with self._lock:
                self._suppressed[node] = self._suppressed.get(node, 0) + 1
            log.debug("event for node %s (%s) suppressed: over its budget", node, what)
            return "dropped"
        return self._create({"apiVersion": "v1", "kind": "Node", "name": node, "uid": node}, what, reason,
                            message, kind)

    def _create(self, involved: dict[str, str], what: str, reason: str, message: str, kind: str) -> str:
        from kubernetes.client.exceptions import ApiException

        key = involved["name"]
        digest = hashlib.sha256(f"{key}/{what}".encode()).hexdigest()[:16]
        name = f"{key[:200]}.{digest}"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": self.namespace},
            "involvedObject": dict(involved),
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
