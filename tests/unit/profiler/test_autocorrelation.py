"""The autocorrelation takes each lag's sum of products from a distance (classify.py, issue 29's
speed-up): it must agree with the definition, r(k) = sum x(i) x(i+k) / sum x(i)², to far below
any threshold the period search compares it with, for any series the classifier can be given."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.profiler.classify import autocorrelation, detrend

values = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def _definition(xs: list[float], max_lag: int) -> list[float]:
    n = len(xs)
    c0 = math.fsum(v * v for v in xs)
    return [math.fsum(xs[i] * xs[i + k] for i in range(n - k)) / c0 for k in range(max_lag + 1)]


@settings(max_examples=200, deadline=None)
@given(st.lists(values, min_size=2, max_size=400), st.data())
def test_every_lag_agrees_with_the_definition(xs: list[float], data: st.DataObject) -> None:
    max_lag = data.draw(st.integers(min_value=0, max_value=len(xs) - 1))
    got = autocorrelation(xs, max_lag)
    assert len(got) == max_lag + 1
    if math.fsum(v * v for v in xs) == 0.0:
        assert got == [0.0] * (max_lag + 1)
        return
    assert got[0] == 1.0
    for a, b in zip(got, _definition(xs, max_lag), strict=True):
        assert abs(a - b) < 1e-12


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=8, max_size=500))
def test_utilisation_series_agree_with_the_definition_after_detrending(xs: list[float]) -> None:
    d = detrend(xs)
    if math.fsum(v * v for v in d) < 1e-300:
        return
    for a, b in zip(autocorrelation(d, len(d) // 2), _definition(d, len(d) // 2), strict=True):
        assert abs(a - b) < 1e-12
