"""Issue 35, the long form: a GPU whose power reading hangs for ten minutes while collections run back
to back, NVML and amdsmi; threads and RSS stay flat (tests/unit/backends/test_hang.py holds it 5 s in
``make test``; this is ``make reliability``)."""

from __future__ import annotations

import pytest

from tests.unit.backends.test_hang import Vendor, amdsmi, hold_hang, nvml, vendor

__all__ = ["amdsmi", "nvml", "vendor"]


@pytest.mark.reliability_long
@pytest.mark.timeout(900)
def test_threads_and_memory_stay_flat_over_ten_minutes_of_hang(vendor: Vendor) -> None:
    hold_hang(vendor, 600.0)
