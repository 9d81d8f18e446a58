"""The Python API (``import exporter``) in-process, over the real pynvml and the fake libnvidia-ml.

Other backends (amdsmi, rocm-smi, simulated), the documented examples and a ``mypy --strict``
user script run in subprocesses.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pynvml
import pytest

import exporter
from exporter import backends
from exporter import python_api as api
from exporter.python_api import selection, sessions
from exporter.python_api.checks import settings_for
from exporter.serve.api_schema import RECORD
from tests.fakes.contract_fleets import BACKENDS, fleet_env
from tests.fakes.fakenvml import FakeNvml, load_in_process
from tests.harness.exporter import REPO

GIB = 2**30
PUBLIC = {"Availability", "GpuStatus", "GpuUnavailable", "InsufficientGpus", "Monitor", "Recording", "Requirements",
          "check_availability", "estimate_requirements", "query_gpus", "select_gpus", "wait_for_availability"}


pytestmark = pytest.mark.fleet(gpus=4)


@pytest.fixture
def fleet(fleet: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    """The suite's fleet (four fake GPUs), read by pynvml in this process (loaded once; the fleet file per test)."""
    load_in_process(fleet.library)
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(fleet.path))
    before = pynvml._nvmlLib_refcount  # another module of the session may hold NVML: only our change counts
    yield fleet
    assert pynvml._nvmlLib_refcount == before, "the API left NVML initialised"


def raw_free(g: dict[str, Any]) -> int:
    return int(g["mem_total"] - g["mem_reserved"] - g["mem_used"])


# ---- the package ------------------------------------------------------------------------------------


