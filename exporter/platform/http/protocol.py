"""HTTP/1.1 requests in and answers out, with no socket in sight: parsing a request (RFC 9112),
negotiating the exposition format and encoding (RFC 9110 12.5), and the head of an answer.

Pure functions of bytes and strings, so that the fuzz tests and the I/O loop (``server.py``) share
them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MAX_LINE = 8192
MAX_HEADERS = 100
MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 413: "Content Too Large", 414: "URI Too Long", 429: "Too Many Requests",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
           503: "Service Unavailable", 505: "HTTP Version Not Supported"}
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])")
_SINGLE = frozenset({"content-length", "host", "authorization", "transfer-encoding"})  # twice: 400 (smuggling)
_TARGET_BAD = re.compile(rb"[\x00-\x20\x7f]")  # controls and spaces: not in a request target
_VALUE_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # controls but tab: not in a header value
_QVALUE = re.compile(r"(?:0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?)")


class Headers(dict[str, str]):
    """Request headers, keyed by lower-case name."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


Request = tuple[str, str, str, Headers]  # method, target, version, headers


def parse_request(buf: bytearray | bytes) -> tuple[Request, int] | None:
    """((method, target, version, headers), bytes used incl. any body) once ``buf`` holds a request.

    None while it is incomplete; :class:`BadRequest` as soon as it cannot become a valid one.
    """
    head = _parse_head(buf)
    if head is None:
        return None
    request, end, length = head
    if len(buf) < end + length:
        return None
    # GET/HEAD bodies carry no meaning: consumed and dropped
    return request, end + length


def wants_continue(buf: bytearray | bytes) -> bool:
    """True when ``buf`` holds a whole, valid HTTP/1.1 request head that asks ``Expect: 100-continue``
    and whose body has not all arrived: the client waits for ``100 Continue`` before sending it
    (RFC 9110 10.1.1)."""
    try:
        head = _parse_head(buf)
    except BadRequest:
        return False
    if head is None:
        return False
    (_, _, version, headers), end, length = head
    return (version == "HTTP/1.1" and length > 0 and len(buf) < end + length
            and headers.get("expect", "").lower() == "100-continue")


def _parse_head(buf: bytearray | bytes) -> tuple[Request, int, int] | None:
    """(request, where its head ends, its Content-Length) once ``buf`` holds the whole head, else None."""
    start = 0
    while buf[start:start + 1] in (b"\r", b"\n") and start < len(buf):  # stray blank lines (RFC 9112 2.2)
        start += 1
        if start > MAX_LINE:
            raise BadRequest(400, "malformed request line")
    lines: list[bytes] = []
    pos = start
    while True:
        nl = buf.find(b"\n", pos, pos + MAX_LINE + 2)
        if nl < 0:
            if len(buf) - pos > MAX_LINE:
                raise BadRequest(431 if lines else 414, "request line or header too long")
            return None
        line = bytes(buf[pos:nl])
        pos = nl + 1
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > MAX_LINE:
            raise BadRequest(431 if lines else 414, "request line or header too long")
        if not line:
            break
        lines.append(line)
        if len(lines) > MAX_HEADERS + 1 or pos - start > MAX_HEAD:
            raise BadRequest(431, "too many headers")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1] or _TARGET_BAD.search(parts[1]):
        raise BadRequest(400, "malformed request line")
    version = _VERSION.fullmatch(parts[2])
    if version is None:
        raise BadRequest(400, "malformed request line")
    if version.group(1, 2) not in ((b"1", b"1"), (b"1", b"0")):
        raise BadRequest(505, "only HTTP/1.0 and HTTP/1.1")
    headers = Headers()
    for raw in lines[1:]:
        name, sep, value = raw.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):  # also rejects obs-fold and "Name :"
            raise BadRequest(400, "malformed header")
        v = value.strip(b" \t")
        if _VALUE_BAD.search(v):
            raise BadRequest(400, "malformed header")
        key, text = name.decode("ascii").lower(), v.decode("latin-1")
        if key in headers:
            if key in _SINGLE:
                raise BadRequest(400, f"more than one {key} header")
            text = f"{headers[key]}, {text}"
        headers[key] = text
    if "transfer-encoding" in headers:
        raise BadRequest(501, "request bodies are not supported")
    length = headers.get("content-length", "0")
    if not (length.isascii() and length.isdigit()) or len(length) > 12:
        raise BadRequest(400, "bad Content-Length")
    if int(length) > MAX_BODY:
        raise BadRequest(413, "request body too large")
    if version.group(2) == b"1" and "host" not in headers:
        raise BadRequest(400, "HTTP/1.1 request without Host")  # RFC 9112 3.2: MUST be 400
    request = (parts[0].decode("ascii"), parts[1].decode("latin-1"), parts[2].decode("ascii"), headers)
    return request, pos, int(length)


def _qvalues(header: str) -> list[tuple[str, float]]:
    """``Accept``-style header -> [(lower-case value, q)]; a malformed q counts as 0."""
    out: list[tuple[str, float]] = []
    for item in header.split(","):
        value, *params = (p.strip() for p in item.split(";"))
        q = 1.0
        for p in params:
            k, _, v = p.partition("=")
            if k.strip().lower() == "q":
                q = float(v.strip()) if _QVALUE.fullmatch(v.strip()) else 0.0
        if value:
            out.append((value.lower(), q))
    return out


def _quality(ranges: list[tuple[str, float]], media: str) -> float:
    """q of ``media`` (type/subtype) under the most specific matching range (RFC 9110 12.5.1)."""
    kind = media.split("/")[0]
    best, q = -1, 0.0
    for value, vq in ranges:
        rank = 2 if value == media else 1 if value == f"{kind}/*" else 0 if value == "*/*" else -1
        if rank > best:
            best, q = rank, vq
    return q


def wants_openmetrics(accept: str) -> bool:
    """OpenMetrics only when the client ranks it above the text format (ties: text, the classic)."""
    if not accept:
        return False
    ranges = _qvalues(accept)
    om = _quality(ranges, "application/openmetrics-text")
    return om > 0 and om > _quality(ranges, "text/plain")


def wants_gzip(accept_encoding: str) -> bool:
    codings = dict(reversed(_qvalues(accept_encoding)))  # the first mention wins
    return codings.get("gzip", codings.get("*", 0.0)) > 0


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] | None = None


def unauthorized() -> Response:
    return Response(401, b"unauthorized\n",
                    headers={"WWW-Authenticate": 'Basic realm="gpu-exporter", charset="UTF-8"'})


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def answer_head(resp: Response, keep: bool, extra: dict[str, str], http10: bool = False) -> bytes:
    """The status line and headers; ``keep``: the connection stays open after this answer, which an
    HTTP/1.0 client (``http10``) is told, since its default is to close (RFC 9112 9.3)."""
    lines = [f"HTTP/1.1 {resp.status} {REASONS.get(resp.status, 'Unknown')}",
             f"Content-Type: {resp.content_type}", f"Content-Length: {len(resp.body)}"]
    lines += [f"{k}: {v}" for k, v in {**extra, **(resp.headers or {})}.items()]
    if not keep:
        lines.append("Connection: close")
    elif http10:
        lines.append("Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
