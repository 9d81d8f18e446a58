"""List, then watch, one kind of Kubernetes object in the background (the exporter's node-local views).

A daemon thread lists the objects matching a field selector (``spec.nodeName=<node>``), then
follows a watch from the list's ``resourceVersion``; when the watch ends (its ``timeoutSeconds``)
it resumes from the last version seen, and when the server answers 410 Expired it lists again.
After every change it hands the whole set, ``{uid: object}``, to ``on_change``: consumers
build their own immutable index there, so the scrape path reads a dict and never waits for
the API. Objects are the API's JSON (plain dicts), so the same helper serves core types and
API groups the client has no models for (``resource.k8s.io`` versions).

``list_call`` is a list function of the real ``kubernetes`` client, e.g.
``CoreV1Api.list_pod_for_all_namespaces`` or
``functools.partial(CustomObjectsApi.list_cluster_custom_object, group, version, plural)``;
it is called with ``field_selector``, ``watch``, ``resource_version``, ``timeout_seconds``,
``allow_watch_bookmarks``, ``_preload_content=False`` and ``_request_timeout``.
Cost: one list per (re)start, then O(1) work per event plus ``on_change``.
"""

from __future__ import annotations

import codecs
import io
import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from exporter.core.extras import require

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]
MAX_OBJECT_BYTES = 4 << 20  # one object of a list or watch: over etcd's 1.5 MiB request limit, so never a real one


def import_client(who: str = "the Kubernetes API") -> Any:
    """The ``kubernetes`` package, imported lazily, or :class:`~exporter.core.extras.MissingExtra`
    (one line naming the ``k8s`` extra)."""
    require("kubernetes", who)
    import kubernetes

    return kubernetes


def no_retries(api_client: Any) -> Any:
    """Turn off urllib3's own retries in a watch's ``ApiClient`` (returned as given): urllib3 would
    sleep out a 429's Retry-After three times inside one call, out of sight; :class:`Watcher`
    honours it in its own backoff, counted and logged like every other failure. Call it before
    the client's first request (its connection pools take the setting when they are made)."""
    import urllib3

    retry = urllib3.Retry(total=0, connect=0, read=0, status=0, redirect=0, respect_retry_after_header=False,
                          raise_on_status=False, raise_on_redirect=False)
    cfg = getattr(api_client, "configuration", None)
    if cfg is not None:
        cfg.retries = retry
    pool = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
    if pool is not None:
        pool.connection_pool_kw["retries"] = retry
    return api_client


class _Expired(Exception):
    """The watch's resourceVersion is too old (410): list again."""

    def __str__(self) -> str:
        return "HTTP 410 Expired (resourceVersion too old)"


class _ShortWatch(Exception):
    """The server ended a watch at once without an event (client-go: "very short watch")."""

    def __str__(self) -> str:
        return "the watch stream closed at once, without an event"


class TooLarge(ValueError):
    """One object (a list item or a watch line) is over ``max_object_bytes``."""


class Clock:
    """Time as the watch sees it: ``monotonic()`` and a wait that ends early when ``stop`` is set
    (returns whether it was). Tests give a fake one: no sleeping."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        return stop.wait(seconds)


class Backoff:
    """client-go's reflector backoff: the delay starts at ``initial``, doubles per failure up to
    ``cap``, each delay stretched by up to ``jitter`` of itself (a random share, so that many
    exporters do not retry in step) and then capped; it starts again from ``initial`` once
    ``reset_after`` seconds pass without a failure (client-go: 800 ms, 30 s, jitter 1.0, 2 min).
    ``floor``: a server's Retry-After, honoured up to ``cap``."""

    def __init__(self, initial: float = 0.8, cap: float = 30.0, factor: float = 2.0, jitter: float = 1.0,
                 reset_after: float = 120.0, clock: Clock | None = None,
                 rand: Callable[[], float] = random.random) -> None:
        self.initial = float(initial)
        self.cap = float(cap)
        self.factor = float(factor)
        self.jitter = float(jitter)
        self.reset_after = float(reset_after)
        self._clock = clock or Clock()
        self._rand = rand
        self._steps = 0
        self._until: float | None = None  # when the last delay ended

    def next(self, floor: float = 0.0) -> float:
        """The delay before the next try, in seconds."""
        now = self._clock.monotonic()
        if self._until is not None and now - self._until > self.reset_after:
            self._steps = 0
        base = min(self.cap, self.initial * self.factor ** self._steps)
        self._steps = min(self._steps + 1, 64)
        delay = min(self.cap, max(base * (1.0 + self.jitter * self._rand()), min(floor, self.cap)))
        self._until = now + delay
        return delay


