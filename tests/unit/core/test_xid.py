"""The XID catalogue and its overrides (exporter/core/xid.py): the defaults are NVIDIA's published
catalogue, an operator overrides any code or RAS/ECC event, a bad override is one line naming it."""

from __future__ import annotations

import pytest

from exporter.core import xid


def test_the_catalogue_is_nvidias_immediate_action_mapped_to_severities() -> None:
    cat = xid.catalogue()
    # every code NVIDIA's catalogue lists for Ampere and newer, 1 to 161, once
    assert sorted(cat) == list(range(1, 162))
    # a sample of rows against the published page (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)
    assert (cat[79].bucket, cat[79].mnemonic) == ("RESTART_BM", "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")
    assert (cat[48].bucket, cat[13].bucket, cat[63].bucket, cat[8].bucket) == (
        "WORKFLOW_XID_48", "RESTART_APP", "IGNORE", "RESTART_APP")
    assert cat[1].bucket == "CONTACT_SUPPORT"  # "Unused" in the catalogue
    assert {e.severity for e in cat.values()} == set(xid.SEVERITIES)


@pytest.mark.parametrize(("code", "expected"), [
    (79, "fatal"), (48, "fatal"), (64, "fatal"), (74, "fatal"), (95, "fatal"), (119, "fatal"), (54, "fatal"),
    (13, "warn"), (31, "warn"), (94, "warn"), (45, "warn"), (1, "warn"),
    (63, "ignore"), (92, "ignore"), (43, "ignore"),
    (999, "warn"), (162, "warn"),  # not in the catalogue: seen, never dropped, never fatal on a guess
])
def test_default_severity(code: int, expected: str) -> None:
    assert xid.severity(code) == expected


def test_amd_ras_and_ecc_events_use_the_same_severities() -> None:
    assert xid.severity("ecc_uncorrected") == xid.severity(48) == "fatal"
    assert xid.severity("page_retirement_failed") == xid.severity(64) == "fatal"
    assert xid.severity("page_retired") == xid.severity(63) == "ignore"
    assert xid.severity("ecc_corrected") == "ignore"
    assert xid.severity("ecc_deferred") == "warn"
    assert xid.severity("no_such_event") == "warn"


def test_an_override_wins_for_its_code_only() -> None:
    over = xid.load_overrides({13: "fatal", "79": "ignore", "ecc_corrected": "WARN", " 63 ": "fatal"})
    assert over == {13: "fatal", 79: "ignore", "ecc_corrected": "warn", 63: "fatal"}
    assert xid.severity(13, over) == "fatal"
    assert xid.severity(79, over) == "ignore"
    assert xid.severity(63, over) == "fatal"
    assert xid.severity("ecc_corrected", over) == "warn"
    assert xid.severity(48, over) == "fatal" and xid.severity(31, over) == "warn"  # untouched
    assert xid.severity(5000, {5000: "ignore"}) == "ignore"  # a code newer than the catalogue
    assert xid.load_overrides(None) == {} and xid.load_overrides({}) == {}


@pytest.mark.parametrize(("raw", "message"), [
    ([48], "xid_severity: expected a mapping of XID code or event to severity, got list"),
    ({48: "critical"}, "xid_severity: 48: severity 'critical' is not one of fatal, warn, ignore"),
    ({48: None}, "xid_severity: 48: severity None is not one of fatal, warn, ignore"),
    ({48: 1}, "xid_severity: 48: severity 1 is not one of fatal, warn, ignore"),
    ({"xid48": "fatal"}, "xid_severity: key 'xid48' is not an XID code or a RAS/ECC event (ecc_*, page_*, ras_*: "
                         "docs/metrics.md lists them)"),
    ({True: "fatal"}, "xid_severity: key True is not an XID code"),
    ({0: "fatal"}, "xid_severity: XID code 0 is out of range (1-65535)"),
    ({-3: "fatal"}, "xid_severity: XID code -3 is out of range"),
    ({"99999999999999999999": "warn"}, "xid_severity: XID code 99999999999999999999 is out of range"),
    ({48: "warn", "48": "ignore"}, "xid_severity: 48 is given twice"),
    ({"4\n8": "warn"}, "xid_severity: key '4\\n8' is not an XID code"),
    ({"x" * 500: "warn"}, "xid_severity: key 'xxxxxxxx"),
])
def test_a_bad_override_is_one_line_naming_it(raw: object, message: str) -> None:
    with pytest.raises(xid.XidConfigError) as err:
        xid.load_overrides(raw)
    text = str(err.value)
    assert text.startswith(message)
    assert "\n" not in text and len(text) < 200


def test_the_setting_name_is_the_callers() -> None:
    with pytest.raises(xid.XidConfigError, match=r"^profiler\.xid: 13: severity 'x'"):
        xid.load_overrides({13: "x"}, where="profiler.xid")


def test_the_catalogue_ships_in_the_package() -> None:
    import tomllib
    from pathlib import Path

    data = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["exporter"]
    assert "core/*.tsv" in globs
