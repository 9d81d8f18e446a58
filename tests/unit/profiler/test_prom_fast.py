"""The fast decoding of Prometheus answers (prom.py's msgspec records) against the careful one.

The fast way may decline any answer (None: the careful way reads it), but what it accepts it must
read exactly as the careful way does (json.loads, _vector / _matrix), and it must never accept an
answer the careful way refuses. Hypothesis writes the answers: label names and values of any
characters (escapes, surrogate escapes, non-ASCII), values as Prometheus writes them and as a broken
store might ("+Inf", "NaN", "1e999", numbers, booleans, null), times in and out of range, warnings,
isPartial, scalars, extra keys.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.profiler import prom
from exporter.profiler.prom import PromError, RangeSeries, Sample

VALUES = st.one_of(
    st.sampled_from(["0", "0.5", "1", "-0", "NaN", "+Inf", "-Inf", "Inf", "nan", "1e-300", "1e308", "1e999", "",
                     " 1", "1_0", "0x10", "abc", "8"]),
    st.floats(allow_nan=False).map(repr),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(10**20), 10**20),
    st.booleans(),
    st.none(),
)
TIMES = st.one_of(
    st.integers(0, 2_000_000_000),
    st.floats(0, 2e9),
    st.sampled_from([1e12, -1e12, 1e300, 10**400, "1795896845", True, None, "NaN"]),
)
LABELS = st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=12), st.integers(0, 9), st.none()),
                         max_size=4)
STRING_LABELS = st.dictionaries(st.text(max_size=8), st.text(max_size=12), max_size=4)
PAIR = st.one_of(st.tuples(TIMES, VALUES).map(list), st.lists(TIMES, max_size=3))
ENVELOPE = st.fixed_dictionaries({}, optional={
    "warnings": st.one_of(st.lists(st.sampled_from(["PromQL info: x", "store down"]), max_size=2), st.text(max_size=4)),
    "isPartial": st.one_of(st.booleans(), st.none(), st.integers(0, 1)),
    "stats": st.just({"seriesFetched": "3"}),
})


def _careful(raw: bytes, convert: Any) -> Any:
    result, error = prom._parse(bytearray(raw), "test", convert)
    return error if error is not None else result


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


ACCEPTED: list[int] = []  # answers the fast way read, over the whole module (a test below checks it is not 0)


def _check(raw: bytes, fast: Any, convert: Any) -> None:
    got = fast(bytearray(raw))
    want = _careful(raw, convert)
    if got is None:
        return  # declined: the careful way reads it, whatever it says
    ACCEPTED.append(len(got))
    assert not isinstance(want, PromError), f"the fast way accepted what the careful way refuses: {want}"
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert type(g) is type(w)
        if isinstance(g, Sample):
            assert g.labels == w.labels and _same(g.value, w.value)
        else:
            assert g.labels == w.labels and len(g.points) == len(w.points)
            assert all(type(p) is tuple and _same(p[0], q[0]) and _same(p[1], q[1])
                       for p, q in zip(g.points, w.points, strict=True))


@settings(max_examples=400, deadline=None)
@given(samples=st.lists(st.fixed_dictionaries({"metric": st.one_of(STRING_LABELS, LABELS), "value": PAIR}),
                        max_size=5),
       envelope=ENVELOPE, status=st.sampled_from(["success", "success", "error"]),
       rtype=st.sampled_from(["vector", "vector", "scalar", "matrix"]))
def test_a_vector_reads_as_the_careful_way_reads_it(samples: list[dict[str, Any]], envelope: dict[str, Any],
                                                    status: str, rtype: str) -> None:
    doc = {"status": status, "data": {"resultType": rtype, "result": samples}, **envelope}
    raw = json.dumps(doc).encode()
    _check(raw, prom._fast_vector, lambda d: prom._vector(d, "q"))


@settings(max_examples=400, deadline=None)
@given(series=st.lists(st.fixed_dictionaries({"metric": st.one_of(STRING_LABELS, LABELS),
                                              "values": st.lists(PAIR, max_size=4)}), max_size=4),
       envelope=ENVELOPE, rtype=st.sampled_from(["matrix", "matrix", "vector"]))
def test_a_matrix_reads_as_the_careful_way_reads_it(series: list[dict[str, Any]], envelope: dict[str, Any],
                                                    rtype: str) -> None:
    doc = {"status": "success", "data": {"resultType": rtype, "result": series}, **envelope}
    raw = json.dumps(doc).encode()
    _check(raw, prom._fast_matrix, lambda d: prom._matrix(d, "q"))


def test_the_common_answers_take_the_fast_way() -> None:
    """Prometheus' own answers (its exact bytes, as the 10,000-node benchmark reads them) are decoded
    fast; the shapes only the careful way reads are declined."""
    vector = (b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"gpu":"0","node":"n-1",'
              b'"uuid":"GPU-1"},"value":[1795896845,"0.6193633553050039"]},{"metric":{},"value":[1795896845.5,"NaN"]}'
              b']}}')
    got = prom._fast_vector(bytearray(vector))
    assert got is not None and got[0] == Sample({"gpu": "0", "node": "n-1", "uuid": "GPU-1"}, 0.6193633553050039)
    assert got[1].labels == {} and math.isnan(got[1].value)
    matrix = (b'{"status":"success","isPartial":false,"data":{"resultType":"matrix","result":[{"metric":'
              b'{"__name__":"gpu_utilization_ratio","uuid":"GPU-1"},"values":[[1795895045,"0.5"],[1795895075,"-Inf"]]}'
              b']},"stats":{"seriesFetched":"1"}}')
    assert prom._fast_matrix(bytearray(matrix)) == [RangeSeries({"__name__": "gpu_utilization_ratio", "uuid": "GPU-1"},
                                                                [(1795895045.0, 0.5), (1795895075.0, -math.inf)])]
    declined = [
        vector.replace(b'"NaN"', b'"+Inf"'),  # msgspec's float does not read "+Inf"
        vector.replace(b'"vector"', b'"scalar"'),
        vector[:-1] + b',"warnings":["store eu-1 unreachable"]}',
        vector.replace(b'"n-1"', b'5'),
        vector.replace(b'1795896845,', b'1e13,'),
    ]
    for raw in declined:
        assert prom._fast_vector(bytearray(raw)) is None, raw


NESTED = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("raw", [
    b"", b"{", b"[]", b'{"status":"success"}', b"\xff",
    # msgspec raises RecursionError, not one of its own errors, for a value nested past its limit (an
    # untyped field: warnings, isPartial): it escaped the fast way once
    b'{"status":"success","warnings":' + NESTED + b',"data":{"resultType":"vector","result":[]}}',
    b'{"status":"success","isPartial":' + NESTED + b',"data":{"resultType":"matrix","result":[]}}',
])
def test_garbage_is_declined_not_raised(raw: bytes) -> None:
    assert prom._fast_vector(bytearray(raw)) is None
    assert prom._fast_matrix(bytearray(raw)) is None


def test_the_properties_above_saw_accepted_answers() -> None:
    """Hypothesis' answers were not all declined (else the comparison above compared nothing)."""
    if not ACCEPTED:  # run alone or first: draw some
        test_a_vector_reads_as_the_careful_way_reads_it()
        test_a_matrix_reads_as_the_careful_way_reads_it()
    assert sum(1 for n in ACCEPTED if n) >= 20


