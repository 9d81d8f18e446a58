"""Leader election, step by step on one fake clock: two electors, the real kubernetes client, the
fake API server (tests/harness/kubeapi.py). What the Lease says after each step, who may write,
when the other replica takes over, races, release, and the timings refused at start-up.

(test_leader.py runs two real profiler processes; test_leader_deadline.py the leader's own
deadline. These run in process, so ``make mutation`` judges leader.py by them.)
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.request
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from exporter.profiler.leader import ElectionConfig, LeaderElector, LeaseClient
from tests.harness.clock import FakeClock
from tests.harness.kubeapi import FakeKubeAPI

NS = "gpu-exporter"
LEASE = "gpu-exporter-profiler"
LEASES = r"/leases"
# MicroTime: RFC 3339, microseconds, UTC (the kubernetes client sends our "Z" as "+00:00")
MICRO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|\+00:00)")


class Replica:
    """One elector and what it told its ``on_change`` callback."""

    def __init__(self, api_client: Any, identity: str, clock: FakeClock, **timings: float) -> None:
        self.cfg = ElectionConfig(namespace=NS, identity=identity, **{
            "lease_duration_s": 15.0, "renew_deadline_s": 10.0, "retry_period_s": 2.0, **timings})
        self.changes: list[bool] = []
        self.e = LeaderElector(LeaseClient(api_client, NS, LEASE, timeout=5.0), self.cfg,
                               on_change=self.changes.append, clock=clock)


def run_until_leading(b: Replica, clock: FakeClock) -> list[float]:
    """Run ``b``'s elector loop on the fake clock until it leads (or 11 waits); return its waits (s)."""
    waits: list[float] = []

    class Stop:
        def is_set(self) -> bool:
            return b.e.leading.is_set() or len(waits) > 10

        def wait(self, s: float) -> bool:
            waits.append(round(s, 6))
            clock.now += s
            return self.is_set()

    b.e.run(Stop())  # type: ignore[arg-type]
    return waits


def lease(api: FakeKubeAPI) -> dict[str, Any]:
    leases = api.objects("leases", NS)
    assert len(leases) == 1
    return leases[0]


def stamp(text: str) -> float:
    assert MICRO.fullmatch(text), text
    return datetime.fromisoformat(text).astimezone(UTC).timestamp()