def test_all_lists_exactly_the_public_api_and_loads_it_lazily() -> None:
    assert set(exporter.__all__) == PUBLIC and len(exporter.__all__) == len(PUBLIC)
    for name in PUBLIC:
        assert getattr(exporter, name) is getattr(api, name)
    code = ("import sys, exporter\n"
            "assert 'exporter.python_api' not in sys.modules and 'exporter.core.engine' not in sys.modules\n"
            "exporter.GpuStatus\n"
            "assert 'exporter.python_api' in sys.modules\n"
            "try:\n    exporter.no_such_name\nexcept AttributeError as e:\n    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "no attribute 'no_such_name'" in p.stdout


# ---- query_gpus ---------------------------------------------------------------------------------------


def test_query_gpus_reads_the_fleet_in_si_units(fleet: FakeNvml) -> None:
    fleet.set(2, util_gpu=40)
    fleet.unsupported(3, "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage")
    fleet.lose(1)
    found = exporter.query_gpus(backend="nvml")
    assert [g.index for g in found] == [0, 1, 2, 3]
    for g, raw in zip(found, fleet.gpus, strict=True):
        if g.index == 1:
            continue  # lost before it was ever read: not even its identity is known
        assert g.uuid == raw["uuid"] and g.name == raw["name"]
        assert g.up
        assert g.memory_total_bytes == raw["mem_total"] and g.memory_used_bytes == raw["mem_used"]
        assert g.memory_free_bytes == raw_free(raw)
        assert g.utilization_ratio == pytest.approx(raw["util_gpu"] / 100)
        assert g.score == pytest.approx(0.6 * raw_free(raw) / raw["mem_total"] + 0.4 * (1 - raw["util_gpu"] / 100),
                                        abs=1e-6)
        if g.index != 3:
            assert g.temperature_celsius == raw["temp_gpu"]
            assert g.power_watts == pytest.approx(raw["power_mw"] / 1000)
    assert found[3].temperature_celsius is None and found[3].power_watts is None  # unsupported: None, not 0
    lost = found[1]
    assert not lost.up and lost.score == 0.0
    assert (lost.memory_free_bytes, lost.utilization_ratio, lost.power_watts) == (None, None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        found[0].index = 9  # type: ignore[misc]


# ---- selection ------------------------------------------------------------------------------------------


def test_select_gpus_ranks_by_score_and_says_what_is_missing(fleet: FakeNvml) -> None:
    fleet.set(0, util_gpu=95)
    fleet.set(2, mem_used=fleet.gpus[2]["mem_total"] - fleet.gpus[2]["mem_reserved"] - GIB, util_gpu=0)
    fleet.set(3, util_gpu=1)
    scores = {g.index: g.score for g in exporter.query_gpus(backend="nvml")}
    best = sorted(scores, key=lambda i: (-scores[i], i))
    assert exporter.select_gpus(4, min_free_bytes=None, max_utilization=1.0, backend="nvml") == best
    assert exporter.select_gpus(2, min_free_bytes=8 * GIB, backend="nvml") == [i for i in best if i in (1, 3)]
    with pytest.raises(exporter.InsufficientGpus) as err:
        exporter.select_gpus(3, min_free_bytes=8 * GIB, backend="nvml")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("need 3 GPUs with >= 8.0 GiB free and <= 50% utilisation, found 2")
    assert "gpu 0 is 95% busy (max 50%)" in msg and "gpu 2 has 1.0 GiB free (needs 8.0 GiB)" in msg
    assert err.value.availability.gpus == [i for i in best if i in (1, 3)]
    with pytest.raises(exporter.InsufficientGpus, match="need 5 GPUs but this machine has 4"):
        exporter.select_gpus(5, backend="nvml")


def test_check_availability_answers_without_raising(fleet: FakeNvml) -> None:
    fleet.set(0, util_gpu=80)
    a = exporter.check_availability(2, min_free_bytes=GIB, backend="nvml")
    assert a.ok and len(a.gpus) == 2 and 0 not in a.gpus
    assert a.gpus == exporter.select_gpus(2, min_free_bytes=GIB, backend="nvml")
    assert len(a.statuses) == 4 and a.statuses == sorted(a.statuses, key=lambda s: (-s.score, s.index))
    b = exporter.check_availability(4, backend="nvml")
    assert not b.ok and sorted(b.gpus) == [1, 2, 3] and "gpu 0 is 80% busy" in b.reason


def test_wait_returns_as_soon_as_gpus_qualify(fleet: FakeNvml) -> None:
    for i in range(4):
        fleet.set(i, util_gpu=90)
    checks: list[api.Availability] = []

    def on_check(a: api.Availability) -> None:
        checks.append(a)
        if len(checks) == 2:
            fleet.set(2, util_gpu=5)  # a job ends between two polls

    with sessions.session(settings_for("nvml")) as engine:
        a = selection.wait(engine, 1, 0.0, 0.5, timeout=60, interval=0.05, on_check=on_check)
    assert a.ok and a.gpus == [2] and len(checks) == 3
    assert [c.ok for c in checks] == [False, False, True]


def test_wait_for_availability_returns_at_the_deadline(fleet: FakeNvml) -> None:
    for i in range(4):
        fleet.set(i, util_gpu=90)
    t0 = time.monotonic()
    a = exporter.wait_for_availability(1, timeout=0.3, interval=600.0, backend="nvml")
    waited = time.monotonic() - t0
    assert not a.ok and "after waiting" in a.reason and "gpu 3 is 90% busy" in a.reason
    assert 0.3 <= waited < 30, "it must check again at the deadline, not sleep a whole interval past it"
    # fewer GPUs than asked for: waiting cannot help, it answers at once
    t0 = time.monotonic()
    a = exporter.wait_for_availability(9, timeout=600.0, interval=600.0, backend="nvml")
    assert not a.ok and "this machine has 4" in a.reason and time.monotonic() - t0 < 30


# ---- estimate_requirements ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("task", "gpus", "mib"), [
    ({"model": {"id_or_path": "llama-3-70b"}, "parameters": {"tp-size": [1, 2, 4], "pp-size": [1]}}, 4, 20_000),
    ({"model": "Qwen/Qwen2.5-7B-Instruct", "parameters": {"tp-size": 2, "dp-size": [1, 3], "cp-size": 2}}, 6,
     12_000),
    ({"parameters": {"tp_size": 2, "pp": 2, "dcp-size": {"type": "choice", "values": [1, 4]}}}, 16, 8_000),
    ({"model": {"id_or_path": "llama-3-2-1b-instruct"}, "parameters": {"mem-fraction-static": [0.8]}}, 1, 8_000),
    ({"model": "meta-llama/Llama-3.1-405B"}, 1, 20_000),
])
def test_estimate_requirements(task: dict[str, Any], gpus: int, mib: int) -> None:
    r = exporter.estimate_requirements(task)
    assert r.gpus == gpus and r.memory_per_gpu_bytes == mib * 2**20
    assert r.gpus == r.parallelism["tp"] * r.parallelism["pp"] * max(
        r.parallelism["dp"], r.parallelism["cp"], r.parallelism["dcp"])


