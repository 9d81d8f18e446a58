"""Hostile input to the single-machine tools (issue 16): every rejection is one line and exit 2.

``diff`` exits 1 for "changed", so a malformed snapshot must never exit 1 (or raise). The
numeric flags of ``pick``, ``diff``, ``record`` and ``snapshot`` reject NaN, infinities, huge
and negative values before anything runs. Fuzzed with hypothesis, in-process (the tools'
``main``), with a few subprocess runs of the real console script.
"""

from __future__ import annotations

import io
import json
import logging
import math
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.python_api import checks as gpus
from exporter.tools import diff, pick, record, snapshot
from tests.harness.cli import gx

Main = Callable[[list[str]], int]


def run(main: Main, argv: list[str]) -> tuple[int, str, str]:
    """A tool's ``main`` with stdout/stderr captured; the root logger (which the tools set up) restored."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(argv)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return code, out.getvalue(), err.getvalue()


def one_line_error(prog: str, err: str) -> str:
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    assert err.startswith(f"gpu-exporter {prog}: error: "), err
    return err


# ---- diff: snapshot and record JSON ---------------------------------------------------------------------------

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))


SMALL = st.one_of(SCALARS, st.lists(SCALARS, max_size=2), st.dictionaries(st.text(max_size=4), SCALARS, max_size=2))
DELETE = object()
# A realistic snapshot (the /stats shape that `snapshot --json` writes): mutations of it reach every check of diff.
BASE: dict[str, Any] = {
    "timestamp": "2025-03-01T12:00:00.000Z",
    "host": {"node_name": "n1", "processor": "AMD EPYC 9654", "kernel": "6.8.0", "os": "Ubuntu 24.04",
             "driver_version": "550.54.15", "cuda_version": "12.4"},
    "gpus": [{"backend": "nvml", "index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H100", "vendor": "nvidia",
              "up": True, "pci_bus_id": f"0000:{i + 1:02x}:00.0", "driver_version": "550.54.15",
              "cuda_version": "12.4", "memory_total_bytes": 85899345920, "memory_used_bytes": 2**30 * (i + 1),
              "power_watts": 70.5 + i, "power_average_watts": 70.0 + i, "power_average_seconds": 1.0,
              "pcie": {"generation": 5, "generation_max": 5, "width": 16, "width_max": 16}} for i in range(2)],
    "p2p": [{"backend": "nvml", "gpu": a, "peer": b, "topology_level": "node",
             "p2p": {"read": True, "write": True, "nvlink": False}} for a, b in ((0, 1), (1, 0))],
}


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def mutate(doc: Any, edits: list[tuple[int, Any]]) -> Any:
    """Replace (or delete) the node at each chosen path with a value of the wrong kind."""
    doc = json.loads(json.dumps(doc))
    for pick_, value in edits:
        paths = _paths(doc)
        path = paths[pick_ % len(paths)]
        if not path:
            doc = {} if value is DELETE else value
            continue
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        if value is DELETE:
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
    return doc


EDITS = st.lists(st.tuples(st.integers(min_value=0, max_value=10**6), st.one_of(SMALL, st.just(DELETE))),
                 min_size=1, max_size=3)
RECORD = st.fixed_dictionaries({"command": st.lists(st.text(max_size=5), max_size=2), "exit_code": SCALARS,
                                "gpu_stats": SMALL, "sample_count": SCALARS, "timestamps": SMALL})


def check_diff(tmp: Path, before: bytes, after: bytes, extra: list[str]) -> None:
    a, b = tmp / "a.json", tmp / "b.json"
    a.write_bytes(before)
    b.write_bytes(after)
    code, out, err = run(diff.main, [str(a), str(b), *extra])
    assert code in (0, 1, 2)
    if code == 2:
        one_line_error("diff", err)
        assert out == ""
    else:
        assert err == "", err
        lines = out.splitlines()
        assert lines[-1].startswith("unchanged" if code == 0 else "CHANGED")
        assert len(lines) == (1 if code == 0 else 1 + int(lines[-1].split()[1]))  # no line forged by a value


def dump(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()  # NaN and Infinity literals too: Python's json reads them


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(edits=EDITS)
def test_diff_of_fuzzed_snapshots_never_crashes(tmp_path_factory: pytest.TempPathFactory,
                                                edits: list[tuple[int, Any]]) -> None:
    """1,800 cases: a mutated snapshot before, after, or on both sides of a valid one."""
    tmp = tmp_path_factory.getbasetemp()
    bad = dump(mutate(BASE, edits))
    for before, after in ((dump(BASE), bad), (bad, dump(BASE)), (bad, bad)):
        check_diff(tmp, before, after, [])


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(doc=st.one_of(RECORD, SMALL, st.binary(max_size=64)))
def test_diff_of_records_and_junk_is_bad_input(tmp_path_factory: pytest.TempPathFactory, doc: Any) -> None:
    """600 cases: a `record -o` document, other JSON or bytes is not a snapshot: exit 2, one line."""
    tmp = tmp_path_factory.getbasetemp()
    data = doc if isinstance(doc, bytes) else dump(doc)
    for before, after in ((data, dump(BASE)), (dump(BASE), data)):
        a, b = tmp / "a.json", tmp / "b.json"
        a.write_bytes(before)
        b.write_bytes(after)
        code, out, err = run(diff.main, [str(a), str(b)])
        assert code == 2 and out == "", (doc, out)
        one_line_error("diff", err)


@pytest.mark.parametrize("content", [
    b"\xff\xfe{}", b"[" * 100_000 + b"]" * 100_000, b'{"host": {}, "gpus": [{"index": ' + b"9" * 5000 + b"}]}",
    b'{"host": {}, "gpus": [{"index": 0, "memory_used_bytes": NaN}]}',
    b'{"host": {}, "gpus": [{"index": 0, "power_watts": "250"}]}',
    b'{"host": {}, "gpus": [{"index": "0"}]}', b'{"host": {}, "gpus": [], "p2p": [{"gpu": 0}]}',
    b'{"host": {}, "gpus": [], "p2p": [{"gpu": 0, "peer": 1, "p2p": []}]}', b'{"host": [], "gpus": []}',
])
def test_diff_of_a_malformed_snapshot_is_bad_input(tmp_path: Path, content: bytes) -> None:
    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_bytes(content)
    good.write_text('{"host": {}, "gpus": []}')
    for files in ([bad, good], [good, bad]):
        code, out, err = run(diff.main, [str(f) for f in files])
        assert code == 2 and out == ""
        assert "bad.json" in one_line_error("diff", err)


# ---- numeric flags -------------------------------------------------------------------------------------------

VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.integers(min_value=-10**30, max_value=10**30).map(str),
                   st.sampled_from(["nan", "NaN", "inf", "-inf", "1e300", "-1e300", "1e-300", "-0", "0", "", " 5",
                                    "abc", "0x10", "1_000", "5%", "1e309"]),
                   st.text(max_size=8))


def in_range(text: str, lo: float, hi: float, lo_open: bool = False) -> bool:
    try:
        v = float(text)
    except ValueError:
        return False
    return math.isfinite(v) and lo <= v <= hi and not (lo_open and v == lo)


def is_count(text: str) -> bool:
    try:
        return int(text) >= 1
    except ValueError:
        return False


# tool, its argv around the value, the flag as errors name it, the oracle (None: no exact oracle)
FLAGS: list[tuple[str, Main, Callable[[str], list[str]], str, Callable[[str], bool] | None]] = [
    ("pick", pick.main, lambda v: ["-n", "1", f"--wait={v}"], "--wait", lambda v: in_range(v, 0, gpus.MAX_TIMEOUT)),
    ("pick", pick.main, lambda v: ["-n", "1", f"--poll={v}"], "--poll",
     lambda v: in_range(v, gpus.MIN_INTERVAL, gpus.MAX_INTERVAL)),
    ("pick", pick.main, lambda v: [f"-n{v}"], "-n", is_count),
    ("pick", pick.main, lambda v: ["-n", "1", f"--min-free={v}"], "--min-free", None),
    ("pick", pick.main, lambda v: ["-n", "1", f"--max-util={v}"], "--max-util", None),
    ("record", record.main, lambda v: [f"--interval={v}", "--backend", "no-such-backend", "--", "true"], "--interval",
     lambda v: in_range(v, gpus.MIN_INTERVAL, gpus.MAX_INTERVAL)),
    ("snapshot", snapshot.main, lambda v: [f"--window={v}"], "--window", lambda v: in_range(v, 0, 60)),
]


@pytest.mark.parametrize(("prog", "main", "argv", "flag", "valid"), FLAGS, ids=[f"{f[0]} {f[3]}" for f in FLAGS])
def test_numeric_flags_reject_bad_values_in_one_line(prog: str, main: Main, argv: Callable[[str], list[str]],
                                                    flag: str, valid: Callable[[str], bool] | None) -> None:
    """A valid value gets as far as the backend (here one that does not exist); a bad one stops at the flag."""

    @settings(max_examples=30, deadline=None)
    @given(value=VALUES)
    def check(value: str) -> None:
        code, out, err = run(main, [*argv(value), "--backend", "no-such-backend"])
        assert code == 2 and out == ""
        line = one_line_error(prog, err)
        reached_backend = "no-such-backend" in line
        if valid is not None:
            assert reached_backend == valid(value), line
        if not reached_backend:
            assert flag in line, line

    check()


@settings(max_examples=300, deadline=None)
@given(value=VALUES)
def test_diff_flags_reject_bad_values(tmp_path_factory: pytest.TempPathFactory, value: str) -> None:
    snap = tmp_path_factory.getbasetemp() / "snap.json"
    snap.write_text('{"host": {}, "gpus": [{"index": 0, "power_watts": 100, "memory_used_bytes": 0}]}')
    for flag in ("--max-power-rise", "--max-memory-rise"):
        code, out, err = run(diff.main, [str(snap), str(snap), f"{flag}={value}"])
        if flag == "--max-power-rise":
            assert (code == 0) == in_range(value, 0, math.inf), (value, err)
        if code == 2:
            assert flag in one_line_error("diff", err)
        else:
            assert code == 0 and out.startswith("unchanged"), err


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(config=st.one_of(SMALL, EDITS.map(lambda e: mutate({"parameters": {"tp-size": [1, 2], "pp": 2}}, e))))
def test_pick_for_a_fuzzed_config(tmp_path_factory: pytest.TempPathFactory, config: Any) -> None:
    path = tmp_path_factory.getbasetemp() / "cfg.json"
    path.write_text(json.dumps(config))
    code, out, err = run(pick.main, ["--for", str(path), "--backend", "no-such-backend"])
    assert code == 2 and out == ""
    one_line_error("pick", err.splitlines(keepends=True)[-1])  # a valid config also prints its sizes first


# ---- the real console script -------------------------------------------------------------------------------------


def test_pick_rejects_nan_and_huge_waits_at_once() -> None:
    for args, flag in ((("--poll", "nan"), "--poll"), (("--poll", "1e300"), "--poll"), (("--wait", "nan"), "--wait"),
                       (("--wait", "inf"), "--wait"), (("--wait", "-1"), "--wait")):
        p = gx("pick", "-n", "1", "--backend", "simulated", *args, timeout=30)
        assert p.returncode == 2 and p.stdout == ""
        assert flag in one_line_error("pick", p.stderr)


def test_diff_max_power_rise_nan_is_rejected_not_ignored(tmp_path: Path) -> None:
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text('{"host": {}, "gpus": [{"index": 0, "power_watts": 100}]}')
    after.write_text('{"host": {}, "gpus": [{"index": 0, "power_watts": 400}]}')
    assert gx("diff", str(before), str(after)).returncode == 1  # the check works
    p = gx("diff", str(before), str(after), "--max-power-rise", "nan")
    assert p.returncode == 2 and "--max-power-rise" in one_line_error("diff", p.stderr)


def test_record_checks_its_output_before_running_the_command(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    for bad in (tmp_path / "missing" / "run.json", tmp_path):
        p = gx("record", "--backend", "simulated", "-o", str(bad), "--", "touch", str(ran))
        assert p.returncode == 2 and f"cannot write {bad}" in one_line_error("record", p.stderr)
        assert not ran.exists(), "the command ran although its recording could not be written"


def test_record_says_where_it_wrote_and_always_passes_the_exit_status(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    sim = ("--backend", "simulated", "--simulated-gpus", "1", "--interval", "0.1")
    p = gx("record", *sim, "-o", str(out / "run.json"), "--", "sh", "-c", "exit 3")
    assert p.returncode == 3 and f"gpu-exporter record: wrote {out / 'run.json'}" in p.stderr
    assert json.loads((out / "run.json").read_text())["exit_code"] == 3
    # the command itself takes the output directory away: the write fails, the status still comes through
    p = gx("record", *sim, "-o", str(out / "run.json"), "--", "sh", "-c", f"rm -rf '{out}'; exit 0")
    assert p.returncode == 0 and f"cannot write {out / 'run.json'}" in p.stderr and "Traceback" not in p.stderr
    p = gx("record", *sim, "-o", str(tmp_path / "run2.json"), "--", sys.executable, "-c", "raise SystemExit(7)")
    assert p.returncode == 7 and (tmp_path / "run2.json").exists()
