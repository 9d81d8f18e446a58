"""The engine hands out snapshots; the bytes are the ``/metrics`` route's (issue 27).

In-process over the real simulated backend: one collection is one :class:`Snapshot` object for all
its readers, and the route's :class:`~exporter.serve.http.Exposition` renders each snapshot once per
format and encoding.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import pytest

from exporter.backends.simulated import SimulatedBackend
from exporter.core.engine import Engine
from exporter.core.options import BackendOptions, FieldFilter
from exporter.core.readings import HostInfo
from exporter.core.snapshot import Snapshot
from exporter.serve.http import Exposition
from exporter.serve.render import render
from tests.harness.poll import wait_until


@pytest.fixture
def engine() -> Iterator[Engine]:
    backend = SimulatedBackend(BackendOptions(simulated_gpus=2))
    e = Engine([backend], HostInfo(node="n", cpu_model="c", kernel="k"), FieldFilter(),
               collection_interval=0, collection_timeout=30, cache_ttl=3600)
    try:
        yield e
    finally:
        e.stop()


def test_engine_returns_one_snapshot_per_collection(engine: Engine) -> None:
    first = engine.scrape()
    assert isinstance(first, Snapshot) and [r.index for c in first.collections for r in c.gpus] == [0, 1]
    assert engine.scrape() is first and engine.cached() is first  # within cache_ttl: the same collection


def test_the_route_renders_a_snapshot_once_per_variant(engine: Engine) -> None:
    cache = Exposition()
    snap = engine.scrape()
    assert cache.rendered(snap) is None  # nothing rendered yet: the I/O thread must hand the scrape on
    text = cache.body(snap, engine.fields)
    assert steady(text) == steady(render(snap, engine.fields))
    assert cache.body(snap, engine.fields) is text and cache.rendered(snap) is text
    assert cache.rendered(snap, openmetrics=True) is None and cache.rendered(snap, gz=True) is None
    om = cache.body(snap, engine.fields, openmetrics=True)
    assert om.endswith(b"# EOF\n") and om != text
    assert gzip.decompress(cache.body(snap, engine.fields, gz=True)) == text


def test_a_newer_snapshot_replaces_the_bytes_and_an_older_one_does_not(engine: Engine) -> None:
    cache = Exposition()
    old = engine.scrape()
    engine.cache_ttl = 0
    new = wait_for_new(engine, old)
    cache.body(new, engine.fields)
    late = cache.body(old, engine.fields)  # a scraper that waited long on the older collection
    assert steady(late) == steady(render(old, engine.fields))
    assert cache.rendered(old) is None and cache.rendered(new) is not None  # the newer one stays cached
    newest = wait_for_new(engine, new)
    cache.body(newest, engine.fields)
    assert cache.rendered(new) is None and cache.rendered(newest) is not None


def steady(body: bytes) -> bytes:
    """``body`` without the process_* samples: two renders of one snapshot read /proc/self twice, and
    the exporter's CPU seconds and RSS may move in between (the rest is the snapshot's)."""
    return b"".join(line for line in body.splitlines(keepends=True) if not line.startswith(b"process_"))


def wait_for_new(engine: Engine, than: Snapshot) -> Snapshot:
    """A later collection's snapshot (cache_ttl 0: each scrape collects; ``created`` is wall-clock time)."""
    return wait_until(lambda: (s := engine.scrape()).created > than.created and s, 10, interval=0.001,
                      what="a newer collection")
