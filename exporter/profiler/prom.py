"""A small Prometheus HTTP API client (``/api/v1/query``, ``/api/v1/query_range``), standard library only
(``http.client``).

Retries transient failures (connection refused, timeout, HTTP 5xx/429) with exponential
backoff and full jitter, up to ``retries`` extra attempts; a query error (HTTP 400/422,
``status: error``) is not retried, since the same query would fail again. Every failure is
raised as :class:`PromError` whose ``kind`` labels the profiler's error counter.

Hostile or broken servers: one deadline bounds each attempt from connect to the last byte
(a trickling server cannot hold it), an answer over ``max_response_bytes`` is refused
before it is parsed (``prometheus_response_too_large``), redirects never carry the token
or extra headers to another origin, and whatever a server says is escaped and cut before
it reaches a log line (:func:`printable`).
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import random
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple, TypeVar, cast

import msgspec

from exporter.platform.errors import printable

log = logging.getLogger(__name__)

# error kinds (label values of gpu_profiler_errors_total)
UNREACHABLE = "prometheus_unreachable"
TIMEOUT = "prometheus_timeout"
HTTP_5XX = "prometheus_http_5xx"
BAD_QUERY = "prometheus_bad_query"
BAD_RESPONSE = "prometheus_bad_response"
TOO_LARGE = "prometheus_response_too_large"
QUERY_TOO_LONG = "prometheus_query_too_long"  # refused by the store, or here before sending
TOO_MANY_SERIES = "prometheus_too_many_series"
TOO_MANY_SAMPLES = "prometheus_too_many_samples"  # samples, chunks or the memory they take
PARTIAL = "prometheus_partial_response"  # an answer that says some of the data is missing
KINDS = (UNREACHABLE, TIMEOUT, HTTP_5XX, BAD_QUERY, BAD_RESPONSE, TOO_LARGE, QUERY_TOO_LONG, TOO_MANY_SERIES,
         TOO_MANY_SAMPLES, PARTIAL)
# refusals that a smaller question avoids: the shard (or range batch) is asked in halves
SPLIT_KINDS = (TOO_LARGE, QUERY_TOO_LONG, TOO_MANY_SERIES, TOO_MANY_SAMPLES)

# What the stores say, in a 400 or 422, when a query is over one of their limits (matched in
# the error text; each store's own source is cited in docs/profiler.md, "Refusals"):
_REFUSALS = tuple((kind, re.compile(words, re.IGNORECASE)) for kind, words in (
    # VictoriaMetrics -search.maxQueryLen; Mimir -query-frontend.max-query-expression-size-bytes
    (QUERY_TOO_LONG, r"too long query|err-mimir-max-query-expression-size-bytes|raw query size in bytes exceeds"),
    # VictoriaMetrics -search.maxUniqueTimeseries / maxSeries; Mimir -querier.max-fetched-series-per-query;
    # Thanos Store's --store.limits.request-series (and Mimir's store-gateway wording)
    (TOO_MANY_SERIES, r"number of matching (unique )?time ?series exceeds|err-mimir-max-series-per-query"
                      r"|exceeded series limit|maximum number of series"),
    # Prometheus', Thanos' and Mimir's engine (--query.max-samples); VictoriaMetrics
    # -search.maxSamplesPerQuery and -search.maxMemoryPerQuery; Mimir's chunk and memory limits;
    # Thanos Store's --store.limits.request-samples (chunks)
    (TOO_MANY_SAMPLES, r"too many samples|cannot select more than -search\.maxSamplesPerQuery"
                       r"|not enough memory for processing|err-mimir-max-(estimated-)?chunks|"
                       r"err-mimir-max-estimated-memory|exceeded (chunks|samples) limit"),
))


def refusal_kind(text: str) -> str | None:
    """The limit a store's error text says a query is over (one of SPLIT_KINDS), or None."""
    for kind, words in _REFUSALS:
        if words.search(text):
            return kind
    return None

DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
# The memory one answer may take to parse and convert (ParseCost); larger answers are refused
# (prometheus_response_too_large) and the shard or range batch asked in halves. With the
# answers of a cycle in flight this bounds the profiler's memory (docs/profiler.md, Memory).
DEFAULT_MAX_PARSE_BYTES = 32 * 1024 * 1024
# The longest query expression sent (bytes): VictoriaMetrics' default -search.maxQueryLen (16 KiB).
DEFAULT_MAX_QUERY_BYTES = 16 * 1024
# Sent with every query; a store that does not know them ignores them (Prometheus, Thanos and
# Mimir do). VictoriaMetrics: nocache=1 answers a range on the grid asked for (its cache aligns
# start and end to multiples of the step otherwise) and evaluates an instant query at the time
# asked for (else at most -search.latencyOffset before now).
_STORE_PARAMS = {"nocache": "1"}


NOT_PROMETHEUS = ("this is not a Prometheus API: point --prometheus-url at Prometheus (e.g. http://prometheus:9090), "
                  "not at an exporter")


class PromError(Exception):
    """A query failed; ``kind`` is one of :data:`KINDS`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Sample(NamedTuple):
    """One series of an instant vector: labels and value (NaN/Inf kept as floats).

    A named tuple, not a frozen dataclass: a cycle at 10,000 nodes makes over two million of
    them, and a frozen dataclass takes twice as long to make (each field set through
    ``object.__setattr__``)."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class RangeSeries:
    """One series of a range query: labels, and (unix seconds, value) points in time order."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_RESERVED_HEADERS = frozenset({"host", "content-length", "content-type", "transfer-encoding", "connection"})


def valid_header(name: str, value: str) -> bool:
    """An extra request header we can send as given: an RFC 9110 token for a name we do not
    set ourselves, and a value of visible ASCII and spaces (no CR/LF that would split it)."""
    return (bool(name) and all(c in _TOKEN_CHARS for c in name) and name.lower() not in _RESERVED_HEADERS
            and len(value) <= 4096 and all(c == " " or c == "\t" or 32 < ord(c) < 127 for c in value))


def _labels(m: Any) -> dict[str, str]:
    """A series' labels; every value must be a string (``{"node": 5}`` is not node "5")."""
    if not isinstance(m, dict):
        raise TypeError(f"labels are {type(m).__name__}, not an object")
    for name, value in m.items():
        if not isinstance(value, str):
            raise TypeError(f"label {name[:80]!r} is {type(value).__name__}, not a string")
    return m


def _float(v: Any) -> float:
    # Prometheus sends values as strings: "1.5", "NaN", "+Inf", "-Inf"; float(True) would be 1.0
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        raise TypeError(f"value {v!r:.80} is {type(v).__name__}, not a number")
    try:
        return float(v)
    except OverflowError:  # an integer beyond 1e308 in the JSON
        raise ValueError(f"value {v!r:.80} is out of range") from None


def _pair(p: Any) -> tuple[float, float]:
    """``[unix seconds, "value"]`` -> (t, v); a string or an object is not a pair, and a time
    must be finite (a value may be NaN or infinite: Prometheus sends them as strings)."""
    if not isinstance(p, list) or len(p) != 2:
        raise TypeError(f"sample {p!r:.80} is not a [time, value] pair")
    t = _float(p[0])
    if not -_MAX_TIME < t < _MAX_TIME:
        raise ValueError(f"timestamp {p[0]!r:.80} is not a finite time")
    return t, _float(p[1])


_MAX_TIME = 1e12  # unix seconds (year 33658): NaN and infinities fail the comparison too


def _points(points: list[Any]) -> list[tuple[float, float]]:
    """Range points; 60-500 per series and tens of thousands of series per cycle, so the
    common shape is checked inline and anything else goes the careful way (:func:`_pair`)."""
    out: list[tuple[float, float]] = []
    append = out.append
    for p in points:
        if type(p) is list and len(p) == 2:
            t, v = p
            if type(v) is str and type(t) in (int, float) and -_MAX_TIME < t < _MAX_TIME:
                try:
                    append((float(t), float(v)))
                    continue
                except ValueError:
                    pass
        append(_pair(p))
    return out


