"""Shared pytest fixtures. Keep each fixture small and grouped by the outside system it stands for."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings

from tests.fakes import fakeamdsmi
from tests.fakes.fakenvml import FakeNvml
from tests.harness import cli_gate
from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.prom import Prometheus

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


# ---- hypothesis ----------------------------------------------------------------------------

# make test (CI) runs the property tests with a fixed seed, so that a clean clone passes or fails
# the same way every time; make check and plain pytest keep exploring new examples, and a failure
# found there becomes an explicit test (e.g. test_trend.py's underflowing slope).
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])


# ---- the traceback gate (tests/harness/cli_gate.py) -------------------------------------

cli_gate.install()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "allow_traceback: a CLI run of this test is meant to print a traceback")
    config.addinivalue_line("markers", "fleet(**kwargs): the FakeNvml arguments of the `fleet` fixture (e.g. gpus=4)")


# Tests that measure latency, RSS slopes or lease timing: `make test` runs them on their own after the
# parallel part (pytest-xdist), so that other tests' load cannot make their figures lie.
SERIAL = ("tests/reliability/test_load.py", "tests/reliability/test_soak.py", "tests/unit/serve/test_http_hostile.py",
          "tests/unit/profiler/test_leader.py")


# Test modules that start processes (a daemon, a real Prometheus or promtool, a CLI command, helm, chromium),
# or spend seconds of CPU (bcrypt at real costs, hypothesis round trips): marked `slow`, so that `make check`
# (pure unit tests, the inner loop, under 60 s) deselects them up front and leaves them to `make test`.
# Under `make check` (GPU_EXPORTER_CHECK=1) a test that starts a process anyway is skipped at that moment,
# saying so (its module belongs here): the inner loop stays pure even before this list catches up.
SLOW = frozenset((
    "tests/unit/backends/test_amdsmi.py",
    "tests/unit/backends/test_amdsmi_activity.py",
    "tests/unit/backends/test_amdsmi_fidelity.py",
    "tests/unit/backends/test_amdsmi_floor.py",
    "tests/unit/backends/test_amdsmi_processes.py",
    "tests/unit/backends/test_contract.py",
    "tests/unit/backends/test_new_backend.py",
    "tests/unit/backends/test_nvml.py",
    "tests/unit/backends/test_nvml_compat_state.py",
    "tests/unit/backends/test_nvml_depth.py",
    "tests/unit/backends/test_nvml_events.py",
    "tests/unit/backends/test_nvml_fidelity.py",
    "tests/unit/backends/test_nvml_fields.py",
    "tests/unit/backends/test_nvml_generations.py",
    "tests/unit/backends/test_nvml_gpm.py",
    "tests/unit/backends/test_nvml_gpm_row.py",
    "tests/unit/backends/test_nvml_private.py",
    "tests/unit/backends/test_rocm_smi.py",
    "tests/unit/backends/test_sentinels.py",
    "tests/unit/backends/test_simulated.py",
    "tests/unit/core/test_fields.py",
    "tests/unit/core/test_new_family.py",
    "tests/unit/k8s/test_podresources.py",
    "tests/unit/k8s/test_shared_gpus.py",
    "tests/unit/platform/test_http_server.py",
    "tests/unit/platform/test_http_server_fast.py",
    "tests/unit/platform/test_http_survivors.py",
    "tests/unit/platform/test_profiler_web.py",
    "tests/unit/platform/test_units.py",
    "tests/unit/platform/test_webconfig_load.py",
    "tests/unit/profiler/test_allocated.py",
    "tests/unit/profiler/test_allocated_shared.py",
    "tests/unit/profiler/test_annotate.py",
    "tests/unit/profiler/test_dcgm_source.py",
    "tests/unit/profiler/test_faults.py",
    "tests/unit/profiler/test_fleet_size.py",
    "tests/unit/profiler/test_health.py",
    "tests/unit/profiler/test_kube.py",
    "tests/unit/profiler/test_kube_auth.py",
    "tests/unit/profiler/test_longterm.py",
    "tests/unit/profiler/test_main.py",
    "tests/unit/profiler/test_memory_bound.py",
    "tests/unit/profiler/test_papercuts.py",
    "tests/unit/profiler/test_prom.py",
    "tests/unit/profiler/test_reader.py",
    "tests/unit/profiler/test_settings.py",
    "tests/unit/profiler/test_source_trust.py",
    "tests/unit/profiler/test_sources.py",
    "tests/unit/profiler/test_stores.py",
    "tests/unit/profiler/test_underused.py",
    "tests/unit/serve/test_api.py",
    "tests/unit/serve/test_config.py",
    "tests/unit/serve/test_config_hostile.py",
    "tests/unit/serve/test_escaping_roundtrip.py",
    "tests/unit/serve/test_exposition_papercuts.py",
    "tests/unit/serve/test_footprint.py",
    "tests/unit/serve/test_golden.py",
    "tests/unit/serve/test_health_state.py",
    "tests/unit/serve/test_json_integers.py",
    "tests/unit/serve/test_lifecycle.py",
    "tests/unit/serve/test_memory.py",
    "tests/unit/serve/test_papercuts.py",
    "tests/unit/serve/test_render_rows.py",
    "tests/unit/serve/test_security_doc.py",
    "tests/unit/serve/test_serve.py",
    "tests/unit/serve/test_webconfig.py",
    "tests/unit/serve/test_webconfig_auth.py",
    "tests/unit/tools/test_api.py",
    "tests/unit/tools/test_cli_tools.py",
    "tests/unit/tools/test_dcgm_counters.py",
    "tests/unit/tools/test_extras.py",
    "tests/unit/tools/test_gpucheck.py",
    "tests/unit/tools/test_hostile_input.py",
    "tests/unit/tools/test_migration.py",
    "tests/unit/tools/test_pick_papercuts.py",
    "tests/unit/tools/test_record_plot.py",
))


# The modules that took longest in make test's parallel part (a clean-clone run with --durations,
# 2026-11-28): handed out first. Only a scheduling hint: a stale entry costs minutes, never a result.
HEAVIEST = ("tests/e2e/test_presets.py", "tests/unit/tools/test_hostile_input.py", "tests/reliability/test_fuzz.py",
            "tests/unit/backends/test_nvml_generations.py", "tests/unit/backends/test_nvml.py",
            "tests/unit/backends/test_nvml_depth.py", "tests/unit/profiler/test_memory_bound.py",
            "tests/e2e/test_scenarios.py", "tests/unit/k8s/test_shared_gpus.py", "tests/unit/tools/test_cli_tools.py",
            "tests/e2e/test_dashboards.py", "tests/unit/tools/test_gpucheck.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath)).resolve()
    rank: dict[int, int] = {}
    for item in items:
        rel = Path(item.path).resolve().relative_to(root).as_posix()
        if rel in SERIAL:
            item.add_marker(pytest.mark.serial)
            item.add_marker(pytest.mark.slow)  # timing-sensitive: never in make check
        if rel in SLOW or not rel.startswith("tests/unit/"):  # make check runs tests/unit only
            item.add_marker(pytest.mark.slow)
        rank[id(item)] = HEAVIEST.index(rel) if rel in HEAVIEST else len(HEAVIEST) + (
            0 if item.get_closest_marker("slow") else 1)
    # pytest-xdist (--dist loadfile) hands modules out in collection order: the longest first and the
    # pure unit tests last, so that the last module a worker starts is a short one (no long tail)
    items.sort(key=lambda it: rank[id(it)])


_BUILD_TOOLS = {"gcc", "cc"}  # the fakes' C libraries, built once and cached (tests/harness/cbuild.py)


_running: list[pytest.Item] = []  # the test being set up, run or torn down


class ProcessStarted(pytest.skip.Exception):  # type: ignore[name-defined,misc]
    """A test under ``make check`` started a process: it is skipped there (a BaseException, so no
    ``except Exception`` in the code under test swallows it); ``make test`` runs it."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    _running[:] = [item]
    try:
        return (yield)
    finally:
        _running.clear()


