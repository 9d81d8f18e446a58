"""Fixtures shared by the attribution tests: a real gRPC fake kubelet and a PodAttribution factory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from exporter import backends
from exporter.core.readings import GpuReading
from exporter.k8s.podresources import PodAttribution
from tests.fakes.kubelet import FakeKubelet


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    with FakeKubelet() as k:
        yield k


@pytest.fixture
def attribution() -> Iterator[Callable[..., PodAttribution]]:
    """Factory: a started PodAttribution with test-sized intervals; stopped at teardown.

    ``gpus=``: the GPUs to give it (update_gpus) before its first List. Its resource names and DRA
    drivers are the backends' declarations (``resources=`` for others), as ``serve`` wires it.
    """
    made: list[PodAttribution] = []

    def make(path: str, gpus: list[GpuReading] | None = None, **kw: Any) -> PodAttribution:
        opts: dict[str, Any] = {"interval": 0.1, "timeout": 0.5, "max_backoff": 0.4,
                                "resources": backends.gpu_resources(), **kw}
        a = PodAttribution(path, **opts)
        if gpus is not None:
            a.update_gpus(gpus)
        made.append(a)
        a.start()
        return a

    yield make
    for a in made:
        a.stop()