def test_acquire_renew_follow_and_take_over(kubeapi: FakeKubeAPI, kube_client: Any,
                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.profiler.leader")
    clock = FakeClock(now=500.0)
    a, b = Replica(kube_client, "prof-a", clock), Replica(kube_client, "prof-b", clock)

    before = time.time()
    assert a.e.step() is True
    spec = lease(kubeapi)["spec"]
    assert spec["holderIdentity"] == "prof-a" and spec["leaseDurationSeconds"] == 15
    assert spec["acquireTime"] == spec["renewTime"] and spec["leaseTransitions"] == 0
    assert before - 1 <= stamp(spec["renewTime"]) <= time.time() + 1
    assert a.e.is_leader() and a.e.holder == "prof-a" and a.e.transitions == 1 and a.changes == [True]
    assert lease(kubeapi)["metadata"]["name"] == LEASE and lease(kubeapi)["metadata"]["namespace"] == NS
    assert "prof-a is now the leader (gpu-exporter/gpu-exporter-profiler): acquired the lease" in caplog.text

    assert b.e.step() is False  # follows: the lease is held and fresh
    assert not b.e.is_leader() and b.e.holder == "prof-a" and b.changes == [] and b.e.transitions == 0
    assert lease(kubeapi)["spec"] == spec, "a follower never writes a held lease"

    clock.now += 2
    assert a.e.step() is True  # renews
    renewed = lease(kubeapi)["spec"]
    assert renewed["holderIdentity"] == "prof-a" and renewed["acquireTime"] == spec["acquireTime"]
    assert renewed["renewTime"] != spec["renewTime"] and renewed["leaseTransitions"] == 0
    assert a.e.transitions == 1 and a.changes == [True], "a renewal is not a new leadership"
    last_start = clock.now - 0  # A's last renewal started now (the fake clock stood still during it)
    assert b.e.step() is False  # B sees the renewal now

    # A dies. B takes over only once A has stopped writing (its renew deadline), and within a lease
    # duration of A's last renewal (B counts from its read before it saw the change)
    taken = None
    while taken is None and clock.now < last_start + 30:
        clock.now += 0.5
        if b.e.step():
            taken = clock.now
        else:
            assert lease(kubeapi)["spec"]["holderIdentity"] == "prof-a"
    assert taken is not None
    assert last_start + 10 <= taken <= last_start + 15, f"took over {taken - last_start:g}s after the last renewal"
    # exactly a lease duration after B's read before the one that saw the change (at 500)
    assert taken == pytest.approx(500.0 + 15)
    assert not a.e.is_leader(), "A would still be writing"
    took = lease(kubeapi)["spec"]
    assert took["holderIdentity"] == "prof-b" and took["leaseTransitions"] == 1
    assert took["acquireTime"] == took["renewTime"] and took["acquireTime"] != renewed["acquireTime"]
    assert b.e.is_leader() and b.changes == [True] and b.e.transitions == 1

    # A comes back: it sees B's fresh lease and follows; it stopped being leader long ago
    assert a.e.step() is False
    assert not a.e.is_leader() and a.changes == [True, False] and a.e.holder == "prof-b"
    assert "prof-a is not the leader" in caplog.text
    clock.now += 2
    assert b.e.step() is True and lease(kubeapi)["spec"]["leaseTransitions"] == 1
    writes = [r.body for r in kubeapi.requests if r.resource == "leases" and r.method in ("POST", "PUT")]
    assert writes and all((w["apiVersion"], w["kind"], w["metadata"]["name"]) ==
                          ("coordination.k8s.io/v1", "Lease", LEASE) for w in writes)

    # a replica restarted under the same name finds its own lease: it leads on, "renewed"
    again = Replica(kube_client, "prof-b", clock)
    clock.now += 1
    assert again.e.step() is True and again.changes == [True]
    assert "prof-b is now the leader (gpu-exporter/gpu-exporter-profiler): renewed" in caplog.text
    assert lease(kubeapi)["spec"]["leaseTransitions"] == 1


def test_the_record_changing_restarts_the_followers_count(kubeapi: FakeKubeAPI, kube_client: Any) -> None:
    """A follower counts the lease duration from the last change it saw, whatever its own clock."""
    clock = FakeClock(now=500.0)
    a, b = Replica(kube_client, "prof-a", clock), Replica(kube_client, "prof-b", clock)
    assert a.e.step()
    assert not b.e.step()
    for _ in range(20):  # A keeps renewing: B never takes over, however long
        clock.now += 2
        assert a.e.step() and not b.e.step()
    assert lease(kubeapi)["spec"]["holderIdentity"] == "prof-a"


def test_a_follower_that_saw_the_last_renewal_late_still_waits_a_whole_lease(kubeapi: FakeKubeAPI,
                                                                             kube_client: Any) -> None:
    clock = FakeClock(now=500.0)
    a, b = Replica(kube_client, "prof-a", clock), Replica(kube_client, "prof-b", clock)
    assert b.e.step() is True  # nothing held yet: B acquires
    assert lease(kubeapi)["spec"]["holderIdentity"] == "prof-b"
    clock.now += 2
    assert not a.e.step()
    # the first read of a replica counts from that read, not from an earlier poll it never made
    clock.now += 14.9
    assert not a.e.step(), "took over before a lease duration since it first saw the record"
    clock.now += 0.2
    assert a.e.step()


def test_lost_race_and_api_errors(kubeapi: FakeKubeAPI, kube_client: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.profiler.leader")
    clock = FakeClock(now=500.0)
    a, b = Replica(kube_client, "prof-a", clock), Replica(kube_client, "prof-b", clock)
    # both see no lease; A creates it first, B's create is refused with 409: B is not the leader
    assert b.e.leases.get() is None
    assert a.e.step()
    kubeapi.inject("GET", LEASES, 404)  # B still believes there is no lease
    assert b.e.step() is False and not b.e.leading.is_set() and b.changes == []
    assert lease(kubeapi)["spec"]["holderIdentity"] == "prof-a"

    # an update that loses the race (409, or 422 from a stale version) loses leadership at once
    clock.now += 2
    for code in (409, 422):
        kubeapi.inject("PUT", LEASES, code)
        assert a.e.step() is False and not a.e.is_leader()
        assert "lost the race for the lease" in caplog.text
        assert a.e.step() is True and a.e.is_leader()
    assert a.changes == [True, False, True, False, True] and a.e.transitions == 3

    # any other error is raised for run() to count; leadership then ends at the renew deadline only
    kubeapi.inject("PUT", LEASES, 500)
    with pytest.raises(ApiException) as exc:
        a.e.step()
    assert exc.value.status == 500 and a.e.is_leader()
    kubeapi.inject("GET", LEASES, 403)
    with pytest.raises(ApiException):
        a.e.step()
    assert a.e.is_leader()


def test_release_hands_the_lease_over_at_once(kubeapi: FakeKubeAPI, kube_client: Any,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.profiler.leader")
    clock = FakeClock(now=500.0)
    a, b = Replica(kube_client, "prof-a", clock), Replica(kube_client, "prof-b", clock)
    b.e.release()  # not the leader: touches nothing
    assert kubeapi.objects("leases", NS) == [] and b.changes == []
    assert a.e.step() and not b.e.step()
    acquired = lease(kubeapi)["spec"]["acquireTime"]
    clock.now += 1
    a.e.release()
    spec = lease(kubeapi)["spec"]
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
    assert spec["acquireTime"] == acquired and spec["leaseTransitions"] == 0
    assert MICRO.fullmatch(spec["renewTime"])
    assert not a.e.is_leader() and a.changes == [True, False]
    assert "released lease gpu-exporter/gpu-exporter-profiler" in caplog.text
    # B takes it on its next step, without waiting out a lease; an empty holder is no transition
    clock.now += 0.5
    assert b.e.step()
    spec = lease(kubeapi)["spec"]
    assert spec["holderIdentity"] == "prof-b" and spec["leaseTransitions"] == 0 and spec["leaseDurationSeconds"] == 15
    a.e.release()  # released already: nothing more
    assert lease(kubeapi)["spec"]["holderIdentity"] == "prof-b"


def test_release_never_clears_another_replicas_lease(kubeapi: FakeKubeAPI, kube_client: Any,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.profiler.leader")
    clock = FakeClock(now=500.0)
    a, b = Replica(kube_client, "prof-a", clock), Replica(kube_client, "prof-b", clock)
    assert a.e.step() and not b.e.step()
    clock.now += 16  # A stalls; B takes over
    assert b.e.step() and b.e.step()
    a.e.leading.set()  # A has not noticed yet
    a.e.release()
    a.e.leading.set()
    with a.e._lock:
        a.e._renewed_at = clock.now  # as if A had just renewed: it sees B's fresh lease and follows
    a.e._last_poll = clock.now - 1  # a recent previous read (see the stall test below for an old one)
    clock.now += 1
    assert a.e.step() is False and not a.e.leading.is_set()
    assert lease(kubeapi)["spec"]["holderIdentity"] == "prof-b"
    assert not a.e.leading.is_set()
    assert "prof-a is not the leader: following prof-b" in caplog.text


def test_release_survives_an_api_error(kubeapi: FakeKubeAPI, kube_client: Any,
                                       caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(now=500.0)
    a = Replica(kube_client, "prof-a", clock)
    assert a.e.step()
    kubeapi.inject("PUT", LEASES, 500)
    a.e.release()  # logged, not raised: the lease then simply runs out
    assert lease(kubeapi)["spec"]["holderIdentity"] == "prof-a" and not a.e.leading.is_set()
    assert "could not release the lease" in caplog.text


@pytest.mark.parametrize("duration", [0, -3, "15", True, None, 2.5, 1])
def test_a_lease_duration_we_cannot_use_falls_back_to_ours(kubeapi: FakeKubeAPI, kube_client: Any,
                                                           duration: Any) -> None:
    """The holder's leaseDurationSeconds counts when it is a positive number, else our own."""
    clock = FakeClock(now=500.0)
    a, b = Replica(kube_client, "prof-a", clock), Replica(kube_client, "prof-b", clock, lease_duration_s=20.0)
    assert a.e.step()
    obj = lease(kubeapi)
    obj["spec"]["leaseDurationSeconds"] = duration
    # written raw (the typed client refuses such a Lease; another writer need not)
    req = urllib.request.Request(f"{kubeapi.url}/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{LEASE}",
                                 data=json.dumps(obj).encode(), method="PUT",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {kubeapi.token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
    assert not b.e.step()
    want = float(duration) if type(duration) in (int, float) and duration > 0 else 20.0
    clock.now += want - 0.1
    assert not b.e.step()
    clock.now += 0.2
    assert b.e.step()


def test_run_counts_errors_and_logs_one_warning_per_outage(kubeapi: FakeKubeAPI, kube_client: Any,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="exporter.profiler.leader")
    clock = FakeClock(now=500.0)
    a = Replica(kube_client, "prof-a", clock)
    waits: list[float] = []

    class Stop:
        def is_set(self) -> bool:
            return len(waits) >= 12

        def wait(self, s: float) -> bool:
            waits.append(s)
            clock.now += s
            if len(waits) == 2:
                kubeapi.inject("*", LEASES, 500, times=3)  # steps 3-5 fail
            if len(waits) == 8:
                kubeapi.inject("*", LEASES, 500, times=2)  # steps 9-10 fail: a second outage
            return self.is_set()

    a.e.run(Stop())  # type: ignore[arg-type]
    errors = [r for r in caplog.records if "Exception" in r.message and r.message.startswith("leader election: ")]
    # each outage: a warning for its first error, debug for the rest
    assert [r.levelno for r in errors] == [logging.WARNING, logging.DEBUG, logging.DEBUG, logging.WARNING,
                                           logging.DEBUG], [r.message for r in errors]
    warnings = [r for r in errors if r.levelno == logging.WARNING]
    assert all("ApiException" in r.message or "ServiceException" in r.message for r in warnings)
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG and "leader election:" in r.message]
    assert len(debug) == 3  # the outages' later errors
    assert waits == [2.0] * 12, "the leader waits one retry period between attempts"
    assert "prof-a is not the leader: stopping" in caplog.text
    # stopping released the lease
    assert lease(kubeapi)["spec"]["holderIdentity"] == "" and not a.e.is_leader()


def test_a_follower_wakes_when_the_lease_runs_out(kubeapi: FakeKubeAPI, kube_client: Any) -> None:
    clock = FakeClock(now=500.0)
    a, b = Replica(kube_client, "prof-a", clock), Replica(kube_client, "prof-b", clock, retry_period_s=4.0,
                                                               renew_deadline_s=8.0, lease_duration_s=20.0)
    assert a.e.step()
    clock.now += 1
    waits = run_until_leading(b, clock)
    # first read at 501 counts from then: 4 s waits, then exactly the rest of the holder's lease (its 15 s,
    # not our 20 s, from 501)
    assert waits[:3] == [4.0, 4.0, 4.0] and waits[3] == pytest.approx(3.0)
    assert b.e.holder == "prof-b"


@pytest.mark.parametrize(("timings", "problem"), [
    ({"lease_duration_s": 15, "renew_deadline_s": 10, "retry_period_s": 2}, None),
    ({"lease_duration_s": 12, "renew_deadline_s": 10, "retry_period_s": 2}, None),  # exactly enough
    ({"lease_duration_s": 11.9, "renew_deadline_s": 10, "retry_period_s": 2},
     "the lease duration must be at least the renew deadline plus the retry period (11.9s < 10s + 2s)"),
    ({"lease_duration_s": 30, "renew_deadline_s": 5, "retry_period_s": 5},
     "the retry period must be shorter than the renew deadline"),
    ({"lease_duration_s": 30, "renew_deadline_s": 5, "retry_period_s": 4.99}, None),
])
def test_timings_that_cannot_keep_one_writer_are_refused(timings: dict[str, float], problem: str | None) -> None:
    assert ElectionConfig(namespace=NS, **timings).problem() == problem


def test_defaults() -> None:
    cfg = ElectionConfig(namespace=NS)
    assert (cfg.name, cfg.lease_duration_s, cfg.renew_deadline_s, cfg.retry_period_s) == (LEASE, 15.0, 10.0, 2.0)
    assert cfg.problem() is None


def test_a_follower_wakes_for_the_last_fraction_of_a_second(kubeapi: FakeKubeAPI, kube_client: Any) -> None:
    clock = FakeClock(now=500.0)
    a, b = Replica(kube_client, "prof-a", clock), Replica(kube_client, "prof-b", clock, retry_period_s=4.75,
                                                               renew_deadline_s=9.0)
    assert a.e.step()
    waits = run_until_leading(b, clock)
    # 15 = 3 x 4.75 + 0.75: woken for the last 0.75 s, then leading (one more wait before the stop)
    assert waits[:4] == [4.75, 4.75, 4.75, 0.75] and b.changes == [True, False]


def test_errors_from_the_very_first_attempt(kubeapi: FakeKubeAPI, kube_client: Any,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """The API fails before the replica ever read the Lease: it keeps trying every retry period,
    warns once, and takes the lease when the API answers."""
    caplog.set_level(logging.DEBUG, logger="exporter.profiler.leader")
    clock = FakeClock(now=500.0)
    a = Replica(kube_client, "prof-a", clock)
    kubeapi.inject("*", LEASES, 503, times=3)
    waits: list[float] = []

    class Stop:
        def is_set(self) -> bool:
            return a.e.leading.is_set() or len(waits) > 10

        def wait(self, s: float) -> bool:
            waits.append(s)
            clock.now += s
            return self.is_set()

    a.e.run(Stop())  # type: ignore[arg-type]
    assert waits == [2.0] * 4 and a.changes == [True, False]  # led, then released when stopped
    levels = [r.levelno for r in caplog.records if r.message.startswith("leader election: ") and "503" in r.message]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]


def test_the_leader_steps_down_on_its_own_when_the_deadline_passes(kubeapi: FakeKubeAPI, kube_client: Any,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.profiler.leader")
    clock = FakeClock(now=500.0)
    a = Replica(kube_client, "prof-a", clock)
    assert a.e.step()
    clock.now += 9.99
    assert a.e.is_leader() and a.changes == [True]
    clock.now += 0.01
    assert not a.e.is_leader() and not a.e.leading.is_set() and a.changes == [True, False]
    assert "prof-a is not the leader: renew deadline passed" in caplog.text


def test_a_short_lease_is_written_in_whole_seconds(kubeapi: FakeKubeAPI, kube_client: Any) -> None:
    clock = FakeClock(now=500.0)
    a = Replica(kube_client, "prof-a", clock, lease_duration_s=1.4, renew_deadline_s=1.0, retry_period_s=0.2)
    assert a.e.step() and lease(kubeapi)["spec"]["leaseDurationSeconds"] == 1


@pytest.mark.parametrize("call", ["get", "create", "update"])
def test_every_lease_request_has_a_timeout(kubeapi: FakeKubeAPI, kube_client: Any, call: str) -> None:
    leases = LeaseClient(kube_client, NS, LEASE, timeout=0.3)
    current = leases.create({"holderIdentity": "x"})
    kubeapi.inject("*", LEASES, None, times=20, delay=8.0)  # the API server hangs (urllib3 retries a GET or PUT)
    t0 = time.monotonic()
    with pytest.raises(Exception) as exc:  # urllib3's timeout error, whatever it wraps
        {"get": leases.get, "create": lambda: leases.create({}),
         "update": lambda: leases.update(current, {})}[call]()
    assert time.monotonic() - t0 < 6.0, f"{call} waited {time.monotonic() - t0:.1f}s"
    assert "timed out" in str(exc.value).lower() or "timeout" in type(exc.value).__name__.lower()
    kubeapi.clear_injections()


def test_an_answer_that_is_not_a_lease_is_refused() -> None:
    from exporter.profiler import leader

    class Resp:
        def __init__(self, data: bytes) -> None:
            self.data, self.released = data, False

        def release_conn(self) -> None:
            self.released = True

    for body in (b"[1, 2]", b'{"kind": "Status"}', b'{"metadata": "x"}'):
        r = Resp(body)
        with pytest.raises(ValueError, match=r"^the API server answered something that is not a Lease$"):
            leader._json(r)
        assert r.released
    r = Resp(b"not json")
    with pytest.raises(ValueError):
        leader._json(r)
    assert r.released, "the connection goes back to the pool whatever the answer"
    assert leader._json(Resp(b'{"metadata": {}}')) == {"metadata": {}}


def test_micro_time_is_utc_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    from exporter.profiler import leader

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        assert leader._micro_time(0) == "1970-01-01T00:00:00.000000Z"
        assert leader._micro_time(1.5) == "1970-01-01T00:00:01.500000Z"
        assert abs(stamp(leader._micro_time()) - time.time()) < 5
    finally:
        monkeypatch.undo()
        time.tzset()


def test_a_replica_back_from_a_stall_never_takes_a_lease_renewed_during_it(kubeapi: FakeKubeAPI,
                                                                           kube_client: Any) -> None:
    """A replica counts a changed record from its previous read only when that read was recent:
    after a long gap (a pause, a hung request) the change may be brand new, and counting from the
    old read would take a lease its holder still writes under."""
    clock = FakeClock(now=500.0)
    a, b = Replica(kube_client, "prof-a", clock), Replica(kube_client, "prof-b", clock)
    assert a.e.step() and not b.e.step()  # both read at 500
    clock.now = 515.0  # A stalls; B (its previous read at 500) takes over
    assert b.e.step() and b.e.is_leader()
    clock.now = 516.0  # A is back: its previous read was at 500, but B renewed at 515
    assert a.e.step() is False, "took a lease renewed a second ago"
    assert lease(kubeapi)["spec"]["holderIdentity"] == "prof-b" and b.e.is_leader()
    # A counts from no earlier than (lease duration - renew deadline) before its read returned, and
    # B, still renewing, keeps it
    for _ in range(10):
        clock.now += 2
        assert b.e.step() and not a.e.step()


class HangingLeases(LeaseClient):
    """A LeaseClient whose next read hangs: ``during`` runs while it hangs, then the clock jumps to ``back``."""

    def __init__(self, api_client: Any, clock: FakeClock) -> None:
        super().__init__(api_client, NS, LEASE, timeout=5.0)
        self.clock = clock
        self.hang: tuple[Any, float] | None = None

    def get(self) -> dict[str, Any] | None:
        if self.hang is not None:
            during, back = self.hang
            self.hang = None
            during()
            self.clock.now = back
        return super().get()


def test_a_read_that_hung_never_takes_a_lease_renewed_while_it_hung(kubeapi: FakeKubeAPI, kube_client: Any) -> None:
    """The time that counts is when the read returned: a request that hung while another replica
    took and renewed the lease must not count that change from before the request."""
    clock = FakeClock(now=500.0)
    a, c = Replica(kube_client, "prof-a", clock), Replica(kube_client, "prof-c", clock)
    leases = HangingLeases(kube_client, clock)
    b = LeaderElector(leases, ElectionConfig(namespace=NS, identity="prof-b", lease_duration_s=15.0,
                                             renew_deadline_s=10.0, retry_period_s=2.0), clock=clock)
    assert a.e.step() and not b.step() and not c.e.step()  # all read at 500; A then dies

    def c_takes_over() -> None:
        clock.now = 515.0
        assert c.e.step() and c.e.is_leader()

    clock.now = 502.0
    leases.hang = (c_takes_over, 516.0)  # B's read starts at 502 and returns at 516
    assert b.step() is False, "took a lease renewed a second before its read returned"
    assert lease(kubeapi)["spec"]["holderIdentity"] == "prof-c" and c.e.is_leader()
    # B follows C while C renews; once C stops, B takes over within a lease duration of C's last renewal
    for _ in range(5):
        clock.now += 2
        assert c.e.step() and not b.step()
    last = clock.now
    while not b.step():
        assert clock.now < last + 15, "never took over"
        assert lease(kubeapi)["spec"]["holderIdentity"] == "prof-c"
        clock.now += 0.5
    assert clock.now >= last + 10 and not c.e.is_leader()
