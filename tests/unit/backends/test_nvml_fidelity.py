"""NVIDIA values that must be true on real boards, through the real pynvml over the fake NVML:
NVLink error counters per link (every link, not link 0 only) and MIG memory with the _v2 meaning."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.fakenvml import FakeNvml
from tests.harness.exporter import ExporterProcess, sample

GIB, MIB = 2**30, 2**20


def start(fleet: FakeNvml) -> ExporterProcess:
    return ExporterProcess(["--backend", "nvml", "--cache-ttl", "0", "--fields-exclude",
                            "gpu_p2p_supported,gpu_topology_level"], env=fleet.env())


def test_nvlink_errors_per_link_beyond_link_0(tmp_path: Path) -> None:
    # counters: 0 replay, 1 recovery, 2 crc_flit, 3 crc_data (nvmlNvLinkErrorCounter_t)
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2, gpm_supported=0)
    fleet.set(0, nvlink_err={(0, 2): 1, (17, 2): 40, (9, 0): 3, (9, 1): 5, (12, 3): 7})
    with start(fleet) as ex:
        s = ex.scrape()
        links = {dict(ls)["link"] for n, ls in s if n == "gpu_link_errors_total" and ("gpu", "0") in ls}
        assert links == {str(i) for i in range(18)}
        assert sample(s, "gpu_link_errors_total", gpu="0", counter="crc_flit", link="17") == 40.0
        assert sample(s, "gpu_link_errors_total", gpu="0", counter="crc_flit", link="0") == 1.0
        assert sample(s, "gpu_link_errors_total", gpu="0", counter="replay", link="9") == 3.0
        assert sample(s, "gpu_link_errors_total", gpu="0", counter="recovery", link="9") == 5.0
        assert sample(s, "gpu_link_errors_total", gpu="0", counter="crc_data", link="12") == 7.0
        assert sample(s, "gpu_link_errors_total", gpu="1", counter="crc_flit", link="17") == 0.0
        fleet.set(0, nvlink_err={(0, 2): 1, (17, 2): 41, (9, 0): 3, (9, 1): 5, (12, 3): 7})
        assert sample(ex.scrape(), "gpu_link_errors_total", gpu="0", counter="crc_flit", link="17") == 41.0


def test_mig_memory_used_excludes_reserved_and_falls_back_per_device(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2, gpm_supported=0)
    for gpu in (0, 1):
        fleet.add_mig(gpu, 0, "1g.10gb", gi=7, mem_total=10 * GIB, mem_used=1 * GIB, mem_reserved=256 * MIB)
        fleet.add_mig(gpu, 1, "2g.20gb", gi=3, mem_total=20 * GIB, mem_used=2 * GIB, mem_reserved=512 * MIB)
    fleet.unsupported(1, "nvmlDeviceGetMemoryInfo_v2")  # an older driver on GPU 1 only
    with start(fleet) as ex:
        s = ex.scrape()
        # _v2 on GPU 0: used excludes reserved, per MIG device
        assert sample(s, "gpu_mig_memory_used_bytes", gpu="0", gpu_instance="7") == 1 * GIB
        assert sample(s, "gpu_mig_memory_used_bytes", gpu="0", gpu_instance="3") == 2 * GIB
        assert sample(s, "gpu_mig_memory_total_bytes", gpu="0", gpu_instance="3") == 20 * GIB
        # GPU 1 has no _v2: its devices fall back to v1 on their own (used includes reserved), GPU 0 keeps _v2
        assert sample(s, "gpu_mig_memory_used_bytes", gpu="1", gpu_instance="7") == 1 * GIB + 256 * MIB
        assert sample(s, "gpu_mig_memory_used_bytes", gpu="1", gpu_instance="3") == 2 * GIB + 512 * MIB
        assert sample(s, "gpu_memory_reserved_bytes", gpu="1") is None  # v1 has no reserved field
        assert sample(s, "gpu_memory_reserved_bytes", gpu="0") is not None
