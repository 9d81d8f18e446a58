"""Self-tests for tests/harness/profiler.py: the one way a test builds a profiler."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.kubeapi import FakeKubeAPI
from tests.harness.profiler import build_profiler, closed_port_url


def test_a_dry_run_without_a_cluster_never_finds_this_machines_kubeconfig(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``kubeconfig=None`` is no cluster at all, even where a kubeconfig would be found (a developer's
    ~/.kube/config, $KUBECONFIG): here the default location is a live fake API server's."""
    from kubernetes.config import kube_config

    with FakeKubeAPI() as api:
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(api.kubeconfig(tmp_path / "kc")))
        prof = build_profiler(closed_port_url())
        assert prof.store is None and prof.dry_run
        assert build_profiler(closed_port_url(), kubeconfig=tmp_path / "kc").store is not None


def test_inject_and_tune_reach_the_profiler() -> None:
    prof = build_profiler(closed_port_url(), clock=lambda: 42.0, tune={"reader.client.backoff": 0.0})
    assert prof.clock() == 42.0 and prof.reader.client.backoff == 0.0
    with pytest.raises(AttributeError, match=r"'reader\.client\.bakoff'"):
        build_profiler(closed_port_url(), tune={"reader.client.bakoff": 0.0})
