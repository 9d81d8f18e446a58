"""The leader's own deadline, on a fake clock: it stops writing within the renew deadline of the
START of its last successful renewal, however long that renewal took and whatever the Lease says.

The elector's real loop (:meth:`LeaderElector.run`) drives the real kubernetes client against the
fake API server (tests/harness/kubeapi.py); only time is fake. The loop's ``stop.wait`` advances
the fake clock instead of sleeping, and the Lease update that is slow advances it while the
request is in flight, so "when the renewal started" and "when it ended" are different instants.
"""

from __future__ import annotations

from typing import Any

import pytest

from exporter.profiler.leader import ElectionConfig, LeaderElector, LeaseClient
from tests.harness.clock import FakeClock
from tests.harness.kubeapi import FakeKubeAPI

NS = "gpu-exporter"
CFG = ElectionConfig(namespace=NS, identity="prof-a", lease_duration_s=15.0, renew_deadline_s=10.0,
                     retry_period_s=2.0)
LEASES = r"/leases"


class SlowLeases(LeaseClient):
    """The real client; a read and an update each take ``takes`` seconds of fake time (a slow API server)."""

    def __init__(self, api_client: Any, clock: FakeClock) -> None:
        super().__init__(api_client, NS, CFG.name)
        self.clock = clock
        self.takes = 0.0

    def get(self) -> dict[str, Any] | None:
        self.clock.now += self.takes
        return super().get()

    def update(self, lease: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        self.clock.now += self.takes
        return super().update(lease, spec)


class FakeTimeStop:
    """The loop's ``stop`` event: waiting advances the fake clock; after each wait the test's
    ``tick`` runs (it plays the writer: it asks :meth:`is_leader` before every write)."""

    def __init__(self, clock: FakeClock, tick: Any, until: float) -> None:
        self.clock, self.tick, self.until = clock, tick, until
        self.stopped = False

    def is_set(self) -> bool:
        return self.stopped

    def wait(self, seconds: float) -> bool:
        # the writer checks every 0.25 s of fake time while the elector waits
        end = self.clock.now + seconds
        while self.clock.now < end and not self.stopped:
            self.clock.now = min(end, self.clock.now + 0.25)
            self.tick()
            self.stopped = self.clock.now >= self.until
        return self.stopped


@pytest.mark.parametrize("renewal_takes", [0.0, 3.0])  # seconds, its read and its update together
def test_leader_stops_writing_within_the_renew_deadline_of_its_last_renewal_start(
        kubeapi: FakeKubeAPI, kube_client: Any, renewal_takes: float) -> None:
    clock = FakeClock()
    leases = SlowLeases(kube_client, clock)
    elector = LeaderElector(leases, CFG, clock=clock)
    writes: list[float] = []
    renewal_starts: list[float] = []
    failing_from: list[float] = []

    def tick() -> None:
        if elector.is_leader():
            writes.append(clock.now)
        if not failing_from and len(renewal_starts) >= 3:
            # from now on every Lease request fails (the API server is unreachable for this replica)
            kubeapi.inject("*", LEASES, 500, times=10_000)
            leases.takes = 0.0  # failing requests take no fake time: the writer is asked throughout
            failing_from.append(clock.now)

    real_step = elector.step

    def step() -> bool:
        started = clock.now
        ok = real_step()
        if ok and not failing_from:
            renewal_starts.append(started)
            leases.takes = renewal_takes / 2  # every renewal after the first is slow
        return ok

    elector.step = step  # type: ignore[method-assign]
    until = clock.now + 40.0
    stop = FakeTimeStop(clock, tick, until=until)
    elector.run(stop)  # type: ignore[arg-type]

    assert failing_from, "the API never started failing"
    last_start = renewal_starts[-1]
    deadline = last_start + CFG.renew_deadline_s
    assert writes, "the leader never wrote"
    after_failure = [t for t in writes if t > failing_from[0]]
    # it went on writing while within the deadline (no premature step-down) ...
    assert after_failure and max(after_failure) >= deadline - 0.5, (
        f"stopped writing at {max(writes) - last_start:.2f}s after its last renewal started; "
        f"the renew deadline is {CFG.renew_deadline_s:g}s")
    # ... and never at or past it, counted from the START of the last successful renewal
    late = [round(t - last_start, 2) for t in writes if t >= deadline]
    assert late == [], (f"wrote {late} s after its last renewal started (renewal took {renewal_takes:g}s; "
                        f"renew deadline {CFG.renew_deadline_s:g}s, lease {CFG.lease_duration_s:g}s)")
    assert not elector.leading.is_set()
    # while the API fails, and after the lease it last wrote has run out, it asks once per retry
    # period: a failing API server is not hammered (it once retried every 10 ms)
    asked = len([r for r in kubeapi.requests if r.resource == "leases" and r.injected])
    assert asked <= (until - failing_from[0]) / CFG.retry_period_s + 2, f"{asked} Lease requests while failing"
    # the Lease on the server still names it: the deadline is the leader's own, not the record's
    assert kubeapi.objects("leases", NS)[0]["spec"]["holderIdentity"] == "prof-a"
