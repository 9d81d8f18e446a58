"""Shared pytest fixtures. Keep each fixture small and grouped by the outside system it stands for."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.fakes import fakeamdsmi
from tests.fakes.fakenvml import FakeNvml
from tests.harness import cli_gate
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.prom import Prometheus

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


# ---- the traceback gate (tests/harness/cli_gate.py) -------------------------------------

cli_gate.install()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "allow_traceback: a CLI run of this test is meant to print a traceback")
    config.addinivalue_line("markers", "fleet(**kwargs): the FakeNvml arguments of the `fleet` fixture (e.g. gpus=4)")


# Tests that measure latency, RSS slopes or lease timing: `make test` runs them on their own after the
# parallel part (pytest-xdist), so that other tests' load cannot make their figures lie.
SERIAL = ("tests/reliability/test_load.py", "tests/reliability/test_soak.py", "tests/unit/serve/test_http_hostile.py",
          "tests/unit/profiler/test_leader.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        if Path(item.path).resolve().relative_to(root.resolve()).as_posix() in SERIAL:
            item.add_marker(pytest.mark.serial)


@pytest.fixture(autouse=True)
def no_traceback_from_the_cli(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test when a CLI command it ran wrote a Python traceback to stderr (issue 16)."""
    cli_gate.take()
    yield
    found = cli_gate.take()
    if found and request.node.get_closest_marker("allow_traceback") is None:
        pytest.fail("a CLI command printed a traceback:\n" + "\n".join(found), pytrace=False)


# ---- the fake NVML (tests/fakes/fakenvml.py) ---------------------------------------------


@pytest.fixture
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> FakeNvml:
    """A fake NVML fleet file, ``tmp_path/fleet.conf``; the real pynvml reads it once loaded.

    Its ``FakeNvml`` keyword arguments come from the closest ``fleet`` marker, e.g. a module's
    ``pytestmark = pytest.mark.fleet(gpus=4)``; without one, FakeNvml's defaults (8 GPUs).
    A module that also loads NVML in process overrides ``fleet`` with a fixture that takes this one.
    """
    marker = request.node.get_closest_marker("fleet")
    return FakeNvml(tmp_path / "fleet.conf", **(marker.kwargs if marker else {}))


# ---- the fake amdsmi (tests/fakes/fakeamdsmi.py) -----------------------------------------


@pytest.fixture(scope="session")
def fake_rocm() -> Path:
    """The ``ROCM_PATH`` of the fake ``libamd_smi.so``, built once for the session (shared: never change it)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the fake libamd_smi.so")
    return fakeamdsmi.built()


# ---- Prometheus (tests/harness/prom.py) -------------------------------------------------


@pytest.fixture
def make_prometheus(tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    """Factory: ``make_prometheus(scrape_targets=[...], rule_files=[...], ...)`` -> a started server.

    Keyword arguments go to :class:`Prometheus`; every server is stopped at teardown.
    """
    started: list[Prometheus] = []

    def make(**kwargs: Any) -> Prometheus:
        prom = Prometheus(tmp_path / f"prometheus-{len(started)}", **kwargs)
        started.append(prom)
        return prom.start()

    yield make
    for prom in started:
        prom.stop()


# ---- Kubernetes API (tests/harness/kubeapi.py) ------------------------------------------


@pytest.fixture
def kubeapi() -> Iterator[FakeKubeAPI]:
    """A running fake API server on 127.0.0.1 with no nodes; add them with ``add_node``."""
    with FakeKubeAPI() as api:
        yield api


@pytest.fixture
def kube_client(kubeapi: FakeKubeAPI, tmp_path: Path) -> Iterator[ApiClient]:
    """A real ``kubernetes.client.ApiClient`` for ``kubeapi`` (the global client config is untouched)."""
    from kubernetes import config

    kubeconfig = kubeapi.kubeconfig(tmp_path / "kubeconfig")
    client: ApiClient = config.new_client_from_config(config_file=str(kubeconfig))
    yield client
    client.close()