def retry_after(exc: BaseException) -> float:
    """A 429/503 answer's ``Retry-After`` in seconds (0 when absent or not a number of seconds)."""
    headers = getattr(exc, "headers", None)
    try:
        value = float(str(headers.get("Retry-After") or 0)) if headers is not None else 0.0
    except (TypeError, ValueError, AttributeError):
        return 0.0
    return value if 0 < value < 1e6 else 0.0


class Watcher:
    """Keeps ``{uid: object}`` for the objects ``list_call`` returns under ``field_selector``.

    ``what`` names them in logs (``pods``). ``timeout_seconds`` is each watch request's
    server-side length; ``request_timeout`` the connect and list read timeout.

    Every failure, whatever it is (410 Expired, 429 with Retry-After, 500, a refused connection,
    a stream that closes at once, a line that is not JSON), is handled the same way: count it,
    wait out :class:`Backoff` (capped at ``max_backoff``), list again. An outage logs one line
    when it starts and one when a watch has run normally again; ``lists``, ``relists``,
    ``expired`` and ``errors`` count what happened (:meth:`families`).

    Memory: ``keep`` reduces each object, as it is decoded, to what the consumer needs; a list
    is decoded item by item from the stream (never the whole answer at once); an object over
    ``max_object_bytes`` fails the request (the API server's own limit, etcd's 1.5 MiB, is
    under the default), and at most ``max_objects`` are kept (the rest counted in ``dropped``).
    """

    def __init__(self, what: str, list_call: Callable[..., Any], on_change: Callable[[Mapping[str, JsonObj]], None],
                 field_selector: str = "", timeout_seconds: int = 300, request_timeout: float = 10.0,
                 max_backoff: float = 30.0, keep: Callable[[JsonObj], JsonObj] | None = None,
                 max_object_bytes: int = MAX_OBJECT_BYTES, max_objects: int = 10000, clock: Clock | None = None,
                 backoff: Backoff | None = None) -> None:
        self.what = what
        self._list_call = list_call
        self._on_change = on_change
        self.field_selector = field_selector
        self.timeout_seconds = int(timeout_seconds)
        self.request_timeout = float(request_timeout)
        self.max_backoff = float(max_backoff)
        self.keep = keep
        self.max_object_bytes = int(max_object_bytes)
        self.max_objects = int(max_objects)
        self.clock = clock or Clock()
        self.backoff = backoff or Backoff(initial=min(0.8, self.max_backoff), cap=self.max_backoff, clock=self.clock)
        self._objects: dict[str, JsonObj] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None
        self._lock = threading.Lock()
        self.synced = threading.Event()  # set after the first successful list
        self.errors = 0  # failed list or watch requests (410 Expired is counted in ``expired``)
        self.expired = 0  # watches answered 410 Expired
        self.lists = 0  # successful lists (the first one, then one per 410 or failure)
        self.relists = 0  # lists after the first (each one after a 410 or a failure, and its backoff)
        self.dropped = 0  # objects left out: over max_objects
        self._failing = False

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=f"watch-{self.what}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            resp = self._resp
        if resp is not None:
            try:
                # shutdown() (urllib3 2.3+) unblocks a read in another thread; close() alone waits for data
                getattr(resp, "shutdown", resp.close)()
            except Exception:  # closing a broken stream may fail; it is gone either way
                log.debug("closing the %s watch failed", self.what, exc_info=True)
        if self._thread is not None:
            self._thread.join(self.request_timeout + 1.0)
        self._thread = None

    def families(self) -> list[Metric]:
        """``gpu_exporter_watch_relists_total`` and ``gpu_exporter_watch_errors_total`` of this watch."""
        from exporter.core import schema

        relists = schema.metric("gpu_exporter_watch_relists_total")
        relists.add_metric([self.what], float(self.relists))
        errors = schema.metric("gpu_exporter_watch_errors_total")
        errors.add_metric([self.what], float(self.errors + self.expired))
        return [relists, errors]

    # --- background thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    if self.lists:
                        self.relists += 1
                    rv = self._list()
                rv = self._watch(rv)
                continue
            except _Expired as exc:
                self.expired += 1
                floor = 0.0
                failure: Exception = exc
            except Exception as exc:  # noqa: BLE001 - nothing may kill the thread; the outage is logged
                if self._stop.is_set():
                    return
                self.errors += 1
                floor = retry_after(exc)
                failure = exc
            rv = None  # whatever failed, the next try lists again: events may have been missed
            delay = self.backoff.next(floor)
            self._note_failure(failure, delay)
            if self.clock.wait(self._stop, delay):
                return

    def _note_failure(self, exc: Exception, delay: float) -> None:
        status = getattr(exc, "status", None)
        why = f"HTTP {status} {getattr(exc, 'reason', '')}".strip() if status else (
            str(exc) if isinstance(exc, (_Expired, _ShortWatch)) else f"{type(exc).__name__}: {exc}")
        hint = "; the exporter's ServiceAccount needs get, list and watch on " + self.what if status == 403 else ""
        if not self._failing:
            self._failing = True
            log.warning("%s watch failed (%s)%s; listing again with backoff (%.1f s, at most %g s), the last known "
                        "%s are kept", self.what, why, hint, delay, self.max_backoff, self.what)
        else:
            log.debug("%s watch still failing (%s); next try in %.1f s", self.what, why, delay)

    def _request(self, **kw: Any) -> Any:
        if self.field_selector:
            kw["field_selector"] = self.field_selector
        resp = self._list_call(_preload_content=False, **kw)
        with self._lock:
            self._resp = resp
        return resp

    def _list(self) -> str:
        resp = self._request(_request_timeout=(self.request_timeout, self.request_timeout))
        objects: dict[str, JsonObj] = {}
        dropped = 0
        try:
            stream = _JsonStream(_reader(resp), self.max_object_bytes)
            meta: Any = {}
            for key in stream.members():
                if key == "items" and stream.peek() == "[":
                    for obj in stream.elements():
                        uid = _uid(obj)
                        if not uid:
                            continue
                        if len(objects) >= self.max_objects and uid not in objects:
                            dropped += 1
                            continue
                        objects[uid] = self._kept(obj)
                elif key == "metadata":
                    meta = stream.value()
                else:
                    stream.value()
        finally:
            self._release(resp)
        self._objects = objects
        self._note_dropped(dropped)
        self.lists += 1
        self._publish()
        self.synced.set()
        return str((meta if isinstance(meta, dict) else {}).get("resourceVersion") or "")

    def _kept(self, obj: JsonObj) -> JsonObj:
        return self.keep(obj) if self.keep is not None else obj

    def _note_dropped(self, dropped: int) -> None:
        if dropped and not self.dropped:
            log.warning("%s watch: over %d objects on this node; %d left out (counted)", self.what, self.max_objects,
                        dropped)
        self.dropped += dropped

    def _watch(self, rv: str) -> str:
        resp = self._request(watch=True, resource_version=rv, timeout_seconds=self.timeout_seconds,
                             allow_watch_bookmarks=True,
                             _request_timeout=(self.request_timeout, self.timeout_seconds + self.request_timeout))
        started = self.clock.monotonic()
        events = 0
        try:
            for line in _lines(_reader(resp, stream=True), self.max_object_bytes):
                if self._stop.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                if not isinstance(event, dict):
                    raise ValueError("a watch event that is not a JSON object")
                kind, obj = event.get("type"), event.get("object") or {}
                if not isinstance(obj, dict):
                    raise ValueError("a watch event whose object is not a JSON object")
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired()
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                events += 1
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if kind == "BOOKMARK":
                    continue
                uid = _uid(obj)
                if not uid:
                    continue
                if kind == "DELETED":
                    self._objects.pop(uid, None)
                elif uid in self._objects or len(self._objects) < self.max_objects:
                    self._objects[uid] = self._kept(obj)
                else:
                    self._note_dropped(1)
                    continue
                self._publish()
        finally:
            self._release(resp)
        if self._stop.is_set():
            return rv
        if events == 0 and self.clock.monotonic() - started < 1.0:
            raise _ShortWatch()
        if self._failing:  # a watch ran its course: the outage is over
            self._failing = False
            log.info("%s watch back", self.what)
        return rv

    def _release(self, resp: Any) -> None:
        with self._lock:
            self._resp = None
        try:
            resp.release_conn()
        except Exception:  # a closed stream has no connection to give back
            log.debug("release_conn failed", exc_info=True)

    def _publish(self) -> None:
        try:
            self._on_change(dict(self._objects))
        except Exception:  # a consumer bug must not stop the watch
            log.exception("%s watch: consumer failed", self.what)


