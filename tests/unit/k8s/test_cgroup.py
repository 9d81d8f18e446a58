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


# --- issue 36 item 6: a child cgroup named after another pod never moves a process there -----------------------

_VICTIM = "12345678-aaaa-4bbb-8ccc-1234567890ab"
_OWN = "87654321-dddd-4eee-8fff-ba0987654321"
_VCID, _OCID = "b" * 64, "a" * 64


@pytest.mark.parametrize("path", [
    # cgroupfs: a privileged pod (DinD, systemd in a container) names children after the victim
    f"/kubepods/burstable/pod{_OWN}/{_OCID}/pod{_VICTIM}/{_VCID}",
    f"/kubepods/pod{_OWN}/{_OCID}/kubepods/pod{_VICTIM}/{_VCID}",
    # systemd driver, the victim's names in the escaped systemd form
    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + _OWN.replace("-", "_")
    + f".slice/cri-containerd-{_OCID}.scope/kubepods-burstable-pod{_VICTIM.replace('-', '_')}.slice/"
    f"cri-containerd-{_VCID}.scope",
    # from inside a private cgroup namespace (relative path)
    f"/../../kubepods-besteffort-pod{_OWN.replace('-', '_')}.slice/crio-{_OCID}.scope/pod{_VICTIM}/{_VCID}",
])
def test_the_kubelets_first_pod_component_wins(path: str) -> None:
    assert cgroup.parse_path(path) == cgroup.CgroupRef(_OWN, _OCID)
    assert cgroup.parse(f"0::{path}\n") == cgroup.CgroupRef(_OWN, _OCID)


def test_a_container_id_is_only_the_pods_direct_child() -> None:
    # a child cgroup of the pod that is not a container, with a container-like name below it
    assert cgroup.parse_path(f"/kubepods/pod{_OWN}/sandbox/{_VCID}") == cgroup.CgroupRef(_OWN, "")
    # a process in a child cgroup of its container still belongs to the container
    assert cgroup.parse_path(f"/kubepods/pod{_OWN}/{_OCID}/init.scope") == cgroup.CgroupRef(_OWN, _OCID)
    # a child named like CRI-O's monitor, below a container, does not hide the process outside any pod
    assert cgroup.parse_path(f"/kubepods/pod{_OWN}/{_OCID}/crio-conmon-{_VCID}.scope") == \
        cgroup.CgroupRef(_OWN, _OCID)


def test_which_line_of_a_cgroup_file_decides() -> None:
    a, b = _OWN, _VICTIM
    # the v2 line wins, even when a v1 line names a container and it does not
    assert cgroup.parse(f"1:cpu:/kubepods/pod{a}/{_OCID}\n0::/kubepods/pod{a}\n") == cgroup.CgroupRef(a, "")
    # a v1 line with an empty controller list is not the v2 line
    assert cgroup.parse(f"3::/kubepods/pod{a}\n0::/kubepods/pod{b}/{_VCID}\n") == cgroup.CgroupRef(b, _VCID)
    # v1 only: the first line that names a container; a line without one never replaces it
    assert cgroup.parse(f"2:memory:/kubepods/pod{a}/{_OCID}\n1:cpu:/kubepods/pod{b}/{_VCID}\n") == \
        cgroup.CgroupRef(a, _OCID)
    assert cgroup.parse(f"2:memory:/kubepods/pod{a}\n1:cpu:/kubepods/pod{b}/{_VCID}\n") == cgroup.CgroupRef(b, _VCID)
    assert cgroup.parse(f"2:memory:/kubepods/pod{a}/{_OCID}\n1:cpu:/kubepods/pod{b}\n") == cgroup.CgroupRef(a, _OCID)
    # lines that say nothing (malformed, outside any pod) are skipped, not the end of the file
    assert cgroup.parse(f"garbage\n4:pids:/system.slice/x\n1:cpu:/kubepods/pod{a}/{_OCID}\n") == \
        cgroup.CgroupRef(a, _OCID)
    # a path may hold colons: only the first two separate the fields
    assert cgroup.parse(f"1:cpu:/kubepods/pod{a}/containerd:{_OCID}\n") == cgroup.CgroupRef(a, _OCID)
    assert cgroup.parse_path(f"/kubepods/pod{a}//{_OCID}") == cgroup.CgroupRef(a, _OCID)  # an empty component


def test_read_never_raises(tmp_path: Path) -> None:
    (tmp_path / "7" / "cgroup").mkdir(parents=True)  # opens, but cannot be read
    assert cgroup.read(str(tmp_path), 7) is False
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "cgroup").write_bytes(b"0::/system.slice/caf\xe9\xff.service\n")  # not UTF-8: no pod
    assert cgroup.read(str(tmp_path), 8) is None
    (tmp_path / "9").mkdir()
    (tmp_path / "9" / "cgroup").write_bytes(f"0::/\xff/kubepods/pod{_OWN}/{_OCID}\n".encode("latin-1"))
    assert cgroup.read(str(tmp_path), 9) == cgroup.CgroupRef(_OWN, _OCID)
