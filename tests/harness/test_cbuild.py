"""Self-tests for tests/harness/cbuild.py: one build per key, even when test processes ask at once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.harness import cbuild


@pytest.fixture(autouse=True)
def build_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(cbuild, "BUILD_ROOT", tmp_path / ".build")
    return tmp_path / ".build"


def test_concurrent_callers_share_one_complete_build(build_root: Path) -> None:
    builds: list[Path] = []
    callers = 6
    start = threading.Barrier(callers)
    got: list[Path] = []

    def build(out: Path) -> None:
        builds.append(out)
        for i in range(200):  # some real work, so that the callers overlap
            (out / f"part-{i}").write_text(str(i) * 1000)
        (out / "done").write_text("yes")

    def caller() -> None:
        start.wait()
        got.append(cbuild.cached("thing", b"v1", build))

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(builds) == 1
    assert len(got) == callers and len(set(got)) == 1
    assert (got[0] / "done").read_text() == "yes" and got[0].parent == build_root
    assert cbuild.cached("thing", b"v1", build) == got[0] and len(builds) == 1  # cached afterwards
    assert cbuild.cached("thing", b"v2", build) != got[0] and len(builds) == 2  # another key builds
    assert (build_root / ".gitignore").read_text() == "*\n"


def test_a_failed_build_leaves_nothing(build_root: Path) -> None:
    def broken(out: Path) -> None:
        (out / "half").write_text("x")
        raise RuntimeError("compiler said no")

    with pytest.raises(RuntimeError, match="compiler said no"):
        cbuild.cached("thing", b"v1", broken)
    assert [p.name for p in build_root.iterdir() if not p.name.startswith((".thing-", ".gitignore"))] == []
    assert not any(p.is_dir() for p in build_root.iterdir())
    out = cbuild.cached("thing", b"v1", lambda o: (o / "done").write_text("yes"))
    assert (out / "done").read_text() == "yes"