# --- bounded decoding ------------------------------------------------------------------------------

_CHUNK = 1 << 16
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _reader(resp: Any, stream: bool = False) -> Callable[[int], bytes]:
    """``read(n)`` of an answer: at most n bytes, b"" at the end. A watch (``stream``) takes what has
    arrived (``read1``) instead of waiting for n bytes; an answer with only ``data`` is read from it."""
    fn = getattr(resp, "read1", None) if stream else None
    fn = fn or getattr(resp, "read", None)
    if fn is None or not callable(fn):
        buf = io.BytesIO(bytes(resp.data))
        return buf.read
    return lambda n: fn(n) or b""


def _lines(read: Callable[[int], bytes], limit: int) -> Iterator[bytes]:
    """The lines of a stream, each at most ``limit`` bytes (a longer one raises :class:`TooLarge`)."""
    buf = bytearray()
    while True:
        data = read(_CHUNK)
        if not data:
            if buf:
                yield bytes(buf)
            return
        buf += data
        start = 0
        while (nl := buf.find(b"\n", start)) >= 0:
            yield bytes(buf[start:nl])
            start = nl + 1
        del buf[:start]
        if len(buf) > limit:
            raise TooLarge(f"a watch event over {limit} bytes")


class _JsonStream:
    """One JSON document read from a stream piece by piece: the top-level object's members one at a
    time (:meth:`members`), an array's elements one at a time (:meth:`elements`). Never holds more
    than one value of at most ``limit`` characters (plus one read) in memory."""

    def __init__(self, read: Callable[[int], bytes], limit: int) -> None:
        self._read = read
        self._utf8 = codecs.getincrementaldecoder("utf-8")("strict")
        self.limit = limit
        self.buf = ""
        self.pos = 0
        self.eof = False

    def _more(self) -> bool:
        if self.eof:
            return False
        data = self._read(max(_CHUNK, min(self.limit, 1 << 20)))
        if self.pos:
            self.buf, self.pos = self.buf[self.pos:], 0
        if not data:
            self.eof = True
            self.buf += self._utf8.decode(b"", final=True)
            return False
        self.buf += self._utf8.decode(data)
        return True

    def peek(self) -> str:
        """The next character that is not white space (ValueError at the end)."""
        while True:
            m = _WS.match(self.buf, self.pos)
            self.pos = m.end() if m else self.pos
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                raise ValueError("the answer ends early")

    def expect(self, ch: str) -> None:
        got = self.peek()
        if got != ch:
            raise ValueError(f"expected {ch!r} at character {self.pos}, got {got!r}")
        self.pos += 1

    def value(self) -> Any:
        """The next JSON value, whole (at most ``limit`` characters)."""
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError:
                if len(self.buf) - self.pos > self.limit:
                    raise TooLarge(f"an object over {self.limit} bytes") from None
                if self._more():
                    continue
                raise
            if end == len(self.buf) and not isinstance(obj, (dict, list, str)) and self._more():
                continue  # a number or literal may go on in the next read
            if end - self.pos > self.limit:
                raise TooLarge(f"an object over {self.limit} bytes")
            self.pos = end
            return obj

    def members(self) -> Iterator[str]:
        """The keys of the top-level object; the caller reads each one's value before the next."""
        self.expect("{")
        if self.peek() == "}":
            self.pos += 1
            return
        while True:
            key = self.value()
            if not isinstance(key, str):
                raise ValueError("an object key that is not a string")
            self.expect(":")
            yield key
            sep = self.peek()
            self.pos += 1
            if sep == "}":
                return
            if sep != ",":
                raise ValueError(f"expected ',' or '}}', got {sep!r}")

    def elements(self) -> Iterator[Any]:
        """The elements of the array that comes next, decoded one at a time."""
        self.expect("[")
        if self.peek() == "]":
            self.pos += 1
            return
        while True:
            yield self.value()
            sep = self.peek()
            self.pos += 1
            if sep == "]":
                return
            if sep != ",":
                raise ValueError(f"expected ',' or ']', got {sep!r}")


def _uid(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return str(meta.get("uid") or "") if isinstance(meta, dict) else ""


def wait_synced(w: Watcher, timeout: float) -> bool:
    """Whether ``w`` listed within ``timeout`` seconds (start-up; never on the scrape path)."""
    return w.synced.wait(timeout) if timeout > 0 else w.synced.is_set()


__all__ = ["Backoff", "Clock", "TooLarge", "Watcher", "import_client", "no_retries", "retry_after",
           "wait_synced"]
