"""Building blocks of the hypothesis fuzz tests (tests/reliability/test_fuzz*.py): a derandomized runner
and strategies biased towards the text and values that break parsers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def run(budget: int, test: Callable[..., None], *strategies: st.SearchStrategy[Any]) -> None:
    """Run ``test`` over ``budget`` derandomized examples drawn from ``strategies``."""
    settings(max_examples=budget, deadline=None, derandomize=True, database=None, print_blob=False,
             suppress_health_check=list(HealthCheck))(given(*strategies)(test))()


# Text the OS can pass in argv and the environment (no NUL), biased towards what breaks parsers.
NASTY = ["", " ", "\t", "\n", "\r\n", '"', "'", "\\", "%", "%00", "${HOME}", "../", "::", "-", "--", "=", "0",
         "-1", "1e999", "nan", "inf", "-inf", "0x10", "1_000", "٣", "²", "10ms", "5m", "9" * 40, "true", "yes",
         "none", "null", "~", "[", "{", "*", "?", "☃", "\u202e", "\ufeff", "a" * 300]
text = st.one_of(st.sampled_from(NASTY), st.text(st.characters(blacklist_characters="\x00",
                                                                blacklist_categories=("Cs",)), max_size=40))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), text)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(text, inner, max_size=4)), max_leaves=10)


def one_line(msg: str) -> bool:
    """A message of one non-empty line, of a sane length."""
    return bool(msg.strip()) and "\n" not in msg.strip() and len(msg) < 2000
