"""Greedy and hostile HTTP clients of every kind at once, in their own process (issue 26).

``python -m tests.harness.hostile --port P --n 256 --sources others`` holds ``n`` connections open,
an equal share of each kind, reconnecting any that the server closes, until stdin closes:

* ``pipeline``: pipelines 2,000 ``GET /healthz`` at once and reads every answer, then again;
* ``noread``: pipelines 250 ``GET <path>`` (the scrape path) and never reads an answer;
* ``idle``: connects and sends nothing;
* ``trickle``: sends a request one byte per round (0.2 s);
* ``bcrypt``: pipelines requests with a wrong password for a real user, reading the answers.

``--sources same`` connects from 127.0.0.1 (the honest clients' address); ``others`` from
127.0.x.y, a fresh address per connection. It prints ``ready`` once every connection is open,
then one JSON line of counts when stdin closes. Driving them from another process keeps the
hostile clients' own work off the honest clients' interpreter, so honest latencies measure the
server, not the test.
"""

from __future__ import annotations

import argparse
import base64
import json
import selectors
import socket
import sys
import threading
import time
from typing import Any

KINDS = ("pipeline", "noread", "idle", "trickle", "bcrypt")


def _source(i: int, sources: str) -> str:
    return "127.0.0.1" if sources == "same" else f"127.0.{1 + (i // 250) % 250}.{1 + i % 250}"


def _interest(kind: str, sending: bool) -> int:
    """What to wait for: a reader waits for answers (and EOF), a writer for room to send."""
    if kind == "noread":
        return selectors.EVENT_WRITE  # unregistered once everything is sent: never reads
    return selectors.EVENT_READ | (selectors.EVENT_WRITE if sending or kind in ("pipeline", "bcrypt") else 0)


class Driver:
    def __init__(self, port: int, n: int, sources: str, path: str, user: str, tls: bool) -> None:
        self.port, self.n, self.sources, self.path, self.tls = port, n, sources, path, tls
        wrong = base64.b64encode(f"{user}:not-the-password".encode()).decode()
        self.payload = {
            "pipeline": b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 2000,
            "noread": f"GET {path} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: identity\r\n\r\n".encode() * 250,
            "bcrypt": f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {wrong}\r\n\r\n".encode() * 20,
            "trickle": f"GET {path} HTTP/1.1\r\nX-Pad: ".encode() + b"a" * 10_000,
        }
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, dict[str, object]] = {}
        self.counts = {"reconnects": 0, "answer_bytes": 0, "opened": 0}
        self.stop = threading.Event()
        self._next = 0
        self.kinds: tuple[str, ...] = KINDS

    def _open(self, kind: str) -> None:
        i = self._next
        self._next += 1
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((_source(i, self.sources), 0))
            s.settimeout(10)
            s.connect(("127.0.0.1", self.port))
            s.setblocking(False)
        except OSError:
            s.close()
            return
        self.counts["opened"] += 1
        state: dict[str, object] = {"sock": s, "kind": kind, "out": memoryview(self.payload.get(kind, b"")), "step": 0}
        if kind == "trickle":
            state["out"] = memoryview(b"")
        self.conns[s.fileno()] = state
        self.sel.register(s, _interest(kind, bool(state["out"])), state)

    def _drop(self, state: dict[str, object]) -> None:
        s = state["sock"]
        assert isinstance(s, socket.socket)
        self.conns.pop(s.fileno(), None)
        try:
            self.sel.unregister(s)
        except (KeyError, ValueError):
            pass
        s.close()
        self.counts["reconnects"] += 1
        self._open(str(state["kind"]))

    def open_all(self) -> None:
        for i in range(self.n):
            self._open(self.kinds[i % len(self.kinds)])

    def run(self) -> None:
        next_round = time.monotonic()
        while not self.stop.wait(0.005):  # 200 rounds a second at most: the attack, not this process,
            for key, ev in self.sel.select(0.05):  # should load the machine that runs the test
                state = key.data
                s = state["sock"]
                try:
                    if ev & selectors.EVENT_READ:
                        data = s.recv(1 << 20)
                        if not data:
                            self._drop(state)
                            continue
                        self.counts["answer_bytes"] += len(data)
                    if ev & selectors.EVENT_WRITE:
                        out = state["out"]
                        assert isinstance(out, memoryview)
                        if out:
                            state["out"] = out = out[s.send(out):]
                        if not out and state["kind"] in ("pipeline", "bcrypt"):
                            state["out"] = memoryview(self.payload[str(state["kind"])])  # again, forever
                        elif not out and state["kind"] == "noread":
                            self.sel.unregister(s)
                        elif not out:
                            self.sel.modify(s, _interest(str(state["kind"]), False), state)
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    self._drop(state)
            if time.monotonic() >= next_round:  # trickle: one byte per round
                next_round += 0.2
                for state in list(self.conns.values()):
                    if state["kind"] != "trickle":
                        continue
                    step = int(state["step"])  # type: ignore[call-overload]
                    state["step"] = step + 1
                    pad = self.payload["trickle"]
                    try:
                        state["sock"].send(pad[step % len(pad): step % len(pad) + 1])  # type: ignore[union-attr]
                    except BlockingIOError:
                        pass
                    except OSError:
                        self._drop(state)


def honest_scrapers(port: int, seconds: float, think: float, headers: dict[str, str], n: int = 50,
                    ctx: Any = None) -> tuple[list[float], list[str]]:
    """``n`` keep-alive scrapers (``ctx``: an ssl.SSLContext for https), one GET /metrics each ``think`` s
    for ``seconds``: (latencies of the 200 answers, errors)."""
    import http.client

    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def one(i: int) -> None:
        conn: http.client.HTTPConnection = (http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=ctx)
                                            if ctx else http.client.HTTPConnection("127.0.0.1", port, timeout=30))
        stop.wait(think * i / n)
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                conn.request("GET", "/metrics", headers=headers)
                resp = conn.getresponse()
                ok = resp.status == 200 and resp.read()
                with lock:
                    (lat.append(time.perf_counter() - t0) if ok else errors.append(f"HTTP {resp.status}"))
            except (OSError, http.client.HTTPException) as exc:
                with lock:
                    errors.append(type(exc).__name__)
                conn.close()
            stop.wait(think)
        conn.close()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(30)
    return lat, errors


class HostileProcess:
    """``with HostileProcess(port, n, sources, kinds) as h:`` the driver runs (all open) inside the block;
    ``h.counts`` afterwards."""

    def __init__(self, port: int, n: int = 256, sources: str = "same", kinds: tuple[str, ...] = KINDS,
                 path: str = "/metrics") -> None:
        import subprocess
        from pathlib import Path

        self.proc = subprocess.Popen([sys.executable, "-m", "tests.harness.hostile", "--port", str(port), "--n", str(n),
                                      "--sources", sources, "--kinds", ",".join(kinds), "--path", path],
                                     cwd=Path(__file__).resolve().parents[2], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.counts: dict[str, int] = {}

    def __enter__(self) -> HostileProcess:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", line
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self.proc.communicate("", timeout=30)
        lines = out.strip().splitlines()
        self.counts = json.loads(lines[-1]) if lines else {}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--sources", choices=("same", "others"), default="same")
    p.add_argument("--path", default="/metrics")
    p.add_argument("--user", default="prometheus")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of " + ",".join(KINDS))
    a = p.parse_args()
    d = Driver(a.port, a.n, a.sources, a.path, a.user, tls=False)
    d.kinds = tuple(a.kinds.split(","))
    d.open_all()
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    d.stop.set()
    t.join(10)
    print(json.dumps(d.counts), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