# ---- Monitor and Recording ------------------------------------------------------------------------------------


def test_monitor_aggregates_like_record(fleet: FakeNvml) -> None:
    energy0, util0 = fleet.gpus[0]["energy_mj"], fleet.gpus[0]["util_gpu"]
    m = exporter.Monitor(interval=3600, backend="nvml")  # samples at start() and stop() only
    assert m.start() is m
    fleet.set(0, energy_mj=energy0 + 5_000_000, util_gpu=93)  # the run uses 5 kJ on GPU 0
    rec = m.stop()
    assert m.stop() is rec is m.recording
    assert rec.sample_count == 2 and rec.lost == [] and rec.command == () and rec.exit_code is None
    g0 = rec.gpus[0]
    assert g0.utilization_ratio.samples == pytest.approx((util0 / 100, 0.93))
    assert g0.utilization_ratio.max == pytest.approx(0.93) and g0.utilization_ratio.min == pytest.approx(util0 / 100)
    assert g0.energy_joules == pytest.approx(5000.0)
    raw1 = fleet.gpus[1]
    assert rec.gpus[1].memory_used_bytes.mean == raw1["mem_used"]
    assert rec.gpus[1].power_watts.mean == pytest.approx(raw1["power_mw"] / 1000)
    doc = rec.to_dict()
    jsonschema.validate(doc, RECORD)
    assert doc["command"] == [] and doc["exit_code"] is None and doc["sample_count"] == 2
    assert doc["gpu_stats"]["0"]["utilization"]["samples"] == [util0, 93.0]
    assert doc["gpu_stats"]["0"]["energy_joules"] == 5000.0
    assert doc["gpu_stats"]["1"]["memory_used_mb"]["max"] == pytest.approx(raw1["mem_used"] / 2**20)
    with pytest.raises(RuntimeError, match="already started"):
        m.start()


def test_a_gpu_lost_during_a_recording_is_reported_lost_not_averaged_as_zeros(fleet: FakeNvml) -> None:
    util1 = fleet.gpus[1]["util_gpu"]
    with exporter.Monitor(interval=3600, backend="nvml") as m:
        fleet.lose(1)
    rec = m.recording
    assert rec is not None and rec.lost == [1]
    g1 = rec.gpus[1]
    assert g1.lost and g1.lost_at_seconds is not None and g1.lost_at_seconds > 0
    assert g1.lost_reason is not None and "lost" in g1.lost_reason.lower()
    assert g1.utilization_ratio.samples == (pytest.approx(util1 / 100), None)
    assert g1.utilization_ratio.mean == pytest.approx(util1 / 100)  # not (x + 0) / 2
    doc = rec.to_dict()
    jsonschema.validate(doc, RECORD)
    assert doc["gpu_stats"]["1"]["lost"] is True and doc["gpu_stats"]["0"]["lost"] is False
    assert doc["gpu_stats"]["1"]["utilization"]["samples"][-1] is None