def is_base_url(url: str) -> bool:
    """Whether ``url`` is http:// or https:// with a host (``http://:9090`` has none: it would reach this machine)."""
    try:
        parsed = urllib.parse.urlsplit(url)
        return parsed.scheme in ("http", "https") and bool(parsed.hostname)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False


class PromClient:
    """Client for one Prometheus (or a compatible API: Thanos, Mimir, VictoriaMetrics).

    ``base_url`` may carry a path prefix (``http://host:9090/prometheus``). ``token_file``
    is re-read on every request so a rotated (projected service account) token is picked
    up; ``ca_file`` verifies a private CA. ``timeout`` is seconds per HTTP attempt, from
    connect to the last byte. ``headers`` are sent with every request (``X-Scope-OrgID``
    for Mimir, Cortex or a Thanos tenancy proxy).
    """

    def __init__(
        self,
        base_url: str,
        timeout: float = 10.0,
        retries: int = 2,
        backoff: float = 0.5,
        token_file: str | None = None,
        ca_file: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        headers: Mapping[str, str] | None = None,
        max_parse_bytes: int = DEFAULT_MAX_PARSE_BYTES,
        max_query_bytes: int = DEFAULT_MAX_QUERY_BYTES,
    ) -> None:
        if not is_base_url(base_url):
            raise ValueError(f"Prometheus URL {base_url!r} must be http:// or https:// with a host")
        parsed = urllib.parse.urlsplit(base_url)
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self.token_file = token_file
        self.max_response_bytes = max_response_bytes
        self.max_parse_bytes = max_parse_bytes
        self.max_query_bytes = max_query_bytes  # 0: no limit
        self.extra_headers = dict(headers or {})
        for name, value in self.extra_headers.items():
            if not valid_header(name, value):
                raise ValueError(f"header {printable(name, 80)!r}: not a valid HTTP header name and value")
        self._sleep = sleep
        self._ssl: ssl.SSLContext | None = None
        if parsed.scheme == "https":
            self._ssl = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
        self.requests_sent = 0  # HTTP attempts, retries included
        self.largest_response_bytes = 0  # the longest answer body read so far
        if token_file and parsed.scheme == "http" and parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
            log.warning("sending a bearer token to %s over plain http", self.base_url)

    # ---- public API ---------------------------------------------------------------------

    def query(self, expr: str, at: float) -> list[Sample]:
        """Instant query evaluated at unix time ``at``; a scalar comes back as one Sample."""
        self._check_length(expr)
        return self._call("/api/v1/query", {"query": expr, "time": f"{at:.3f}", **_STORE_PARAMS},
                          lambda d: _vector(d, expr), _fast_vector)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[RangeSeries]:
        """Range query from ``start`` to ``end`` (unix seconds) every ``step`` seconds."""
        self._check_length(expr)
        return self._call(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}", **_STORE_PARAMS},
            lambda d: _matrix(d, expr), _fast_matrix,
        )

    def label_values(self, label: str, start: float, end: float) -> list[str]:
        """The values of ``label`` (``__name__``: the metric names) of the series with samples between
        ``start`` and ``end`` (unix seconds), from the store's index: a superset (Prometheus answers
        by block, VictoriaMetrics by day). A GET: Prometheus serves this endpoint to GET only."""
        return self._call(f"/api/v1/label/{label}/values", {"start": f"{start:.3f}", "end": f"{end:.3f}"},
                          _strings, method="GET")

    def _check_length(self, expr: str) -> None:
        n = len(expr.encode())
        if self.max_query_bytes and n > self.max_query_bytes:
            raise PromError(QUERY_TOO_LONG, f"a query of {n} bytes is longer than --prometheus-max-query-bytes "
                                            f"({self.max_query_bytes}); not sent")

    # ---- transport ----------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "gpu-exporter-profiler", **self.extra_headers}
        if self.token_file:
            try:
                with open(self.token_file) as f:
                    token = f.read().strip()
            except OSError as exc:
                raise PromError(UNREACHABLE, f"cannot read --prometheus-token-file {self.token_file}: {exc}") from None
            if not token or not all(32 < ord(c) < 127 for c in token):
                raise PromError(UNREACHABLE, f"--prometheus-token-file {self.token_file}: the token is empty or "
                                             "not printable ASCII")
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _call(self, path: str, params: dict[str, str], convert: Callable[[Any], T],
              fast: Callable[[bytearray], T | None] | None = None, method: str = "POST") -> T:
        last: PromError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                # full jitter: spreads retries of many profilers hitting one Prometheus
                delay = random.uniform(0, self.backoff * (2 ** (attempt - 1)))
                log.debug("retrying %s in %.2fs after: %s", path, delay, last)
                self._sleep(delay)
            try:
                return self._once(path, params, convert, fast, method)
            except PromError as exc:
                last = exc
                if exc.kind not in (UNREACHABLE, TIMEOUT, HTTP_5XX):
                    raise
        assert last is not None
        raise last

    def _once(self, path: str, params: dict[str, str], convert: Callable[[Any], T],
              fast: Callable[[bytearray], T | None] | None = None, method: str = "POST") -> T:
        body = urllib.parse.urlencode(params).encode()
        headers = self._headers()
        self.requests_sent += 1
        url = self.base_url + path
        where = printable(url, 300)
        if method != "GET":
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        status, raw = self._exchange(url, body, headers, where, method)
        if status != 200:
            detail = _error_detail(bytes(raw[:65536]))
            if status >= 500 or status == 429:
                raise PromError(HTTP_5XX, f"{where}: HTTP {status}: {detail}")
            if status in (400, 422):
                raise PromError(refusal_kind(detail) or BAD_QUERY, f"{where}: HTTP {status}: {detail}")
            if status in (404, 405):  # an exporter, a Grafana or a wrong path prefix: not the query API
                raise PromError(BAD_RESPONSE, f"{where}: HTTP {status}: {NOT_PROMETHEUS}")
            raise PromError(BAD_RESPONSE, f"{where}: HTTP {status}: {detail}")
        # One answer is parsed and converted at a time, process-wide: the parser holds the GIL
        # anyway, and so at most one parse tree (bounded by --prometheus-max-parse-bytes) exists.
        with _PARSING:
            result = fast(raw) if fast is not None else None
            error = None
            if result is None:  # not the common shape: the careful way, which names what is wrong
                result, error = _parse(raw, where, convert)
            raw.clear()
        if error is not None:
            raise error
        return cast(T, result)

    def _exchange(self, url: str, body: bytes, headers: dict[str, str], where: str,
                  method: str = "POST") -> tuple[int, bytearray]:
        """``body`` to ``url`` by ``method`` (POST: the form; GET: the target's parameters): (status, body
        read), all under one deadline of ``timeout`` s.

        Redirects are followed only within the origin of ``--prometheus-url`` (same scheme,
        host and port) and only when they keep the method (307, 308), at most 3 times: the
        token and extra headers never leave for another origin or plain http.
        """
        deadline = time.monotonic() + self.timeout
        for _hop in range(MAX_REDIRECTS + 1):
            status, location, raw = self._send(url, body, headers, where, deadline, method)
            if status not in (301, 302, 303, 307, 308):
                return status, raw
            if not location:  # nowhere to go: following it would only ask the same URL again
                raise PromError(BAD_RESPONSE, f"{where}: HTTP {status} redirect without a Location")
            target = urllib.parse.urljoin(url, location)
            if status not in (307, 308) or _origin(target) != _origin(self.base_url):
                raise PromError(BAD_RESPONSE, (
                    f"{where}: HTTP {status} redirect to {printable(target, 200)} not followed (only 307/308 "
                    f"within {printable(self.base_url, 100)}'s origin; credentials never leave it): "
                    "set --prometheus-url to the final address"))
            url = target
            where = printable(url, 300)
        raise PromError(BAD_RESPONSE, f"{where}: more than {MAX_REDIRECTS} redirects")

    def _send(self, url: str, body: bytes, headers: dict[str, str], where: str,
              deadline: float, method: str = "POST") -> tuple[int, str | None, bytearray]:
        parts = urllib.parse.urlsplit(url)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PromError(TIMEOUT, f"{where}: no answer within {self.timeout:g}s")
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=remaining,
                                               context=self._ssl)
        else:
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=remaining)
        expired = threading.Event()
        # the socket, kept once connected: http.client drops conn.sock when the answer will
        # end at close (HTTP/1.0 without a length) while the answer still reads from it
        held: list[socket.socket] = []

        def cut() -> None:
            # one deadline for the whole exchange: a server trickling bytes resets every
            # per-read timeout, so the socket is shut down when the deadline passes
            expired.set()
            for sock in (conn.sock, *held):
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        watchdog = threading.Timer(remaining, cut)
        watchdog.daemon = True
        watchdog.start()
        resp: http.client.HTTPResponse | None = None
        try:
            if method == "GET":  # the parameters in the target: urlsplit's cache never sees them (a new one each cycle)
                target += ("&" if parts.query else "?") + body.decode()
            conn.request(method, target, body=body if method == "POST" else None, headers=headers)
            if conn.sock is not None:
                held.append(conn.sock)
            if expired.is_set():  # cut while connecting: the socket may have escaped the cut
                raise TimeoutError
            resp = conn.getresponse()
            length = resp.getheader("Content-Length")
            if length is not None and length.strip().isdigit() and int(length) > self.max_response_bytes:
                raise PromError(TOO_LARGE, self._too_large(where, f"announces {int(length)} bytes, more"))
            buf = bytearray()  # one buffer: chunks and their join would hold the answer twice
            size = 0
            cost = ParseCost() if resp.status == 200 else None
            while True:
                chunk = resp.read(min(1 << 20, self.max_response_bytes + 1 - size))
                if not chunk:
                    break
                size += len(chunk)
                if size > self.max_response_bytes:
                    raise PromError(TOO_LARGE, self._too_large(where, "is longer"))
                if cost is not None and cost.add(chunk) > self.max_parse_bytes:
                    raise PromError(TOO_LARGE, (
                        f"{where}: the answer would take more than --prometheus-max-parse-bytes "
                        f"({self.max_parse_bytes} bytes) to parse (objects for {cost.bytes} bytes in its first "
                        f"{size} bytes); not read further"))
                buf += chunk
            if expired.is_set():  # the cut ends an answer without a length like a close would
                raise TimeoutError
            if resp.length:  # reads of a given size stop at EOF without raising IncompleteRead
                raise http.client.IncompleteRead(b"", resp.length)
            self.largest_response_bytes = max(self.largest_response_bytes, size)
            return resp.status, resp.getheader("Location"), buf
        except PromError:
            raise
        except TimeoutError:
            raise PromError(TIMEOUT, f"{where}: no answer within {self.timeout:g}s") from None
        except ssl.SSLError as exc:
            raise PromError(UNREACHABLE, f"{where}: {printable(str(exc))}") from None
        except (http.client.HTTPException, OSError) as exc:
            if expired.is_set():
                raise PromError(TIMEOUT, f"{where}: no complete answer within {self.timeout:g}s") from None
            if isinstance(exc, http.client.HTTPException):
                # the connection was cut mid-answer (IncompleteRead) or the answer is not HTTP
                # (BadStatusLine, LineTooLong): not retried, since a proxy doing this will do it again
                raise PromError(BAD_RESPONSE, f"{where}: broken HTTP answer: "
                                f"{type(exc).__name__} {printable(str(exc))}".rstrip()) from None
            raise PromError(UNREACHABLE, f"{where}: {printable(str(exc))}") from None
        finally:
            watchdog.cancel()
            if resp is not None:
                resp.close()  # an answer read to its close holds the socket, not conn
            conn.close()

    def _too_large(self, where: str, what: str) -> str:
        return (f"{where}: the answer {what} than --prometheus-max-response-bytes "
                f"({self.max_response_bytes} bytes); not read")


