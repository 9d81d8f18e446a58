"""gpu_health_state on /metrics, /stats and the live page's data, through the real exporter over the fake NVML:
an XID rated by NVIDIA's catalogue, the operator's --xid-severity override, a lost GPU (issue 35)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes.fakenvml import FakeNvml
from tests.harness.exporter import ExporterProcess, sample
from tests.harness.poll import wait_until

STATES = ("ok", "degraded", "failed", "hung", "lost")


def start(fleet: FakeNvml, tmp_path: Path, *args: str) -> ExporterProcess:
    return ExporterProcess(["--backend", "nvml", "--cache-ttl", "0", "--sysfs-root", str(tmp_path / "sys"), *args],
                           env=fleet.env())


def state_of(s: dict, gpu: str) -> tuple[str, str]:
    """The one state of ``gpu`` whose series is 1, and its cause; every state has exactly one series."""
    rows = {dict(ls)["state"]: (v, dict(ls)["cause"]) for (n, ls), v in s.items()
            if n == "gpu_health_state" and dict(ls)["gpu"] == gpu}
    assert sorted(rows) == sorted(STATES), rows
    on = [(st, cause) for st, (v, cause) in rows.items() if v == 1.0]
    assert len(on) == 1 and all(v == 0.0 for st, (v, _) in rows.items() if st != on[0][0]), rows
    assert len({cause for _, cause in rows.values()}) == 1  # one cause on all of the GPU's series
    return on[0]


def test_xid_lost_and_ok_on_metrics_and_stats(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=4)
    with start(fleet, tmp_path) as ex:
        assert {state_of(ex.scrape(), str(i)) for i in range(4)} == {("ok", "")}
        fleet.queue_xid(1, 79)  # fallen off the bus: RESTART_BM in NVIDIA's catalogue
        fleet.queue_xid(2, 13)  # graphics engine exception: RESTART_APP
        fleet.lose(3)
        s = wait_until(lambda: (x := ex.scrape()) and sample(x, "gpu_xid_errors_total", gpu="2", xid="13") and x,
                       15, what="the XIDs counted")
        assert state_of(s, "0") == ("ok", "")
        assert state_of(s, "1") == ("failed", "xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (fatal)")
        assert state_of(s, "2") == ("degraded", "xid 13 ROBUST_CHANNEL_GR_EXCEPTION / "
                                                "ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY (warn)")
        state, cause = state_of(s, "3")
        assert state == "lost" and "GPU is lost" in cause
        status, body, _ = ex.get("/stats")
        assert status == 200
        gpus = {g["index"]: g for g in json.loads(body)["gpus"]}
        assert [gpus[i]["health"] for i in range(4)] == ["ok", "failed", "degraded", "lost"]
        assert gpus[1]["health_cause"] == "xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (fatal)"
        assert gpus[0]["health_cause"] == ""


def test_the_operators_override_rates_an_xid(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2)
    with start(fleet, tmp_path, "--xid-severity", "79=ignore,13=fatal") as ex:
        ex.scrape()
        fleet.queue_xid(0, 79)
        fleet.queue_xid(1, 13)
        s = wait_until(lambda: (x := ex.scrape()) and sample(x, "gpu_xid_errors_total", gpu="1", xid="13") and x,
                       15, what="the XIDs counted")
        assert state_of(s, "0") == ("ok", "")
        assert state_of(s, "1") == ("failed", "xid 13 ROBUST_CHANNEL_GR_EXCEPTION / "
                                              "ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY (fatal)")
