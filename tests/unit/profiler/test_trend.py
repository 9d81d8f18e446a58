"""Theil-Sen and Mann-Kendall (classify.py) against their definitions, pair by pair: the fast
form walks each lag's pairs in C and counts Mann-Kendall's S from the sorted slopes, and must
give exactly what the definition gives, for any series the classifier can be handed (ties,
plateaus, negative values, repeats)."""

from __future__ import annotations

import math
import statistics
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.profiler.classify import theil_sen_mann_kendall


def _definition(ys: list[float], step: float) -> tuple[float, float]:
    n = len(ys)
    if n < 3:
        return 0.0, 0.0
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    slope = statistics.median([(ys[j] - ys[i]) / (j - i) for i, j in pairs])
    s = sum((ys[j] > ys[i]) - (ys[j] < ys[i]) for i, j in pairs)
    ties = Counter(ys)
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values() if t > 1)) / 18.0
    if var <= 0:
        return slope / step, 0.0
    z = (s - 1) / math.sqrt(var) if s > 0 else (s + 1) / math.sqrt(var) if s < 0 else 0.0
    return slope / step, z


# memory readings: bytes, often repeating exactly (plateaus), sometimes from a small set (ties)
readings = st.one_of(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False),
                     st.sampled_from([0.0, -0.0, 1.0, 2.0, 3.0, 1e9]))


@settings(max_examples=300, deadline=None)
@given(st.lists(readings, max_size=40), st.sampled_from([1.0, 2.0, 30.0, 60.0]))
def test_slope_and_z_are_the_definitions(ys: list[float], step: float) -> None:
    assert theil_sen_mann_kendall(ys, step) == _definition(ys, step)


def test_pairs_whose_slope_underflows_keep_their_sign() -> None:
    # found by hypothesis in a clean-clone CI run: (5e-324 - 0) / 2 rounds to 0.0, a tie, where
    # Mann-Kendall counts a rise
    for ys in ([0.0, 0.0, 5e-324], [5e-324, 0.0, -5e-324, 1e-300], [2.0**-1000, 0.0, 2.0**-1000 * 3, 1.0]):
        assert theil_sen_mann_kendall(ys) == _definition(ys, 1.0), ys


def test_a_leak_a_fall_and_a_plateau() -> None:
    rise = [float(i * 1000) for i in range(30)]
    assert theil_sen_mann_kendall(rise, 30.0) == _definition(rise, 30.0)
    assert theil_sen_mann_kendall(rise, 30.0)[0] == 1000.0 / 30.0 and theil_sen_mann_kendall(rise)[1] > 5
    fall = rise[::-1]
    assert theil_sen_mann_kendall(fall)[0] == -1000.0 and theil_sen_mann_kendall(fall)[1] < -5
    assert theil_sen_mann_kendall([7.0] * 20 + [8.0] * 10) == _definition([7.0] * 20 + [8.0] * 10, 1.0)
