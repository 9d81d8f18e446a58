"""Every family's unit (docs/metrics.md's unit column) agrees with its name's SI suffix, and the help
texts say the unit the value is in (issue 15: the PCIe generation once showed "ratio")."""

from __future__ import annotations

from exporter.core.schema import FAMILIES

SUFFIXES = (("_bytes_per_second", "bytes per second"), ("_ratio", "ratio"), ("_bytes", "bytes"),
            ("_celsius", "celsius"), ("_watts", "watts"), ("_joules", "joules"), ("_hertz", "hertz"),
            ("_seconds", "seconds"))


def test_unit_follows_the_name() -> None:
    wrong = []
    for f in FAMILIES:
        want = next((unit for suffix, unit in SUFFIXES if f.base.endswith(suffix)), "1")
        if f.unit != want:
            wrong.append(f"{f.name}: unit {f.unit!r}, its name says {want!r}")
    assert wrong == []


def test_ratios_say_their_range_and_counts_no_unit() -> None:
    for f in FAMILIES:
        if f.unit == "ratio":
            assert "0-1" in f.help or "fraction" in f.help.lower() or "can exceed 1" in f.help, f.name
        if f.unit == "1":
            for si_word in ("percent", "milli", "MHz", "MiB", "KB/s"):
                assert si_word not in f.help, f"{f.name}: a count or level whose help names {si_word}"
