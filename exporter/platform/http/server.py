"""The I/O loop: one thread owns every socket (accept, TLS handshake, read, write) and hands
answers to the lanes of ``limits.py``; requests are parsed by ``protocol.py``. See the package's
docstring for the fairness rules it keeps.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from exporter.platform.http.limits import PROBE_OPEN, FailureLimiter, RateBucket, ThreadLane, connection_cap
from exporter.platform.http.protocol import (
    CONTINUE,
    MAX_BODY,
    MAX_HEAD,
    BadRequest,
    Headers,
    Response,
    answer_head,
    parse_request,
    unauthorized,
    wants_continue,
)

if TYPE_CHECKING:
    from exporter.platform.webconfig import LiveWebConfig, WebConfig

log = logging.getLogger(__name__)

PROBE_PATHS = frozenset({"/healthz", "/readyz"})  # open under basic auth (kubelet probes); say only up/down
BCRYPT_WAITING = 32  # password checks waiting or running at once; more get 503 (bcrypt is ~100 ms of CPU)
PROBE_THREADS = 4  # /readyz may wait for a collection (collect-on-scrape): a few, separate from scrapes
SEND_CHUNK = 64 * 1024  # bytes per send() and turn: a turn stays short however many clients read slowly
ACCEPT_PER_TURN = 128
TURN_BUDGET_S = 0.002  # pipelined requests answered, and TLS handshakes worked on, per turn: this long at most
PIPELINED_SLOTS = 4  # work slots all pipelined requests together may hold (a quarter of them at most)
BUSY_READ_TIMEOUTS = 6  # an answer being made (or a pipelined request waiting for a slot): this many read timeouts
DRAIN_S = 1.0  # an error answer is out: what the client still sends is read (and dropped) this long at most
ACCEPT_PAUSE_S = 0.1  # accept() failed (EMFILE): the listener is not watched for this long
WEB_CHECK_S = 1.0  # the web config's files are looked at this often without traffic


Lane = str  # "inline" (on the I/O thread: must not block), "probe" or "work"


@dataclass
class Handler:
    """One request, as routes see it."""

    server: HTTPServer
    client_address: Any
    command: str
    path: str
    request_version: str
    headers: Headers
    authorized: bool = True  # basic auth off, or these credentials passed
    pipelined: bool = False  # sent before the previous answer on its connection was taken


# (handler, path, query) -> Response
Route = Callable[[Handler, str, str], Response]
# the same, on the I/O thread, from what is ready now; None: the route's lane answers instead
FastRoute = Callable[[Handler, str, str], "Response | None"]


_READ, _BUSY, _WRITE, _CLOSING = "read", "busy", "write", "closing"
_LISTEN = object()
_PROBE_LISTEN = object()  # the probe listener: plain HTTP, probe paths only


@dataclass(eq=False)
class _Conn:
    sock: Any  # socket.socket or ssl.SSLSocket
    addr: Any
    deadline: float
    web: WebConfig | None = None  # the config its TLS handshake used (client_allowed_sans)
    handshaken: bool = True
    state: str = _READ
    eof: bool = False  # the client half-closed: answer what is here, then close
    queued: bool = False  # in ``_ready``: its next pipelined request is parsed on the next turn
    events: int = 0  # what the selector waits for on its behalf
    buf: bytearray = field(default_factory=bytearray)
    out: list[memoryview] = field(default_factory=list)
    keep: bool = True  # after ``out`` is written: wait for the next request (or close)
    drain: bool = False  # an error answer: half-close and read to EOF, so the answer is not lost to a reset
    continued: bool = False  # ``100 Continue`` sent for the request being read
    probe: bool = False  # accepted on the probe listener: plain HTTP, the probe paths only, its own cap


class HTTPServer:
    """The listening socket, the I/O thread (``serve_forever``) and the answering lanes."""

    def __init__(self, addr: tuple[str, int], max_connections: int, read_timeout: float,
                 web: WebConfig | None = None, probe_paths: frozenset[str] = PROBE_PATHS,
                 probe_port: int | None = None) -> None:
        self.socket = _listen(addr)
        self.server_address = self.socket.getsockname()
        # ``probe_port``: a second listener for the kubelet's probes, plain HTTP whatever the web config,
        # serving the probe paths only (which say nothing but up or down), with its own accept queue and
        # connections: no TLS handshake, basic auth or greedy client of the main port is in a probe's way
        self.probe_socket: socket.socket | None = None
        self.probe_address: Any = None
        if probe_port is not None:
            try:
                self.probe_socket = _listen((addr[0], probe_port))
            except OSError:
                self.socket.close()
                raise
            # accepted only once a request's bytes are here (Linux): a connection that sends nothing never
            # takes a place, and a probe's request (one segment) is read and answered the moment it is
            # accepted, so no later connection can push it out before its answer
            with contextlib.suppress(AttributeError, OSError):
                self.probe_socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, max(1, int(read_timeout)))
            self.probe_address = self.probe_socket.getsockname()
        self.live: LiveWebConfig | None = None
        if web is not None:
            from exporter.platform.webconfig import LiveWebConfig

            self.live = LiveWebConfig(web)
        self.routes: dict[str, Route] = {}
        self.lanes: dict[str, Lane] = {}  # path -> lane; "work" when not named
        self.fast: dict[str, FastRoute] = {}  # path -> answer from what is ready, on the I/O thread
        self.probe_paths = probe_paths
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self.max_open = connection_cap(max_connections)  # connections of the main port, in every state
        self.busy_timeout = BUSY_READ_TIMEOUTS * read_timeout
        self.failures = FailureLimiter()
        self._work = ThreadLane("work", max_connections)
        self._probe = ThreadLane("probe", PROBE_THREADS)
        self._bcrypt = ThreadLane("bcrypt", 1)  # checks run one at a time, as in the toolkit: bcrypt is CPU
        self._rate: tuple[tuple[float, int], RateBucket] | None = None
        self._inbox: deque[tuple[str, Any, Any]] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._fresh: OrderedDict[_Conn, None] = OrderedDict()  # never completed a request; deadline order
        self._idle: OrderedDict[_Conn, None] = OrderedDict()  # keep-alive between requests; deadline order
        self._writing: OrderedDict[_Conn, None] = OrderedDict()  # an answer being taken; deadline order
        self._closing: OrderedDict[_Conn, None] = OrderedDict()
        self._busy: OrderedDict[_Conn, None] = OrderedDict()  # an answer being made or a slot awaited
        self._open: dict[_Conn, None] = {}  # every open connection of the main port, oldest first
        self._probe_open: dict[_Conn, None] = {}  # every open connection of the probe listener, oldest first
        self._refusing = 0  # connections refused at the cap in this episode (logged once per episode)
        self._accept_failures = 0  # failed accepts in this episode (logged once per episode)
        self._ready: deque[_Conn] = deque()  # more pipelined bytes to parse, next turn
        self._deferred: deque[tuple[_Conn, Handler, str]] = deque()  # pipelined, waiting for a work slot
        self._pipelined = 0  # pipelined requests in the work lane
        self._pipelined_cap = max(1, min(PIPELINED_SLOTS, max_connections // 4))
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._running = False
        self._web: WebConfig | None = None
        self._next_web_check = 0.0
        self._accept_paused_until = 0.0

    def route(self, path: str, fn: Route, lane: Lane = "work", fast: FastRoute | None = None) -> None:
        """Serve ``path`` with ``fn``: ``inline`` only for answers that never block (microseconds).

        ``fast``: tried first on the I/O thread, it answers from bytes already made (a cached
        exposition) without a thread hand-off, or returns None to leave the request to ``fn``.
        """
        self.routes[path] = fn
        self.lanes[path] = lane
        if fast is not None:
            self.fast[path] = fast

    @property
    def web(self) -> WebConfig | None:
        """The web config in force (re-loaded first if its files changed)."""
        return self.live.current() if self.live is not None else None

    def _io_web(self) -> WebConfig | None:
        """The web config for the I/O thread: a change is loaded in the background, never here."""
        return self.live.current(block=False) if self.live is not None else None

    # --- life cycle --------------------------------------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Run the I/O loop in this thread until :meth:`shutdown` (``poll_interval``: unused, kept for
        the ``socketserver`` signature)."""
        self._running = True
        self._web = self._io_web()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._sel.register(self.socket, selectors.EVENT_READ, _LISTEN)
        if self.probe_socket is not None:
            self._sel.register(self.probe_socket, selectors.EVENT_READ, _PROBE_LISTEN)
        try:
            while not self._stop.is_set():
                self._turn()
        except Exception:  # a bug here would stop all serving: make it loud
            log.exception("HTTP I/O loop failed")
            raise
        finally:
            for d in (self._open, self._probe_open):
                for conn in list(d):
                    self._close(conn)
            self._sel.close()
            self._stopped.set()

    def shutdown(self) -> None:
        self._stop.set()
        self._post("stop", None, None)
        if self._running:
            self._stopped.wait()

    def server_close(self) -> None:
        self._stop.set()
        self._post("stop", None, None)
        if self._running:
            self._stopped.wait(5)
        for s in (self.socket, self.probe_socket, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError, AttributeError):
                s.close()  # type: ignore[union-attr]

    def _post(self, what: str, a: Any, b: Any) -> None:
        """From a lane to the I/O thread."""
        self._inbox.append((what, a, b))
        with contextlib.suppress(OSError):  # the pipe is full: the loop is awake anyway
            self._wake_w.send(b"\0")

    # --- the I/O thread ----------------------------------------------------------------------------

    def _turn(self) -> None:
        now = time.monotonic()
        if now >= self._next_web_check:  # notice edits and rotations without traffic
            self._next_web_check = now + WEB_CHECK_S
            self._web = self._io_web()
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._sel.register(self.socket, selectors.EVENT_READ, _LISTEN)
        # pipelined backlog alone: a pause as long as its budget, so greedy clients get half a core at
        # most (in a pod with a CPU limit, burning the quota would throttle every answer); any other
        # event ends the pause at once. Deferred requests are woken by an answer (the inbox).
        timeout = 0.0 if self._inbox else TURN_BUDGET_S if self._ready else self._next_timeout()
        events = self._sel.select(timeout)
        handshakes_until = time.monotonic() + TURN_BUDGET_S
        for key, mask in events:
            data = key.data
            if data is None:
                with contextlib.suppress(OSError):
                    while self._wake_r.recv(4096):
                        pass
            elif data is _LISTEN:
                self._accept()
            elif data is _PROBE_LISTEN:
                self._accept_probes()
            elif data.state == _WRITE and mask & selectors.EVENT_WRITE:
                self._flush(data)
            elif not data.handshaken and time.monotonic() > handshakes_until:
                continue  # TLS handshakes (about 1 ms of CPU each) get a budget per turn; the rest next turn
            elif data.state in (_READ, _CLOSING):
                self._on_readable(data)
        while self._inbox:
            what, conn, payload = self._inbox.popleft()
            if what == "stop":
                self._stop.set()
            elif what == "answer":
                h, resp, pipelined = payload
                self._pipelined -= pipelined
                self._send_answer(conn, h, resp)
            elif what == "authed":
                self._after_auth(conn, *payload)
        while self._deferred and self._pipelined < self._pipelined_cap:
            conn, h, path = self._deferred.popleft()
            if conn.state == _BUSY:
                self._route(conn, h, path)
        # pipelined requests already buffered: one each, for a few milliseconds at most, so that a
        # turn stays short however many connections pipeline (the rest wait for the next turn)
        budget = time.monotonic() + TURN_BUDGET_S
        for _ in range(len(self._ready)):
            if time.monotonic() > budget:
                break
            conn = self._ready.popleft()
            conn.queued = False
            if conn.state != _READ:
                continue
            if getattr(conn.sock, "pending", lambda: 0)():  # TLS bytes already decrypted: read them first
                self._on_readable(conn, pipelined=True)
            else:
                self._parse(conn, pipelined=True)
        self._expire()

    def _next_timeout(self) -> float:
        heads = [next(iter(d)).deadline for d in self._timed() if d]
        if self._accept_paused_until:  # accepting again is due then, not at the next event or second
            heads.append(self._accept_paused_until)
        return max(0.0, min([1.0, *(h - time.monotonic() for h in heads)]))

    def _expire(self) -> None:
        now = time.monotonic()
        for d in self._timed():
            while d:
                conn = next(iter(d))
                if conn.deadline > now:
                    break
                # idle keep-alive, a silent, trickling or not-reading client, a slow handshake, an answer
                # that never came (a hung route: its lane's late answer is dropped), a slot never free
                self._close(conn)

    def _timed(self) -> tuple[OrderedDict[_Conn, None], ...]:
        """Every state a connection can be in, each with its deadline, each in deadline order."""
        return self._fresh, self._idle, self._writing, self._closing, self._busy

    def _want(self, conn: _Conn, events: int) -> None:
        if events == conn.events:
            return
        try:
            if not events:
                self._sel.unregister(conn.sock)
            elif not conn.events:
                self._sel.register(conn.sock, events, conn)
            else:
                self._sel.modify(conn.sock, events, conn)
        except (KeyError, ValueError, OSError):
            self._close(conn)
            return
        conn.events = events

    def _accept(self) -> None:
        for _ in range(ACCEPT_PER_TURN):
            try:
                sock, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: pause accepting instead of spinning
                if not self._accept_failures:  # once per episode (before: a line per failure, 87-95 in 8 s)
                    log.warning("accept failed: %s; pausing accepts for %g s at a time until one succeeds "
                                "(%d connections open, cap %d)", exc, ACCEPT_PAUSE_S, len(self._open), self.max_open)
                self._accept_failures += 1
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(self.socket)
                self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
                return
            if self._accept_failures:
                log.info("accepting again after %d failed accepts", self._accept_failures)
                self._accept_failures = 0
            self._add(sock, addr)

    def _accept_probes(self) -> None:
        assert self.probe_socket is not None
        for _ in range(ACCEPT_PER_TURN):
            try:
                sock, addr = self.probe_socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE: the main port's accept says so; a probe retries
                return
            self._add(sock, addr, probe=True)

    def _victim(self, probe: bool) -> _Conn | None:
        """The connection to close for a new one at the cap: one whose answer is out and is being
        drained, else the oldest that never completed a request, the oldest idle keep-alive, the oldest
        answer not being taken. Never one whose answer is being made (their number is bounded by the
        lanes: ``--max-connections``, 32 password checks, the probe lane)."""
        for d in (self._closing, self._fresh, self._idle, self._writing):
            for conn in d:
                if conn.probe is probe:
                    return conn
        return None

    def _add(self, sock: socket.socket, addr: Any, probe: bool = False) -> None:
        pool, cap = (self._probe_open, PROBE_OPEN) if probe else (self._open, self.max_open)
        while len(pool) >= cap:
            victim = self._victim(probe)
            if victim is None:  # every connection is being answered: this one cannot be held
                if probe:
                    with contextlib.suppress(OSError):
                        sock.close()
                    return
                if not self._refusing:
                    log.warning("%d connections open (the cap, from the file limit), every one being answered: "
                                "closing new connections until one ends", len(self._open))
                self._refusing += 1
                with contextlib.suppress(OSError):
                    sock.close()
                return
            log.debug("closing the connection of %s for a new one: %d open", victim.addr, len(self._open))
            self._close(victim)
        if self._refusing and not probe:
            log.info("accepting connections again after refusing %d at the cap", self._refusing)
            self._refusing = 0
        conn = _Conn(sock, addr, time.monotonic() + self.read_timeout, probe=probe)
        try:
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            web = self._web = self._io_web()  # per connection, as the toolkit reloads (a few stat calls)
            if web is not None and web.ssl_context is not None and not probe:
                conn.sock = web.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                conn.web, conn.handshaken = web, False
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                sock.close()
            return
        (self._probe_open if probe else self._open)[conn] = None
        self._fresh[conn] = None
        self._want(conn, selectors.EVENT_READ)
        if conn.handshaken:  # plain HTTP: the request often came with the connection (a probe): no extra turn
            self._on_readable(conn)

    def _on_readable(self, conn: _Conn, pipelined: bool = False) -> None:
        if not conn.handshaken and not self._handshake(conn):
            return
        try:
            while True:  # one read, plus what TLS already decrypted
                room = MAX_HEAD + MAX_BODY + 1 - len(conn.buf)
                try:
                    chunk = conn.sock.recv(min(65536, max(room, 1)))
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    if type(exc).__name__ in ("SSLWantReadError", "SSLWantWriteError"):
                        break
                    raise
                if not chunk:
                    conn.eof = True  # half-closed: a request already here is still answered
                    break
                if conn.state == _CLOSING:
                    break  # read and dropped, one read a turn: the answer is out, EOF is awaited
                conn.buf += chunk
                if len(conn.buf) > MAX_HEAD + MAX_BODY or not getattr(conn.sock, "pending", lambda: 0)():
                    break
        except OSError:  # ssl.SSLError included: a reset, a bad record
            self._close(conn)
            return
        if conn.state == _READ and not conn.queued:  # queued: its next request is parsed in its turn
            self._parse(conn, pipelined)
        if conn.eof and conn.state in (_READ, _CLOSING) and not conn.queued:
            self._close(conn)  # nothing more will come: not waiting for the rest of a request

    def _handshake(self, conn: _Conn) -> bool:
        import ssl

        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._want(conn, selectors.EVENT_READ)
            return False
        except ssl.SSLWantWriteError:
            self._want(conn, selectors.EVENT_WRITE)
            return False
        except OSError:  # ssl.SSLError: a failed handshake, a reset
            self._close(conn)
            return False
        conn.handshaken = True
        self._want(conn, selectors.EVENT_READ)
        if conn.web is not None and not conn.web.client_allowed(conn.sock.getpeercert()):
            log.debug("client certificate from %s has none of client_allowed_sans", conn.addr)
            self._close(conn)
            return False
        return True

    def _parse(self, conn: _Conn, pipelined: bool = False) -> None:
        """The next request of ``conn``, if its bytes are all here: answer it (one at a time).

        ``pipelined``: it was sent before the previous answer was taken (see :meth:`_route`).
        """
        try:
            parsed = parse_request(conn.buf)
        except BadRequest as exc:
            self._error(conn, exc.status, str(exc))
            return
        if parsed is None:
            if len(conn.buf) > MAX_HEAD + MAX_BODY:
                self._error(conn, 431, "request too large")
            elif conn.eof:
                self._close(conn)
            else:
                if not conn.continued and wants_continue(conn.buf):
                    self._continue(conn)
                    if conn.state != _READ:
                        return
                self._want(conn, selectors.EVENT_READ)  # the rest of the request: watched again
            return
        (command, target, version, headers), used = parsed
        del conn.buf[:used]
        conn.continued = False
        self._fresh.pop(conn, None)
        self._idle.pop(conn, None)
        conn.state = _BUSY  # nothing more is parsed until this answer is written
        conn.deadline = time.monotonic() + self.busy_timeout
        self._busy[conn] = None
        conn_hdr = headers.get("connection", "").lower()
        conn.keep = ("keep-alive" in conn_hdr if version == "HTTP/1.0" else "close" not in conn_hdr) and not conn.eof
        h = Handler(self, conn.addr, command, target, version, headers)
        h.pipelined = pipelined
        if command not in ("GET", "HEAD"):
            self._send_answer(conn, h, Response(405, b"only GET and HEAD\n", headers={"Allow": "GET, HEAD"}))
            return
        try:
            path = urlsplit(target).path
        except ValueError:
            self._error(conn, 400, "malformed request target")
            return
        probe = path in self.probe_paths
        if conn.probe:  # the probe listener: the probe paths, open, unlimited by rate_limit; nothing else
            # anonymous, whatever the main port asks (basic auth, a client certificate): up or down only
            h.authorized = False
            if probe:
                self._route(conn, h, path)
            else:
                self._send_answer(conn, h, Response(404, b"not found\n"))
            return
        web = self._web
        if web is not None and web.rate_limit is not None and not probe:
            if self._rate is None or self._rate[0] != web.rate_limit:
                self._rate = (web.rate_limit, RateBucket(*web.rate_limit))
            if not self._rate[1].allow():
                self._send_answer(conn, h, Response(429, b"rate limited\n", headers={"Retry-After": "1"}))
                return
        if web is not None and web.users:
            header = headers.get("authorization")
            if not web.cached(header):
                h.authorized = False
                if header is not None:
                    self._check_password(conn, h, web, header, path, probe)
                    return
                if not probe:
                    self._send_answer(conn, h, unauthorized())
                    return
        self._route(conn, h, path)

    def _check_password(self, conn: _Conn, h: Handler, web: WebConfig, header: str, path: str, probe: bool) -> None:
        """bcrypt in its lane, charged to the client's address first; then :meth:`_after_auth`."""
        addr = _address(conn.addr)
        wait = self.failures.charge(addr)
        if wait or self._bcrypt.pending >= BCRYPT_WAITING:
            if not wait:
                self.failures.refund(addr)  # not checked: not a failure
            if probe:  # open: an anonymous probe gets up or down only
                self._route(conn, h, path)
            elif wait:
                self._send_answer(conn, h, Response(429, b"too many failed logins\n",
                                                    headers={"Retry-After": str(wait)}))
            else:
                self._send_answer(conn, h, Response(503, b"too many logins being checked\n",
                                                    headers={"Retry-After": "1"}))
            return

        self._want(conn, 0)  # not watched while the check runs: nothing more is read meanwhile

        def job() -> None:
            ok = False
            try:
                ok = web.check(header)
            finally:
                self._post("authed", conn, (h, path, ok, probe))

        self._bcrypt.submit(job)

    def _after_auth(self, conn: _Conn, h: Handler, path: str, ok: bool, probe: bool) -> None:
        if conn.state != _BUSY:  # closed meanwhile (its deadline, the loop stopping)
            return
        if ok:
            self.failures.refund(_address(conn.addr))
            h.authorized = True
        if ok or probe:
            self._route(conn, h, path)
        else:
            self._send_answer(conn, h, unauthorized())

    def _route(self, conn: _Conn, h: Handler, path: str) -> None:
        route = self.routes.get(path)
        if route is None:
            self._send_answer(conn, h, Response(404, b"not found\n"))
            return
        lane = self.lanes.get(path, "work")
        if lane == "inline":
            self._send_answer(conn, h, _call(route, h))
            return
        fast = self.fast.get(path)
        if fast is not None:
            resp = _call(fast, h)
            if resp is not None:
                self._send_answer(conn, h, resp)
                return
        pool = self._probe if lane == "probe" else self._work
        pipelined = pool is self._work and h.pipelined
        if pipelined and self._pipelined >= self._pipelined_cap:
            # a pipelining client is willing to wait, and all of them together hold a few slots at
            # most: the rest (and the GIL) stay for requests sent one at a time
            self._want(conn, 0)
            self._deferred.append((conn, h, path))
            return
        if pool is self._work and pool.pending >= self.max_connections:  # every slot answering: 503 at once
            self._error(conn, 503, "too many requests in progress", {"Retry-After": "1"})
            return
        self._pipelined += pipelined
        self._want(conn, 0)  # not watched while a lane makes the answer: nothing more is read meanwhile
        pool.submit(lambda: self._post("answer", conn, (h, _call(route, h), pipelined)))

    def _error(self, conn: _Conn, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        """An error answer, then the connection is closed (after reading what is left, for a second)."""
        conn.state, conn.keep, conn.drain = _BUSY, False, True
        self._fresh.pop(conn, None)
        self._idle.pop(conn, None)
        self._want(conn, 0)
        self._send_answer(conn, None, Response(status, (message + "\n").encode(), headers=headers))

    def _send_answer(self, conn: _Conn, h: Handler | None, resp: Response) -> None:
        if conn.state != _BUSY:  # closed meanwhile (evicted, the loop stopping)
            return
        web = self._web
        head = answer_head(resp, conn.keep, web.headers if web is not None else {},
                           http10=h is not None and h.request_version == "HTTP/1.0")
        body = resp.body if h is None or h.command != "HEAD" else b""
        if len(body) <= 16384:  # small: one send; large: the shared bytes themselves, not a copy
            conn.out = [memoryview(head + body)]
        else:
            conn.out = [memoryview(head), memoryview(body)]
        conn.state, conn.deadline = _WRITE, time.monotonic() + self.read_timeout
        self._busy.pop(conn, None)
        self._writing[conn] = None
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        """Write what the client takes now, without waiting; the rest when it is writable again."""
        try:
            while conn.out:
                view = conn.out[0]
                try:
                    sent = conn.sock.send(view[:SEND_CHUNK])
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError as exc:
                    if type(exc).__name__ not in ("SSLWantWriteError", "SSLWantReadError"):
                        raise
                    sent = 0
                if not sent:
                    self._want(conn, selectors.EVENT_WRITE)
                    return
                conn.out[0] = view[sent:]
                if not conn.out[0]:
                    conn.out.pop(0)
                if sent >= SEND_CHUNK:  # a big answer: the rest on a later turn, after the others
                    self._want(conn, selectors.EVENT_WRITE)
                    return
        except OSError:
            self._close(conn)
            return
        self._writing.pop(conn, None)
        if conn.drain:
            self._drain(conn)
        elif not conn.keep:
            self._close(conn)
        else:
            conn.state, conn.deadline = _READ, time.monotonic() + self.read_timeout
            self._idle[conn] = None
            if conn.buf or getattr(conn.sock, "pending", lambda: 0)():
                # pipelined: the next request on the next turn, and not watched until its bytes run
                # out (a pipelining client must not cost a read on every turn)
                self._want(conn, 0)
                if not conn.queued:
                    conn.queued = True
                    self._ready.append(conn)
            else:
                self._want(conn, selectors.EVENT_READ)

    def _continue(self, conn: _Conn) -> None:
        """``100 Continue`` (25 bytes, between two requests' answers, so the socket's buffer is empty):
        sent now or never; a client that gets none sends its body after a wait anyway."""
        conn.continued = True
        try:
            sent = conn.sock.send(CONTINUE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if type(exc).__name__ in ("SSLWantWriteError", "SSLWantReadError"):
                return
            self._close(conn)
            return
        if sent != len(CONTINUE):  # half an interim answer would garble the next: give up on the connection
            self._close(conn)

    def _drain(self, conn: _Conn) -> None:
        try:  # half-close and drain, so that the answer is not lost to a reset
            if hasattr(conn.sock, "unwrap"):
                raise OSError("TLS: close at once")
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.state, conn.deadline = _CLOSING, time.monotonic() + DRAIN_S
        conn.buf.clear()
        self._closing[conn] = None
        self._want(conn, selectors.EVENT_READ)

    def _close(self, conn: _Conn) -> None:
        for d in (*self._timed(), self._open, self._probe_open):
            d.pop(conn, None)
        if conn.events:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(conn.sock)
            conn.events = 0
        conn.state, conn.out = _CLOSING, []
        conn.buf.clear()
        with contextlib.suppress(OSError):
            conn.sock.close()


def _listen(addr: tuple[str, int]) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in addr[0] else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)  # the backlog: bursts of scrapers wait in the kernel, not fail
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _address(addr: Any) -> str:
    return str(addr[0]) if isinstance(addr, tuple) else str(addr)


def _call(route: Callable[[Handler, str, str], Any], h: Handler) -> Any:
    try:
        parts = urlsplit(h.path)
        return route(h, parts.path, parts.query)
    except Exception:  # one bad request must not kill the server
        log.exception("error serving %r", h.path[:200])
        return Response(500, b"internal error\n")