def _parse(raw: bytearray, where: str,
           convert: Callable[[Any], T]) -> tuple[T, None] | tuple[None, PromError]:
    """``convert(data)`` of a JSON answer, or the PromError saying why not. The error is made
    afresh, without traceback or context: those frames hold the parse tree, and an error kept
    by a caller (a future, the cycle's result) would keep a tree of up to the parse bound alive."""
    try:
        doc = json.loads(raw, parse_constant=_no_constant)
    except ValueError as exc:
        return None, PromError(BAD_RESPONSE, f"{where}: answer is not JSON ({printable(str(exc))})")
    except RecursionError:
        return None, PromError(BAD_RESPONSE, f"{where}: answer is nested too deeply to parse")
    try:
        if not isinstance(doc, dict):
            raise PromError(BAD_RESPONSE, f"{where}: answer is not a JSON object")
        if doc.get("status") != "success":
            detail = f"{printable(str(doc.get('errorType')), 80)}: {printable(str(doc.get('error')))}"
            raise PromError(refusal_kind(detail) or BAD_QUERY, f"{where}: {detail}")
        data = doc.get("data")
        if not isinstance(data, dict | list):  # a query's an object, label values' a list (each convert checks)
            raise PromError(BAD_RESPONSE, f"{where}: answer has no data object")
        partial = _partial(doc)
        if partial:
            raise PromError(PARTIAL, f"{where}: the answer is partial, some of the data is missing ({partial}); "
                                     "not used")
        _log_warnings(doc.get("warnings"), where)
        return convert(data), None
    except PromError as exc:
        return None, PromError(exc.kind, str(exc))
    finally:
        del doc