def test_monitors_and_queries_at_once_share_one_backend_initialisation(
        fleet: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    inits: list[float] = []
    real_init = pynvml.nvmlInit

    def counting_init(*args: Any) -> None:  # a spy: the real call, counted
        inits.append(time.monotonic())
        real_init(*args)

    monkeypatch.setattr(pynvml, "nvmlInit", counting_init)
    results: list[list[exporter.GpuStatus]] = []
    errors: list[BaseException] = []

    def query() -> None:
        try:
            results.append(exporter.query_gpus(backend="nvml"))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    with exporter.Monitor(interval=0.05, backend="nvml") as a, \
            exporter.Monitor(interval=0.05, gpus=[1, 2], backend="nvml") as b:
        threads = [threading.Thread(target=query) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert len(results) == 8 and all([g.index for g in r] == [0, 1, 2, 3] for r in results)
    assert len(inits) == 1, f"{len(inits)} NVML initialisations for concurrent users of one backend"
    assert a.recording is not None and b.recording is not None
    assert sorted(a.recording.gpus) == [0, 1, 2, 3] and sorted(b.recording.gpus) == [1, 2]
    assert a.recording.sample_count >= 2 and b.recording.sample_count >= 2
    # after the last user, the backend is shut down; the next call initialises it again
    exporter.query_gpus(backend="nvml")
    assert len(inits) == 2


def test_monitor_of_a_gpu_that_does_not_exist(fleet: FakeNvml) -> None:
    with pytest.raises(ValueError, match=r"^gpus: no GPU 7 on this machine \(indices: 0, 1, 2, 3\)$"):
        exporter.Monitor(gpus=[0, 7], backend="nvml").start()
    # the fixture checks that the backend was released


# ---- bad arguments ----------------------------------------------------------------------------------------------

BAD: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("negative count", lambda: exporter.select_gpus(-1), ValueError, "count"),
    ("zero count", lambda: exporter.check_availability(0), ValueError, "count"),
    ("bool count", lambda: exporter.select_gpus(True), TypeError, "count"),
    ("float count", lambda: exporter.wait_for_availability(1.5), TypeError, "count"),  # type: ignore[arg-type]
    ("nan interval", lambda: exporter.Monitor(interval=math.nan), ValueError, "interval"),
    ("huge interval", lambda: exporter.Monitor(interval=1e300), ValueError, "interval"),
    ("zero interval", lambda: exporter.wait_for_availability(1, interval=0), ValueError, "interval"),
    ("nan timeout", lambda: exporter.wait_for_availability(1, timeout=math.nan), ValueError, "timeout"),
    ("inf timeout", lambda: exporter.wait_for_availability(1, timeout=math.inf), ValueError, "timeout"),
    ("negative memory", lambda: exporter.check_availability(1, min_free_bytes=-1), ValueError, "min_free_bytes"),
    ("nan memory", lambda: exporter.select_gpus(1, min_free_bytes=math.nan), ValueError, "min_free_bytes"),
    ("string memory", lambda: exporter.select_gpus(1, min_free_bytes="8GiB"), TypeError,  # type: ignore[arg-type]
     "min_free_bytes"),
    ("ratio above 1", lambda: exporter.select_gpus(1, max_utilization=50), ValueError, "max_utilization"),
    ("unknown backend", lambda: exporter.query_gpus(backend="cuda"), ValueError, "backend"),
    ("empty backend", lambda: exporter.Monitor(backend=""), ValueError, "backend"),
    ("backend not a string", lambda: exporter.query_gpus(backend=None), TypeError,  # type: ignore[arg-type]
     "backend"),
    ("gpus not indices", lambda: exporter.Monitor(gpus=["0"]), TypeError, "gpus"),  # type: ignore[list-item]
    ("negative gpu", lambda: exporter.Monitor(gpus=[-1]), ValueError, "gpus"),
    ("task not a mapping", lambda: exporter.estimate_requirements([]), TypeError,  # type: ignore[arg-type]
     "task_config"),
    ("zero tp", lambda: exporter.estimate_requirements({"parameters": {"tp-size": [1, 0]}}), ValueError, "tp-size"),
    ("tp twice", lambda: exporter.estimate_requirements({"tp": 2, "x": {"tp_size": 4}}), ValueError, "twice"),
    ("deep config", lambda: exporter.estimate_requirements(_deep(5000)), ValueError, "nested"),
]


def _deep(n: int) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for _ in range(n):
        d = {"x": d}
    return d


@pytest.mark.parametrize(("why", "call", "kind", "names"), BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_raise_one_line(why: str, call: Callable[[], object], kind: type[Exception],
                                      names: str) -> None:
    with pytest.raises(kind) as err:
        call()
    assert type(err.value) is kind
    assert names in str(err.value) and "\n" not in str(err.value)


# ---- every backend, the docs, the types ------------------------------------------------------------------------------

SCRIPT = """
import json, sys
import exporter
backend = sys.argv[1]
found = exporter.query_gpus(backend=backend)
best = exporter.select_gpus(1, min_free_bytes=None, max_utilization=1.0, backend=backend)
with exporter.Monitor(interval=0.05, backend=backend) as m:
    exporter.check_availability(1, backend=backend)
print(json.dumps({"gpus": [g.__dict__ for g in found], "best": best, "record": m.recording.to_dict()}))
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend(backend: str, tmp_path: Path) -> None:
    """Every backend of the registry, on its contract fleet (tests/fakes/fleets/) where it has one."""
    fleet = fleet_env(backend, tmp_path)
    env = {**os.environ, **(fleet or {})}
    p = subprocess.run([sys.executable, "-c", SCRIPT, backend], env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    out = json.loads(p.stdout)
    want = 2 if fleet is not None else len(out["gpus"])  # a fleet has two GPUs; a backend without one, its own
    assert want >= 1 and [g["index"] for g in out["gpus"]] == list(range(want))
    declared = backends.registry()[backend].families  # what it reads is what it declares
    for g in out["gpus"]:
        assert g["up"] and g["uuid"] and 0 <= g["score"] <= 1
        assert (g["memory_total_bytes"] is not None and g["memory_total_bytes"] > 0) == (
            "gpu_memory_total_bytes" in declared)
        assert (g["utilization_ratio"] is not None) == ("gpu_utilization_ratio" in declared)
    assert out["best"][0] == max(out["gpus"], key=lambda g: (g["score"], -g["index"]))["index"]
    jsonschema.validate(out["record"], RECORD)
    assert sorted(out["record"]["gpu_stats"]) == [str(i) for i in range(want)]
    assert out["record"]["sample_count"] >= 2


def test_every_documented_example_runs(tmp_path: Path) -> None:
    """docs/python-api.md: each ```python block runs as written (backend auto finds the fake driver)."""
    text = (REPO / "docs" / "python-api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    for name in PUBLIC - {"GpuStatus", "Availability", "Requirements", "Recording"}:
        assert any(name in b for b in blocks), f"docs/python-api.md has no example of {name}"
    runner = ("import sys, json\n"
              "for i, code in enumerate(json.load(sys.stdin)):\n"
              "    print(f'--- block {i}', flush=True)\n"
              "    exec(compile(code, f'<docs/python-api.md block {i}>', 'exec'), {'__name__': '__main__'})\n")
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=4)
    p = subprocess.run([sys.executable, "-c", runner], input=json.dumps(blocks), env={**os.environ, **fleet.env()},
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert p.stdout.count("--- block") == len(blocks) >= 8
    assert "CUDA_VISIBLE_DEVICES" not in p.stdout and "not now" not in p.stdout  # idle fleet: GPUs are chosen


USER_SCRIPT = """
import exporter

gpus: list[exporter.GpuStatus] = exporter.query_gpus(backend="simulated")
free: int | None = gpus[0].memory_free_bytes
ratio: float | None = gpus[0].utilization_ratio
chosen: list[int] = exporter.select_gpus(1, min_free_bytes=2**30)
try:
    exporter.select_gpus(8)
except exporter.InsufficientGpus as exc:
    why: str = str(exc)
with exporter.Monitor(interval=0.5, gpus=[0]) as m:
    pass
rec: exporter.Recording | None = m.recording
assert rec is not None
mean: float | None = rec.gpus[0].power_watts.mean
lost: list[int] = rec.lost
doc: dict[str, object] = rec.to_dict()
req: exporter.Requirements = exporter.estimate_requirements({"parameters": {"tp-size": [1, 2]}})
avail: exporter.Availability = exporter.wait_for_availability(req.gpus, req.memory_per_gpu_bytes, timeout=1.0)
ok: bool = avail.ok and exporter.check_availability(1).ok
"""

USER_MISTAKES = """
import exporter

x: str = exporter.query_gpus()[0].score
exporter.select_gpus("2")
exporter.no_such_function()
"""


def test_the_api_passes_mypy_strict_in_user_code(tmp_path: Path) -> None:
    """Install the package (a copy of the tree, so no build files land in the repo) and type-check
    user scripts against it, as a user's mypy would see it: py.typed must ship, names must be typed."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "exporter", src / "exporter", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(site), str(src)], check=True, capture_output=True, timeout=300)
    assert (site / "exporter" / "py.typed").exists()
    (tmp_path / "user.py").write_text(USER_SCRIPT)
    (tmp_path / "mistakes.py").write_text(USER_MISTAKES)
    env = {**os.environ, "PYTHONPATH": str(site)}
    mypy = [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--no-error-summary"]
    good = subprocess.run([*mypy, "user.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = subprocess.run([*mypy, "mistakes.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1
    assert 'mistakes.py:4: error: Incompatible types in assignment (expression has type "float"' in bad.stdout
    assert "mistakes.py:5: error: Argument 1 to \"select_gpus\" has incompatible type \"str\"" in bad.stdout
    assert 'mistakes.py:6: error: Module has no attribute "no_such_function"' in bad.stdout


def test_documented_outputs_are_what_the_examples_print() -> None:
    """Issue 38, item 14: an example's "# ..." comment after print() shows what it prints (the
    estimate_requirements example said 16 GPUs for 8). Each such comment's values, up to "...", must
    match; the examples that read GPUs are checked by test_every_documented_example_runs."""
    text = (REPO / "docs" / "python-api.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "estimate_requirements(" in b)
    setup, line = block.split("print(need.")[0], next(ln for ln in block.splitlines() if ln.startswith("print(need."))
    call, comment = line.split("  # ", 1)
    scope: dict[str, Any] = {}
    exec(compile(setup, "<docs/python-api.md>", "exec"), scope)
    args = call.removeprefix("print(").removesuffix(")").split(", ")
    got = [str(eval(a, scope)) for a in args]
    want = comment.split()
    for g, w in zip(got, want, strict=False):
        if w.startswith("{..."):
            break
        assert g == w, (line, got)
    assert "\n- **Errors:**" in text and text.count("- **Errors:**") == 1, "one Errors bullet"


def test_query_gpus_gives_each_gpu_its_health_state_and_cause(fleet: FakeNvml) -> None:
    """Issue 35: the Python API shows gpu_health_state's state and cause (the row's view fields)."""
    fleet.set(2, remap_failure=1)  # a failed row remap: fatal (as XID 64)
    fleet.set(3, ecc_uncorrected_volatile=2)  # an uncorrectable ECC error since the driver loaded: fatal (XID 48)
    fleet.lose(1)
    found = {g.index: g for g in exporter.query_gpus(backend="nvml")}
    assert (found[0].health, found[0].health_cause) == ("ok", "")
    assert found[1].health == "lost" and "GPU is lost" in found[1].health_cause
    assert (found[2].health, found[2].health_cause) == ("failed", "page_retirement_failed (fatal)")
    assert (found[3].health, found[3].health_cause) == ("failed", "ecc_uncorrected (fatal)")