def _guard_processes() -> None:
    """Under ``make check`` (GPU_EXPORTER_CHECK=1: pure unit tests), a test not marked slow that starts a process,
    in the test or in any fixture it sets up, is skipped there, naming the rule."""
    real_init = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen[Any], args: Any, *a: Any, **kw: Any) -> None:
        item = _running[0] if _running else None
        argv0 = os.fsdecode(args if isinstance(args, str | bytes | os.PathLike) else (list(args) or [""])[0])
        if item is not None and item.get_closest_marker("slow") is None and \
                os.path.basename(argv0.split()[0] if argv0 else "") not in _BUILD_TOOLS:
            raise ProcessStarted(f"starts a process ({argv0}): left to make test (add its module to SLOW in "
                                 "tests/conftest.py to deselect it up front)")
        real_init(self, args, *a, **kw)

    subprocess.Popen.__init__ = guarded  # type: ignore[method-assign]


if os.environ.get("GPU_EXPORTER_CHECK") == "1":
    _guard_processes()


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


# ---- the profiler (tests/harness/profiler.py) -------------------------------------------


@pytest.fixture
def make_profiler(kubeapi: FakeKubeAPI, tmp_path: Path) -> Callable[..., Any]:
    """Factory: ``make_profiler(prometheus_url, *flags, cluster=True, out=None, **inject)`` -> a Profiler
    wired as ``gpu-exporter profile`` wires it (tests/harness/profiler.build_profiler), writing to ``kubeapi``
    (``cluster=False``: a dry run without a cluster); ``inject`` replaces what no flag gives (an elector, a
    clock), ``tune={"store.backoff": 0.01}`` sets a value deeper down."""
    from tests.harness.profiler import build_profiler

    kubeconfig = kubeapi.kubeconfig(tmp_path / "profiler-kubeconfig")

    def make(prometheus_url: str, *flags: str, cluster: bool = True, out: Any = None, **inject: Any) -> Any:
        return build_profiler(prometheus_url, *flags, kubeconfig=kubeconfig if cluster else None, out=out,
                              **inject)

    return make


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