# ---- the common answer, decoded in C ------------------------------------------------------
# A cycle at 10,000 nodes reads about 150 MB of answers: a million vector samples and two million
# range points. msgspec decodes the common shape (status success, a vector or a matrix, labels all
# strings, [time, "value"] pairs) straight into typed records, every type checked in C: about a
# third of the CPU of json.loads and the per-sample checks of _samples and _points, which was most
# of the profiler's no-change cycle. Anything else returns None and goes the careful way (json and
# the functions below), which names what is wrong: a scalar, an error, a warning or a partial
# answer, a value msgspec's float does not read ("+Inf"; Prometheus writes +Inf so), a time out of
# range, a malformed answer. So the fast way changes no result, only its cost.


class _FastSample(msgspec.Struct):
    metric: dict[str, str]
    value: tuple[float, float]  # lax: the value's string ("0.5", "NaN", "-Inf") read as a float in C


class _FastSeries(msgspec.Struct):
    metric: dict[str, str]
    values: list[tuple[float, float]]


class _FastVectorData(msgspec.Struct):
    resultType: str
    result: list[_FastSample]


class _FastMatrixData(msgspec.Struct):
    resultType: str
    result: list[_FastSeries]


class _FastVector(msgspec.Struct):
    status: str
    data: _FastVectorData
    warnings: Any = None
    isPartial: Any = None


