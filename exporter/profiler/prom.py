"""A small Prometheus HTTP API client (``/api/v1/query``, ``/api/v1/query_range``), urllib only.

Retries transient failures (connection refused, timeout, HTTP 5xx/429) with exponential
backoff and full jitter, up to ``retries`` extra attempts; a query error (HTTP 400/422,
``status: error``) is not retried, since the same query would fail again. Every failure is
raised as :class:`PromError` whose ``kind`` labels the profiler's error counter.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# error kinds (label values of gpu_profiler_errors_total)
UNREACHABLE = "prometheus_unreachable"
TIMEOUT = "prometheus_timeout"
HTTP_5XX = "prometheus_http_5xx"
BAD_QUERY = "prometheus_bad_query"
BAD_RESPONSE = "prometheus_bad_response"
KINDS = (UNREACHABLE, TIMEOUT, HTTP_5XX, BAD_QUERY, BAD_RESPONSE)


class PromError(Exception):
    """A query failed; ``kind`` is one of :data:`KINDS`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Sample:
    """One series of an instant vector: labels and value (NaN/Inf kept as floats)."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class RangeSeries:
    """One series of a range query: labels, and (unix seconds, value) points in time order."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


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
    """``[unix seconds, "value"]`` -> (t, v); a string or an object is not a pair."""
    if not isinstance(p, list) or len(p) != 2:
        raise TypeError(f"sample {p!r:.80} is not a [time, value] pair")
    return _float(p[0]), _float(p[1])


class PromClient:
    """Client for one Prometheus (or a compatible API: Thanos, Mimir, VictoriaMetrics).

    ``base_url`` may carry a path prefix (``http://host:9090/prometheus``). ``token_file``
    is re-read on every request so a rotated (projected service account) token is picked
    up; ``ca_file`` verifies a private CA. ``timeout`` is seconds per HTTP attempt.
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
    ) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"Prometheus URL {base_url!r} must be http:// or https:// with a host")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self.token_file = token_file
        self._sleep = sleep
        self._ssl: ssl.SSLContext | None = None
        if parsed.scheme == "https":
            self._ssl = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
        self.requests_sent = 0  # HTTP attempts, retries included
        if token_file and parsed.scheme == "http" and parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
            log.warning("sending a bearer token to %s over plain http", self.base_url)

    # ---- public API ---------------------------------------------------------------------

    def query(self, expr: str, at: float) -> list[Sample]:
        """Instant query evaluated at unix time ``at``; a scalar comes back as one Sample."""
        data = self._call("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        rtype, result = data.get("resultType"), data.get("result")
        if not isinstance(result, list):
            raise PromError(BAD_RESPONSE, f"answer to {expr[:80]!r} has no result list")
        try:
            if rtype == "vector":
                return [Sample(_labels(s["metric"]), _pair(s["value"])[1]) for s in result]
            if rtype == "scalar":
                return [Sample({}, _pair(result)[1])]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PromError(BAD_RESPONSE, f"malformed vector in answer to {expr[:80]!r}: {exc}") from None
        raise PromError(BAD_RESPONSE, f"unexpected resultType {rtype!r} for an instant query")

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[RangeSeries]:
        """Range query from ``start`` to ``end`` (unix seconds) every ``step`` seconds."""
        data = self._call(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
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
                out.append(RangeSeries(_labels(s["metric"]), [_pair(p) for p in points]))
            return out
        except (KeyError, TypeError, ValueError) as exc:
            raise PromError(BAD_RESPONSE, f"malformed matrix in answer to {expr[:80]!r}: {exc}") from None

    # ---- transport ----------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "gpu-exporter-profiler"}
        if self.token_file:
            try:
                with open(self.token_file) as f:
                    token = f.read().strip()
            except OSError as exc:
                raise PromError(UNREACHABLE, f"cannot read --prometheus-token-file {self.token_file}: {exc}") from None
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _call(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        last: PromError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                # full jitter: spreads retries of many profilers hitting one Prometheus
                delay = random.uniform(0, self.backoff * (2 ** (attempt - 1)))
                log.debug("retrying %s in %.2fs after: %s", path, delay, last)
                self._sleep(delay)
            try:
                return self._once(path, params)
            except PromError as exc:
                last = exc
                if exc.kind not in (UNREACHABLE, TIMEOUT, HTTP_5XX):
                    raise
        assert last is not None
        raise last

    def _once(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        body = urllib.parse.urlencode(params).encode()
        headers = self._headers()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
        req = urllib.request.Request(self.base_url + path, data=body, method="POST", headers=headers)
        self.requests_sent += 1
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = _error_detail(exc)
            if exc.code >= 500 or exc.code == 429:
                raise PromError(HTTP_5XX, f"{self.base_url}{path}: HTTP {exc.code}: {detail}") from None
            if exc.code in (400, 422):
                raise PromError(BAD_QUERY, f"{self.base_url}{path}: HTTP {exc.code}: {detail}") from None
            raise PromError(BAD_RESPONSE, f"{self.base_url}{path}: HTTP {exc.code}: {detail}") from None
        except TimeoutError as exc:
            raise PromError(TIMEOUT, f"{self.base_url}{path}: no answer within {self.timeout:g}s") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError | socket.timeout):
                raise PromError(TIMEOUT, f"{self.base_url}{path}: no answer within {self.timeout:g}s") from None
            raise PromError(UNREACHABLE, f"{self.base_url}{path}: {exc.reason}") from None
        except (ConnectionError, OSError) as exc:
            raise PromError(UNREACHABLE, f"{self.base_url}{path}: {exc}") from None
        except http.client.HTTPException as exc:
            # the connection was cut mid-answer (IncompleteRead) or the answer is not HTTP
            # (BadStatusLine, LineTooLong): not retried, since a proxy doing this will do it again
            raise PromError(BAD_RESPONSE, f"{self.base_url}{path}: broken HTTP answer: "
                            f"{type(exc).__name__} {_one_line(str(exc))}".rstrip()) from None
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise PromError(BAD_RESPONSE, f"{self.base_url}{path}: answer is not JSON ({exc})") from None
        except RecursionError:
            raise PromError(BAD_RESPONSE, f"{self.base_url}{path}: answer is nested too deeply to parse") from None
        if not isinstance(doc, dict):
            raise PromError(BAD_RESPONSE, f"{self.base_url}{path}: answer is not a JSON object")
        if doc.get("status") != "success":
            raise PromError(BAD_QUERY, f"{self.base_url}{path}: {doc.get('errorType')}: {doc.get('error')}")
        data = doc.get("data")
        if not isinstance(data, dict):
            raise PromError(BAD_RESPONSE, f"{self.base_url}{path}: answer has no data object")
        warnings = doc.get("warnings")
        for w in warnings if isinstance(warnings, list) else ():
            log.warning("Prometheus warning: %.300s", w)
        return data


def _one_line(text: str, limit: int = 200) -> str:
    """``text`` on one line, cut to ``limit`` characters (exception texts may carry raw bytes)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        raw = exc.read()
        doc = json.loads(raw)
        return f"{doc.get('errorType')}: {doc.get('error')}"
    except Exception:  # noqa: BLE001 - any body is only a detail of the message
        return str(exc.reason)

