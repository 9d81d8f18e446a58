"""The one HTTP/1.1 server of every daemon (``gpu-exporter serve`` and ``gpu-exporter profile``).

TLS, client certificates and basic auth come from ``--web.config.file`` (``webconfig.py``). The
server is small on purpose: ``http.server`` pulls in ``http.client``, ``ssl`` and ``email`` (about
8 MiB of RSS) and gives a thread to each connection. It serves GET and HEAD only.

Three modules, along its seams: ``protocol.py`` (parsing a request, negotiating the format and the
encoding, the head of an answer: pure functions of bytes), ``limits.py`` (the failed-login limiter,
the rate-limit bucket, the answering lanes and the connection cap) and ``server.py`` (the I/O loop,
:class:`HTTPServer`, which uses both).

Fair by construction (issue 26: twice, a few greedy but legal connections took every answer slot):

* **One I/O thread owns every socket**, non-blocking, in one selector: it accepts, handshakes,
  reads requests and writes answers. No thread ever blocks on a client, so a client that does not
  read, trickles or idles costs a file descriptor and a buffer, never a thread or a slot.
* **One request per connection at a time.** The next pipelined request of a connection is parsed
  only once the previous answer is written, so its requests are answered in order and its buffers
  are bounded: ``MAX_HEAD + MAX_BODY`` bytes in, one answer out (whose body is the shared rendered
  bytes, not a copy).
* **Round robin.** Each turn of the loop gives every connection at most one read, one write and
  one parsed request, and accepts new connections; a connection with more pipelined requests waits
  for the next turn. A greedy connection cannot delay another one's first byte.
* **Lanes.** An answer is made in one of three places: ``inline`` on the I/O thread (microseconds:
  ``/healthz``, errors, 401/429), the ``probe`` lane (``/readyz``: its own threads, never behind a
  scrape), or the ``work`` lane (scrapes and the API: at most ``--max-connections`` requests waiting
  or being answered; beyond that, 503 at once, never a queue without bound). A request holds its slot
  only while its answer is made, never while it is written. A route's ``fast`` answer (bytes already
  rendered) is tried on the I/O thread first: no thread hand-off for a cached scrape.
* **Greedy clients are paced.** Pipelined requests already buffered get ``TURN_BUDGET_S`` per turn,
  then a pause as long unless anything else happens, and together hold ``PIPELINED_SLOTS`` work
  slots at most (waiting for one, not 503).
* **bcrypt** runs in a lane of its own (one thread, at most ``BCRYPT_WAITING`` waiting: beyond, 503).
  The per-address failure limiter is charged *before* the check (and refunded when it passes), so
  concurrent guesses cannot all get a check; credentials that passed are cached (``webconfig.py``).

Every state of a connection has a deadline: waiting (TLS handshake, request bytes arriving, idle
keep-alive) ``--read-timeout`` for the whole handshake plus request; an answer must be taken within
the same time; an answer being made, or a slot awaited, ``BUSY_READ_TIMEOUTS`` read timeouts. Every
open connection counts against one cap derived from the file limit (``limits.connection_cap``); at
the cap a new connection replaces one being drained, else the oldest that never completed a
request, the oldest idle keep-alive, the oldest answer not being taken.

A probe listener (``probe_port``) serves the probe paths alone, in plain HTTP, with its own accept
queue and cap: the kubelet's probes then never wait behind a TLS handshake or a greedy client of
the main port (docs/security.md argues why for each class of client).

``/healthz`` and ``/readyz`` (``probe_paths``) are open under basic auth (kubelet probes send
none) and then say only ``ok`` / ``not ready``.
"""

from __future__ import annotations

from exporter.platform.http.protocol import (
    BadRequest,
    Headers,
    Response,
    parse_request,
    wants_gzip,
    wants_openmetrics,
)
from exporter.platform.http.server import PROBE_PATHS, FastRoute, Handler, HTTPServer, Lane, Route

__all__ = ["PROBE_PATHS", "BadRequest", "FastRoute", "HTTPServer", "Handler", "Headers", "Lane", "Response", "Route",
           "parse_request", "wants_gzip", "wants_openmetrics"]