class _FastMatrix(msgspec.Struct):
    status: str
    data: _FastMatrixData
    warnings: Any = None
    isPartial: Any = None


_VECTOR_DECODER = msgspec.json.Decoder(_FastVector, strict=False)
_MATRIX_DECODER = msgspec.json.Decoder(_FastMatrix, strict=False)
_TIME, _VALUE = itemgetter(0), itemgetter(1)
_POINTS = attrgetter("values")


def _decoded(decoder: msgspec.json.Decoder[Any], result_type: str, raw: bytearray) -> Any:
    """The answer's result list when it is a successful answer of ``result_type`` with nothing that
    the careful way must look at (a warning, a partial answer); None otherwise."""
    try:
        doc = decoder.decode(raw)
    except (msgspec.MsgspecError, ValueError, RecursionError):
        # not only its own errors: past its depth limit a RecursionError, for a string that is not UTF-8
        # a UnicodeDecodeError (both found by tests/unit/profiler/test_prom_fast.py)
        return None
    whole = (doc.status == "success" and doc.data.resultType == result_type and not doc.warnings
             and doc.isPartial in (None, False))
    return doc.data.result if whole else None


def _times_ok(pairs: list[tuple[float, float]]) -> bool:
    """Every time finite and within _MAX_TIME (NaN fails the sum's test; a map in C, no Python step per pair)."""
    if not pairs:
        return True
    times = list(map(_TIME, pairs))
    return min(times) > -_MAX_TIME and max(times) < _MAX_TIME and math.isfinite(sum(times))


