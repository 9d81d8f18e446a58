"""One size parser (Kubernetes quantity rules) and one duration parser, the same meaning everywhere."""

from __future__ import annotations

import pytest

from exporter.platform.units import parse_duration, parse_size
from tests.harness.cli import gx


@pytest.mark.parametrize(("text", "expected"), [
    ("16M", 16_000_000), ("16Mi", 16_777_216), ("16MiB", 16_777_216), ("16MB", 16_000_000),
    ("1k", 1000), ("1K", 1000), ("1Ki", 1024), ("1KiB", 1024), ("8Gi", 8 * 2**30), ("8GiB", 8 * 2**30),
    ("10GB", 10**10), ("10G", 10**10), ("1T", 10**12), ("1Ti", 2**40), ("4096B", 4096), ("1048576", 1048576),
    ("0", 0), ("1.5Gi", 3 * 2**29), ("0.5k", 500), (" 2Mi ", 2 * 2**20), ("1.0001", 2),  # whole bytes, rounded up
])
def test_sizes_follow_kubernetes_quantities(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["16m", "16mi", "16mb", "lots", "", "-1Mi", "1e3", "16 M i", "16Xi", "1" * 30,
                                  "nan", "inf", "\u0661\u0666Mi"])  # Arabic-Indic digits
def test_bad_sizes_name_the_examples(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a size; expected e\.g\. 16Mi or 16MiB"):
        parse_size(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("90s", 90), ("30m", 1800), ("1h", 3600), ("1h30m", 5400), ("250ms", 0.25), ("1d", 86400), ("90", 90),
    ("0.5", 0.5), ("1.5h", 5400), ("100us", 1e-4),
])
def test_durations(text: str, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "h", "1x", "-1s", "1 h", "nan", "inf", "1e3s", "90"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text, bare_seconds=text != "90")


def test_serve_takes_1h() -> None:
    """``1h`` was refused by serve --collection-interval while profile --window took it (issue 27)."""
    done = gx("serve", "--check-config", "--backend", "simulated", "--collection-interval", "1h")
    assert done.returncode == 0, done.stderr
    bad = gx("serve", "--check-config", "--backend", "simulated", "--collection-interval", "2h")
    assert bad.returncode == 2 and "--collection-interval" in bad.stderr and "1h" in bad.stderr
