"""Leader election on a ``coordination.k8s.io/v1`` Lease: two replicas, one writer.

The algorithm is client-go's (``k8s.io/client-go/tools/leaderelection``), on the Lease API
directly with the official client:

* The leader renews the Lease (``renewTime``) every ``retry_period``. It treats itself as
  leader only until ``renew_deadline`` after the start of its last successful renewal,
  measured on its own monotonic clock; past that it stops writing, renewed or not.
* A follower reads the Lease every ``retry_period``. Clocks of two machines do not agree,
  so it never compares ``renewTime`` with its own clock: it notes when it saw the record
  change, and takes over once the record has not changed for ``lease_duration``. It counts
  from its previous read (the change happened after it), so a leader killed right after a
  renewal is replaced within one lease duration of that renewal; but never from earlier than
  ``lease_duration - renew_deadline`` before the read that saw the change returned (the
  holder began that write before then, and writes for at most ``renew_deadline`` after), so
  a previous read from before a pause or a hung request cannot take a lease renewed since.
* Safety: ``lease_duration >= renew_deadline + retry_period`` (checked at start-up), so a
  follower can only take over once the old leader has stopped writing.
* Every write of the Lease carries its ``resourceVersion``: of two followers racing for it,
  the API server accepts one and answers the other 409.
* A stopping leader releases the Lease (empty holder, 1 s duration) so the other replica
  takes over at once instead of after a lease duration.

RBAC in the Lease's namespace: ``get`` and ``update`` on that one Lease (``resourceNames``),
``create`` on leases (a create has no name to restrict when it is authorised).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from exporter.profiler.prom import printable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ElectionConfig:
    namespace: str
    name: str = "gpu-exporter-profiler"
    identity: str = ""
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def problem(self) -> str | None:
        """Why these timings cannot keep one writer, or None."""
        if not self.renew_deadline_s + self.retry_period_s <= self.lease_duration_s:
            return ("the lease duration must be at least the renew deadline plus the retry period "
                    f"({self.lease_duration_s:g}s < {self.renew_deadline_s:g}s + {self.retry_period_s:g}s)")
        if self.retry_period_s >= self.renew_deadline_s:
            return "the retry period must be shorter than the renew deadline"
        return None


def _micro_time(t: float | None = None) -> str:
    """A Kubernetes MicroTime: RFC 3339 with microseconds, UTC."""
    return datetime.fromtimestamp(time.time() if t is None else t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseClient:
    """Get, create and update one Lease through a ``kubernetes.client.ApiClient``; raw JSON."""

    def __init__(self, api_client: Any, namespace: str, name: str, timeout: float = 5.0) -> None:
        from kubernetes import client

        self.api: Any = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.timeout = timeout

    def get(self) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                  _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return _json(resp)

    def create(self, spec: dict[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}
        return _json(self.api.create_namespaced_lease(self.namespace, body, _preload_content=False,
                                                      _request_timeout=self.timeout))

    def update(self, lease: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": lease["metadata"]["resourceVersion"]},
                "spec": spec}
        return _json(self.api.replace_namespaced_lease(self.name, self.namespace, body, _preload_content=False,
                                                       _request_timeout=self.timeout))


def _json(resp: Any) -> dict[str, Any]:
    try:
        doc = json.loads(resp.data)
    finally:
        resp.release_conn()
    if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict):
        raise ValueError("the API server answered something that is not a Lease")
    return doc


class LeaderElector:
    """Runs the election in a thread; :meth:`is_leader` says whether this replica may write now."""

    def __init__(self, leases: LeaseClient, cfg: ElectionConfig,
                 on_change: Callable[[bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.leases = leases
        self.cfg = cfg
        self.on_change = on_change
        self.clock = clock
        self.leading = threading.Event()  # set while this replica believes it leads
        self.holder = ""  # last holder seen
        self.transitions = 0  # leadership changes of this replica (became leader)
        self._renewed_at = -1e18  # monotonic start of the last successful renewal
        self._observed: tuple[str, str, Any] | None = None  # (holder, renewTime, duration) last seen
        self._observed_at = 0.0  # monotonic: the record did not look like this before then
        self._last_poll: float | None = None
        self._lock = threading.Lock()
        self._errors = 0

    # ---- what the writers ask ----

    def is_leader(self) -> bool:
        """True only while within the renew deadline of the last successful renewal."""
        with self._lock:
            ok = self.leading.is_set() and self.clock() < self._renewed_at + self.cfg.renew_deadline_s
        if not ok and self.leading.is_set():
            self._set_leading(False, "renew deadline passed")
        return ok

    # ---- the election ----

    def run(self, stop: threading.Event) -> None:
        """Try to acquire or renew every retry period until ``stop``; then release."""
        while not stop.is_set():
            wait = self.cfg.retry_period_s
            try:
                self.step()
                self._errors = 0
            except Exception as exc:  # noqa: BLE001 - an API error must not end the election
                self._errors += 1
                level = logging.WARNING if self._errors == 1 else logging.DEBUG
                log.log(level, "leader election: %s", printable(f"{type(exc).__name__}: {exc}", 300))
            if not self.leading.is_set() and self._observed is not None:
                # wake exactly when the current holder's lease runs out; once it has run out (the
                # attempt just made failed), the retry period again: a failing API server must
                # not be asked every 10 ms
                expiry = self._observed_at + self._duration(self._observed[2]) - self.clock()
                if 0 < expiry < wait:
                    wait = max(0.01, expiry)
            self.is_leader()  # drop leadership on time even while a request hangs
            stop.wait(wait)
        self.release()

    def step(self) -> bool:
        """One attempt to acquire or renew; returns whether this replica leads afterwards."""
        me = self.cfg.identity
        started = self.clock()
        prev_poll, self._last_poll = self._last_poll, started
        lease = self.leases.get()
        returned = self.clock()
        spec = (lease or {}).get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed = record
            # it changed after our previous read: counting from then is quick. But the holder began
            # this write before our read returned, so it writes until at most the renew deadline
            # after that: never count from earlier than (lease duration - renew deadline) before the
            # read returned, or a previous read from before a pause or a hung request would take a
            # lease renewed during it
            since = prev_poll if prev_poll is not None and lease is not None else started
            self._observed_at = max(since, returned - (self.cfg.lease_duration_s - self.cfg.renew_deadline_s))
        self.holder = holder
        if lease is not None and holder and holder != me and \
                self.clock() < self._observed_at + self._duration(record[2]):
            self._set_leading(False, f"following {holder}")
            return False
        now = _micro_time()
        new_spec: dict[str, Any] = {
            "holderIdentity": me,
            "leaseDurationSeconds": max(1, round(self.cfg.lease_duration_s)),
            "renewTime": now,
            "acquireTime": spec.get("acquireTime") if holder == me else now,
            "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if holder in (me, "") else 1),
        }
        from kubernetes.client.exceptions import ApiException

        try:
            if lease is None:
                lease = self.leases.create(new_spec)
            else:
                lease = self.leases.update(lease, new_spec)
        except ApiException as exc:
            if exc.status in (409, 422):  # another replica wrote it first
                self._set_leading(False, "lost the race for the lease")
                return False
            raise
        with self._lock:
            self._renewed_at = started
        self._observed = (me, now, new_spec["leaseDurationSeconds"])
        self._observed_at = started
        self.holder = me
        self._set_leading(True, "acquired the lease" if holder != me else "renewed")
        return True

    def release(self) -> None:
        """Give the Lease up (if we hold it) so the other replica need not wait it out."""
        if not self.leading.is_set():
            return
        self._set_leading(False, "stopping")
        try:
            lease = self.leases.get()
            spec = (lease or {}).get("spec") or {}
            if lease is not None and spec.get("holderIdentity") == self.cfg.identity:
                self.leases.update(lease, {**spec, "holderIdentity": "", "leaseDurationSeconds": 1,
                                           "renewTime": _micro_time()})
                log.info("leader election: released lease %s/%s", self.cfg.namespace, self.cfg.name)
        except Exception as exc:  # noqa: BLE001 - the lease then simply expires
            log.warning("leader election: could not release the lease: %s", printable(str(exc), 300))

    def _duration(self, value: Any) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
        return self.cfg.lease_duration_s

    def _set_leading(self, leading: bool, why: str) -> None:
        was = self.leading.is_set()
        if leading == was:
            return
        if leading:
            self.transitions += 1
            self.leading.set()
            log.info("leader election: %s is now the leader (%s/%s): %s", self.cfg.identity, self.cfg.namespace,
                     self.cfg.name, why)
        else:
            self.leading.clear()
            log.info("leader election: %s is not the leader: %s", self.cfg.identity, printable(why, 200))
        if self.on_change is not None:
            self.on_change(leading)