def _fast_vector(raw: bytearray) -> list[Sample] | None:
    """An instant vector's samples, or None: not the common shape (see above)."""
    result: list[_FastSample] | None = _decoded(_VECTOR_DECODER, "vector", raw)
    if result is None:
        return None
    pairs = [s.value for s in result]
    if not _times_ok(pairs):
        return None
    return [Sample(s.metric, v) for s, v in zip(result, map(_VALUE, pairs), strict=True)]


def _fast_matrix(raw: bytearray) -> list[RangeSeries] | None:
    """A range answer's series, or None: not the common shape (see above)."""
    result: list[_FastSeries] | None = _decoded(_MATRIX_DECODER, "matrix", raw)
    if result is None or not _times_ok(list(chain.from_iterable(map(_POINTS, result)))):
        return None
    return [RangeSeries(s.metric, s.values) for s in result]


def _vector(data: dict[str, Any], expr: str) -> list[Sample]:
    if not isinstance(data, dict):
        raise PromError(BAD_RESPONSE, f"answer to {expr[:80]!r} has no data object")
    rtype, result = data.get("resultType"), data.get("result")
    if not isinstance(result, list):
        raise PromError(BAD_RESPONSE, f"answer to {expr[:80]!r} has no result list")
    try:
        if rtype == "vector":
            return _samples(result)
        if rtype == "scalar":
            return [Sample({}, _pair(result)[1])]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise PromError(BAD_RESPONSE, f"malformed vector in answer to {expr[:80]!r}: {exc}") from None
    raise PromError(BAD_RESPONSE, f"unexpected resultType {rtype!r} for an instant query")


_ALL_STR = frozenset((str,)).issuperset  # every label value a string: their types checked in C


def _samples(result: list[Any]) -> list[Sample]:
    """A vector's samples; millions a cycle, so the common shape (labels all strings, a number
    and a string) is checked inline and anything else goes the careful way (:func:`_labels`,
    :func:`_pair`), which names the problem."""
    out: list[Sample] = []
    append = out.append
    for s in result:
        m, p = s["metric"], s["value"]
        if type(m) is dict and _ALL_STR(map(type, m.values())) and type(p) is list and len(p) == 2:
            t, v = p
            if type(v) is str and type(t) in (int, float) and -_MAX_TIME < t < _MAX_TIME:
                try:
                    append(Sample(m, float(v)))
                    continue
                except ValueError:
                    pass
        append(Sample(_labels(m), _pair(p)[1]))
    return out


def _strings(data: Any) -> list[str]:
    """A label values answer: a list of strings."""
    if not isinstance(data, list) or not all(type(v) is str for v in data):
        raise PromError(BAD_RESPONSE, "a label values answer that is not a list of strings")
    return data


def _matrix(data: dict[str, Any], expr: str) -> list[RangeSeries]:
    if not isinstance(data, dict):
        raise PromError(BAD_RESPONSE, f"answer to {expr[:80]!r} has no data object")
    if data.get("resultType") != "matrix":
        raise PromError(BAD_RESPONSE, f"unexpected resultType {data.get('resultType')!r} for a range query")
    result = data.get("result")
    if not isinstance(result, list):
        raise PromError(BAD_RESPONSE, f"answer to {expr[:80]!r} has no result list")
    try:
        out = []
        for s in result:
            points = s["values"]
            if not isinstance(points, list):
                raise TypeError(f"values are {type(points).__name__}, not a list")
            out.append(RangeSeries(_labels(s["metric"]), _points(points)))
        return out
    except (KeyError, TypeError, ValueError) as exc:
        raise PromError(BAD_RESPONSE, f"malformed matrix in answer to {expr[:80]!r}: {exc}") from None


_PARSING = threading.Lock()
T = TypeVar("T")


