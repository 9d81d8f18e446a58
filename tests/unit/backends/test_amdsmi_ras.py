"""Issue 35: AMD's RAS and ECC events map to the same severities as NVIDIA's XIDs (fatal, warn, ignore),
overridable the same way (``--xid-severity``), from one data file that cites its sources
(exporter/core/ras_events.tsv).

Through the real stack: the real ``amdsmi`` package over the fake ``libamd_smi.so`` (its
``amdsmi_get_gpu_ecc_enabled`` / ``amdsmi_get_gpu_ecc_status`` / ``amdsmi_get_gpu_total_ecc_count``),
the real backend and engine, the per-GPU health state (``gpu_health_state{state,cause}``).

The fake's RAS keys use amdsmi's own values (amdsmi_wrapper.py 7.0.2): blocks are bits of
``amdsmi_gpu_block_t`` (UMC 1, GFX 4, XGMI_WAFL 128), states ``amdsmi_ras_err_state_t`` (PARITY 2,
SING_C 3, MULT_UC 4, POISON 5, ENABLED 6).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path

import pytest

from exporter.backends import create
from exporter.core import xid
from exporter.core.engine import Engine
from exporter.core.host import host_info
from exporter.core.options import BackendOptions, FieldFilter
from tests.fakes.fakeamdsmi import FakeAmdSmi, two_gpu_fleet

UMC, GFX, XGMI_WAFL = 1, 4, 128  # amdsmi_gpu_block_t
PARITY, SING_C, MULT_UC, POISON, ENABLED = 2, 3, 4, 5, 6  # amdsmi_ras_err_state_t


def health(fake: FakeAmdSmi, gpu0: Mapping[str, object | None], gpu1: Mapping[str, object],
           overrides: Mapping[int | str, str] | None = None) -> dict[int, tuple[str, str]]:
    """(state, cause) of both GPUs after one collection of the fleet with these extra keys."""
    fleet = two_gpu_fleet()
    fleet[1]["ecc.uncorrectable"] = 0  # the fleet's default uncorrected count would decide GPU 1
    fleet[0].update(gpu0)
    fleet[1].update(gpu1)
    fleet = [{k: v for k, v in g.items() if v is not None} for g in fleet]  # None: a key left out
    fake.write(fleet, rocm_version="6.2.1")
    b = create("amdsmi", BackendOptions())
    engine = Engine([b], host_info(), FieldFilter(), collection_timeout=30.0, cache_ttl=0.0,
                    xid_severity=overrides)
    try:
        snap = engine.scrape()
        assert snap.stats["amdsmi"].success
        return {r.index: (r.health_state, r.health_cause) for c in snap.collections for r in c.gpus}
    finally:
        engine.stop()


@pytest.mark.parametrize(("gpu0", "overrides", "want"), [
    # a block with multiple uncorrectable errors: fatal, as XID 48
    ({"ras.enabled": UMC | GFX, f"ras.{UMC}.state": MULT_UC}, None, ("failed", "ras_mult_uc umc (fatal)")),
    # every block that shows it is named
    ({"ras.enabled": UMC | XGMI_WAFL, f"ras.{UMC}.state": MULT_UC, f"ras.{XGMI_WAFL}.state": MULT_UC}, None,
     ("failed", "ras_mult_uc umc, xgmi_wafl (fatal)")),
    # poisoned data: warn (deferred to its consumer, as XID 94); the worst state wins
    ({"ras.enabled": UMC | GFX, f"ras.{GFX}.state": POISON}, None, ("degraded", "ras_poison gfx (warn)")),
    ({"ras.enabled": UMC | GFX, f"ras.{UMC}.state": MULT_UC, f"ras.{GFX}.state": POISON}, None,
     ("failed", "ras_mult_uc umc (fatal)")),
    ({"ras.enabled": GFX, f"ras.{GFX}.state": PARITY}, None, ("degraded", "ras_parity gfx (warn)")),
    # a corrected single-bit error: ignore, as XID 92
    ({"ras.enabled": UMC, f"ras.{UMC}.state": SING_C}, None, ("ok", "")),
    # overridden by name, as an XID code is
    ({"ras.enabled": UMC | GFX, f"ras.{UMC}.state": MULT_UC, f"ras.{GFX}.state": POISON},
     {"ras_mult_uc": "ignore"}, ("degraded", "ras_poison gfx (warn)")),
    ({"ras.enabled": UMC, f"ras.{UMC}.state": SING_C}, {"ras_sing_c": "fatal"}, ("failed", "ras_sing_c umc (fatal)")),
    # deferred errors in the total count: warn; overridable
    ({"ecc.deferred": 3}, None, ("degraded", "ecc_deferred (warn)")),
    ({"ecc.deferred": 3}, {"ecc_deferred": "fatal"}, ("failed", "ecc_deferred (fatal)")),
    ({"ecc.deferred": 3}, {"ecc_deferred": "ignore"}, ("ok", "")),
    # a state not in a block's RAS mask is not asked; a GPU without RAS has no such event
    ({"ras.enabled": GFX, f"ras.{UMC}.state": MULT_UC}, None, ("ok", "")),
    ({"ras.enabled": None, f"ras.{UMC}.state": MULT_UC}, None, ("ok", "")),
], ids=["mult_uc", "two-blocks", "poison", "worst-wins", "parity", "sing_c", "override-fatal-away",
        "override-ignore-up", "deferred", "deferred-fatal", "deferred-ignore", "block-off", "no-ras"])
def test_amd_ras_events_map_to_the_xid_severities(fake: FakeAmdSmi, gpu0: Mapping[str, object | None],
                                                  overrides: Mapping[int | str, str] | None,
                                                  want: tuple[str, str]) -> None:
    got = health(fake, {"ecc.correctable": 0, **gpu0}, {"ras.enabled": UMC | GFX}, overrides)
    assert got == {0: want, 1: ("ok", "")}


def test_the_ras_events_come_from_one_data_file_that_cites_its_sources() -> None:
    text = resources.files("exporter.core").joinpath("ras_events.tsv").read_text(encoding="utf-8")
    rows = [line.split("\t") for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert {r[0]: r[1] for r in rows} == dict(xid.EVENTS)
    assert all(len(r) == 3 and r[2] for r in rows)  # each says what it is
    assert {"ras_mult_uc", "ras_poison", "ras_parity", "ras_sing_c", "ecc_deferred"} <= set(xid.EVENTS)
    for source in ("rocm.docs.amd.com/projects/amdsmi", "docs.kernel.org/gpu/amdgpu/ras.html",
                   "docs.nvidia.com/deploy/xid-errors"):
        assert source in text
    # the per-block states are amdsmi's own names (AmdSmiRasErrState), lower case, as the backend makes them
    wrapper = Path(pytest.importorskip("importlib.util").find_spec("amdsmi").origin).parent / "amdsmi_wrapper.py"
    for event in (e for e in xid.EVENTS if e.startswith("ras_")):
        assert f"AMDSMI_RAS_ERR_STATE_{event[4:].upper()} = " in wrapper.read_text()


def test_an_operator_overrides_a_ras_event_as_an_xid() -> None:
    assert xid.load_overrides({"ras_poison": "fatal", "48": "warn"}) == {"ras_poison": "fatal", 48: "warn"}
    assert xid.severity("ras_poison", {"ras_poison": "fatal"}) == "fatal"
    with pytest.raises(xid.XidConfigError, match="key 'ras_bogus' is not an XID code or a RAS/ECC event"):
        xid.load_overrides({"ras_bogus": "fatal"})
