"""exporter/k8s/cgroup.py over real path formats (tests/fixtures/cgroup/README.md cites each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.k8s import cgroup

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "cgroup"
EXPECTED: dict[str, dict[str, str] | None] = json.loads((FIXTURES / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture(name: str) -> None:
    ref = cgroup.parse((FIXTURES / f"{name}.cgroup").read_text())
    want = EXPECTED[name]
    if want is None:
        assert ref is None
    else:
        assert ref == cgroup.CgroupRef(want["pod_uid"], want["container_id"])


def test_every_format_is_covered() -> None:
    names = set(EXPECTED)
    for part in ("v1-cgroupfs-containerd", "v1-cgroupfs-crio", "v1-systemd-containerd", "v1-systemd-crio",
                 "v2-cgroupfs-containerd", "v2-cgroupfs-crio", "v2-systemd-containerd", "v2-systemd-crio"):
        assert any(n.startswith(part) for n in names), part


def test_read_from_a_proc_root(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text((FIXTURES / "v2-systemd-crio-burstable.cgroup").read_text())
    ref = cgroup.read(str(tmp_path), 42)
    assert isinstance(ref, cgroup.CgroupRef) and ref.container_id.startswith("9ec39b91")
    assert cgroup.read(str(tmp_path), 43) is False  # gone: not "outside any pod"


@pytest.mark.parametrize("text", ["", "garbage", "0::", "1:cpu:/kubepods/podnot-a-uid/abc",
                                  "0::/kubepods/burstable/pod12345678-1234-1234-1234-1234567890ab-evil/" + "a" * 64])
def test_malformed_names_no_pod(text: str) -> None:
    assert cgroup.parse(text) is None
