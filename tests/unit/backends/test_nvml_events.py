"""XID events (exporter/backends/nvml_events.py) through the funnel, over the real pynvml and the fake
libnvidia-ml.so.1: the watcher's NVML calls get the same versioned fallbacks and the same "one failure,
one reading" policy as the collection's (issue 27). Counting, lost GPUs and driver reloads:
test_nvml_depth.py."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.fakenvml import FakeNvml
from tests.harness.exporter import ExporterProcess, sample
from tests.harness.poll import wait_until


def start(fleet: FakeNvml, tmp_path: Path) -> ExporterProcess:
    return ExporterProcess(["--backend", "nvml", "--cache-ttl", "0", "--sysfs-root", str(tmp_path / "sys")],
                           env=fleet.env())


def test_xids_on_a_driver_before_the_v2_handle_call(tmp_path: Path) -> None:
    """pynvml's nvmlDeviceGetHandleByIndex asks for ``_v2`` only: the watcher called it outside the
    funnel, so a driver without ``_v2`` served its GPUs but never an XID."""
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2, omit=("nvmlDeviceGetHandleByIndex_v2",))
    with start(fleet, tmp_path) as ex:
        assert sample(ex.scrape(), "gpu_up", gpu="1") == 1.0
        fleet.queue_xid(1, 79)
        s = wait_until(lambda: (x := ex.scrape()) and sample(x, "gpu_xid_errors_total", gpu="1", xid="79") and x,
                       15, what="XID 79 counted")
        log = ex.log()
    assert sample(s, "gpu_xid_errors_total", gpu="1", xid="79", uuid=fleet.gpus[1]["uuid"]) == 1.0
    assert "XID events unavailable" not in log and "Traceback" not in log


def test_a_gpu_that_cannot_register_costs_only_its_own_events(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2)
    fleet.unsupported(1, "nvmlDeviceRegisterEvents")
    with start(fleet, tmp_path) as ex:
        ex.scrape()
        fleet.queue_xid(1, 48)
        fleet.queue_xid(0, 79)
        s = wait_until(lambda: (x := ex.scrape()) and sample(x, "gpu_xid_errors_total", gpu="0", xid="79") and x,
                       15, what="XID 79 on GPU 0 counted")
        log = ex.log()
    assert sample(s, "gpu_xid_errors_total", gpu="1", xid="48") is None
    assert sample(s, "gpu_up", gpu="1") == 1.0
    # the funnel's one line for an unsupported reading, once: not asked again while NVML stays initialised
    assert log.count("GPU 1: xid:register not available") == 1, log