def test_mangled_answers_are_declined_or_read_never_raised() -> None:
    """Real answers with bytes changed, cut or inserted (quotes, escapes, lone surrogates, bytes that are
    not UTF-8, brackets): the fast way returns a result or None, and never raises. A UnicodeDecodeError
    escaped it once, in about one mangled answer in fifteen."""
    vector = (b'{"status":"success","data":{"resultType":"vector","result":[' + b",".join(
        b'{"metric":{"gpu":"%d","node":"node-0001","uuid":"GPU-%d"},"value":[1795896845,"0.%d"]}' % (i, i, i)
        for i in range(8)) + b"]}}")
    matrix = (b'{"status":"success","data":{"resultType":"matrix","result":[' + b",".join(
        b'{"metric":{"uuid":"GPU-%d"},"values":[[1795895045,"0.5"],[1795895075,"0.%d"]]}' % (i, i)
        for i in range(4)) + b"]}}")
    pieces = [b"\\ud800", b"\\u0000", b"\xff", b"\xc3", b'"', b"\\", b"1e999", b"-", b"NaN", b"[", b"]", b"{",
              b"}", b",", b":", b"null", b"true", b'"\\udfff"', b"\xf4\x90\x80\x80"]
    rng = random.Random(5)
    for i in range(3000):
        b = bytearray(vector if i % 2 else matrix)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(b))
            op = rng.random()
            if op < 0.4:
                b[pos:pos + 1] = rng.choice(pieces)
            elif op < 0.7:
                del b[pos:pos + rng.randint(1, 5)]
            else:
                b[pos] = rng.randrange(256)
        for fast in (prom._fast_vector, prom._fast_matrix):
            got = fast(bytearray(b))
            assert got is None or isinstance(got, list)
