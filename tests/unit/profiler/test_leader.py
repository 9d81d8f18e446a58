"""Two profiler processes, one writer: leader election on a coordination.k8s.io/v1 Lease,
against the fake API server (tests/harness/kubeapi.py) and a real Prometheus."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.fakes.profiler_history import scenario_node
from tests.harness.kubeapi import FakeKubeAPI, RecordedRequest
from tests.harness.poll import wait_until
from tests.harness.profiler import history_file
from tests.harness.prom import Prometheus

pytestmark = pytest.mark.prometheus

P = "gpu-exporter.io/"
NS = "gpu-exporter"
LEASE_S = 3.0
NODES = ("le-a", "le-b", "le-c")
ALLOWED = {("list", "nodes"), ("get", "nodes"), ("patch", "nodes"), ("patch", "nodes/status"), ("get", "leases"),
           ("create", "leases"),
           ("update", "leases"), ("create", "events"), ("patch", "events")}


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("leader-prom")
    end = float(int(time.time()) - 30)
    hist = [h for n in NODES for h in scenario_node(11, n, end)]
    with Prometheus(tmp / "server", tsdb_blocks_from=history_file(tmp / "h.om", hist)) as server:
        yield server


def _start(name: str, prom: Prometheus, kubeconfig: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "POD_NAME": name, "PYTHONPATH": str(Path(__file__).parents[3])}
    argv = [sys.executable, "-m", "exporter", "profile", "--prometheus-url", prom.url, "--kubeconfig",
            str(kubeconfig), "--leader-elect", "--leader-elect-namespace", NS,
            "--leader-elect-lease-duration", f"{LEASE_S:g}s", "--leader-elect-renew-deadline", "2s",
            "--leader-elect-retry-period", "0.25s", "--interval", "1s", "--listen-port", "0",
            "--listen-address", "127.0.0.1", "--log-level", "debug"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))


def _who(r: RecordedRequest) -> str:
    return r.headers.get("user-agent", "").rpartition("/")[2]


def _holder(api: FakeKubeAPI) -> str:
    leases = api.objects("leases", NS)
    return str(leases[0]["spec"].get("holderIdentity") or "") if leases else ""


def test_one_writer_and_failover_within_a_lease(prom: Prometheus, tmp_path: Path) -> None:
    with FakeKubeAPI() as api:
        for n in NODES:
            api.add_node(n, annotations={"example.com/owner": "team-a"})
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        procs = {name: _start(name, prom, kubeconfig, tmp_path / f"{name}.log") for name in ("prof-a", "prof-b")}
        try:
            wait_until(lambda: _holder(api) in procs, timeout=20, what="a replica to hold the lease")
            wait_until(lambda: all(P + "owned-keys" in api.node(n)["metadata"]["annotations"] for n in NODES),
                       timeout=30, what="every node annotated")
            leader = _holder(api)
            follower = next(n for n in procs if n != leader)
            node_reqs = [r for r in api.requests if r.resource == "nodes"]
            assert node_reqs and {_who(r) for r in node_reqs} == {leader}, "only the leader reads and writes nodes"

            # kill the leader without a chance to release the lease; then a node needs writing again
            procs[leader].send_signal(signal.SIGKILL)
            procs[leader].wait(10)
            killed = time.time()
            ours = {k: None for k in api.node("le-a")["metadata"]["annotations"] if k.startswith(P)}
            api.edit_node("le-a", annotations=ours)

            def rewritten() -> RecordedRequest | None:
                return next((r for r in api.patches("le-a") if _who(r) == follower and r.status == 200), None)

            first = wait_until(rewritten, timeout=15, what="the other replica to rewrite le-a")
            took = first.time - killed
            assert _holder(api) == follower
            assert took <= LEASE_S + 1.5, f"writes moved after {took:.1f}s (lease {LEASE_S:g}s, cycle under 1 s)"
            lease = api.objects("leases", NS)[0]["spec"]
            assert lease["leaseTransitions"] >= 1 and lease["leaseDurationSeconds"] == round(LEASE_S)
            # the lease itself moved within one lease duration of the kill (plus two retry periods of
            # scheduling latency on a loaded 2-core machine); the first write is the new leader's
            # first cycle after that (the slack above)
            acquired = datetime.fromisoformat(lease["acquireTime"])
            assert acquired.timestamp() - killed <= LEASE_S + 0.5

            # after the kill, only the new leader touched nodes
            after = [r for r in api.requests if r.resource == "nodes" and r.time > killed]
            assert {_who(r) for r in after} == {follower}
            assert P + "owned-keys" in api.node("le-a")["metadata"]["annotations"]

            # graceful stop releases the lease at once
            procs[follower].send_signal(signal.SIGTERM)
            assert procs[follower].wait(20) == 0
            assert _holder(api) == ""
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait(10)

        accepted = [r for r in api.patches() if r.status == 200 and r.resource == "nodes"]
        # no patch written twice: each accepted patch of a node was planned from a different version
        # of it, and changed it (a replayed patch would repeat a version, or change nothing)
        versions = [(r.node, r.body["metadata"]["resourceVersion"]) for r in accepted]
        assert len(versions) == len(set(versions)), versions
        assert all(r.body["metadata"]["annotations"] for r in accepted)
        # none lost: one more cycle from scratch finds every node as it should be
        verbs = {(r.verb, r.resource) for r in api.requests}
        assert verbs <= ALLOWED, f"RBAC would need more than it grants: {sorted(verbs - ALLOWED)}"
        api.clear_requests()
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
        once = subprocess.run([sys.executable, "-m", "exporter", "profile", "--prometheus-url", prom.url,
                               "--kubeconfig", str(kubeconfig), "--once", "--events", "off"],
                              env=env, capture_output=True, text=True, timeout=60)
        assert once.returncode == 0, once.stderr[-2000:]
        assert api.patches() == [], [r.body for r in api.patches()]