class ParseCost:
    """A bound, from the bytes alone, on the memory that parsing and converting an answer takes.

    Counted chunk by chunk as the answer arrives (``bytes.count`` runs at memory speed), so an
    answer that would parse into too many objects is refused before it is all read. Measured
    costs per token of CPython 3.11's json (parse tree plus conversion, tracemalloc), rounded up:
    an object 80 bytes (``{}`` in a list: 72), an array 128 (a range point, parsed and
    converted), a value after a comma 40 (a float: 33), a key 140 (``{"":0}`` takes 192), a
    string 32 per quote; the text itself twice (the decoded document, then its strings), or 9
    times when it holds non-ASCII or ``\\u`` escapes (one astral character makes a whole string
    4 bytes a character). Prometheus' own answers come out 1-3 times their measured cost.
    """

    __slots__ = ("_last", "length", "tokens", "wide")

    def __init__(self) -> None:
        self.tokens = 0  # bytes for the objects the tokens make
        self.length = 0  # bytes of text
        self.wide = False  # the text holds non-ASCII or \\u escapes
        self._last = b""

    def add(self, chunk: bytes) -> int:
        """Count one more piece of the answer; the bound so far, in bytes."""
        c = chunk.count
        self.tokens += 80 * c(b"{") + 128 * c(b"[") + 40 * c(b",") + 140 * c(b":") + 32 * c(b'"')
        self.length += len(chunk)
        if not self.wide and (not chunk.isascii() or b"\\u" in chunk or (self._last == b"\\" and chunk[:1] == b"u")):
            self.wide = True
        self._last = chunk[-1:]
        return self.bytes

    @property
    def bytes(self) -> int:
        return self.tokens + self.length * (9 if self.wide else 2)

MAX_REDIRECTS = 3
_MAX_WARNINGS_LOGGED = 3


def _no_constant(name: str) -> Any:
    """JSON has no NaN or Infinity (Prometheus writes them as strings); Python's json would take them."""
    raise ValueError(f"{name} is not JSON")


def _origin(url: str) -> tuple[str, str, int | None]:
    p = urllib.parse.urlsplit(url)
    try:
        port = p.port or (443 if p.scheme == "https" else 80)
    except ValueError:
        port = None
    return p.scheme.lower(), (p.hostname or "").lower(), port


def _log_warnings(warnings: Any, where: str) -> None:
    """At most a few distinct warnings of one answer, one line each, then one line for the rest."""
    if not isinstance(warnings, list) or not warnings:
        return
    distinct = list(dict.fromkeys(printable(str(w)) for w in warnings[:10000]))
    for w in distinct[:_MAX_WARNINGS_LOGGED]:
        log.warning("Prometheus warning (%s): %s", where, w)
    if len(warnings) > _MAX_WARNINGS_LOGGED:
        log.warning("Prometheus sent %d more warnings with that answer (%d distinct in all)",
                    len(warnings) - min(len(distinct), _MAX_WARNINGS_LOGGED), len(distinct))


def _partial(doc: dict[str, Any]) -> str:
    """Why an answer is partial ("" when it is whole): VictoriaMetrics cluster's ``isPartial``,
    or a warning that is not one of Prometheus' PromQL annotations (``PromQL info: ...``,
    ``PromQL warning: ...``, about the query itself): Thanos' partial responses say which
    store failed in their ``warnings``."""
    if doc.get("isPartial") is True:
        return "isPartial: true"
    warnings = doc.get("warnings")
    if isinstance(warnings, list):
        for w in warnings[:10000]:
            if not str(w).startswith("PromQL "):
                return f"warning: {printable(str(w), 160)}"
    return ""


def _error_detail(raw: bytes) -> str:
    """The Prometheus error of an error answer, or the start of the body, made printable."""
    try:
        doc = json.loads(raw[:65536])
        if isinstance(doc, dict):
            return f"{printable(str(doc.get('errorType')), 80)}: {printable(str(doc.get('error')))}"
    except (ValueError, RecursionError):
        pass
    return printable(raw[:400].decode("utf-8", "replace")) or "(no body)"
