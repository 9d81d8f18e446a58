"""Issue 35: AMD's ECC counts rated like NVIDIA's (exporter/core/xid.py's events), through the real amdsmi
wrapper over the fake libamd_smi: uncorrectable errors since the driver loaded make the GPU failed,
corrected ones (ignore by default) do not, and an operator's override changes that."""

from __future__ import annotations

from exporter.backends import create
from exporter.core.engine import Engine
from exporter.core.host import host_info
from exporter.core.options import BackendOptions, FieldFilter
from tests.fakes.fakeamdsmi import FakeAmdSmi


def health(xid_severity: dict[int | str, str] | None = None) -> dict[int, tuple[str, str]]:
    engine = Engine([create("amdsmi", BackendOptions())], host_info(), FieldFilter(), cache_ttl=0.0,
                    xid_severity=xid_severity)
    try:
        snap = engine.scrape()
        return {r.index: (r.health_state, r.health_cause) for c in snap.collections for r in c.gpus}
    finally:
        engine.stop()


def test_amd_ecc_errors_by_severity(fake: FakeAmdSmi) -> None:
    # two_gpu_fleet: GPU 0 has 12 correctable errors and none uncorrectable, GPU 1 two uncorrectable
    assert health() == {0: ("ok", ""), 1: ("failed", "ecc_uncorrected (fatal)")}
    assert health({"ecc_corrected": "warn", "ecc_uncorrected": "ignore"}) == {
        0: ("degraded", "ecc_corrected (warn)"), 1: ("ok", "")}
