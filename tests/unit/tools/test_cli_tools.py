"""`gpu-exporter snapshot | diff | record | pick` as real subprocesses, on the fake NVML fleet and the
simulated backend."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from exporter.python_api import estimate_requirements
from exporter.serve.api_schema import RECORD, STATS
from tests.fakes.fakenvml import FakeNvml
from tests.harness.cli import gx, popen
from tests.harness.exporter import REPO
from tests.harness.poll import wait_until

MIB = 2**20
GIB = 2**30


pytestmark = pytest.mark.fleet(gpus=4)  # the `fleet` fixture (tests/conftest.py)


def nvml(fleet: FakeNvml, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return gx(*args, "--backend", "nvml", env=fleet.env(), timeout=timeout)


def snapshot(fleet: FakeNvml, path: Path) -> dict[str, Any]:
    p = nvml(fleet, "snapshot", "--json", "--window", "0", "-o", str(path))
    assert p.returncode == 0, p.stderr
    doc: dict[str, Any] = json.loads(path.read_text())
    jsonschema.validate(doc, STATS)
    return doc


# ---- snapshot -----------------------------------------------------------------------------------


def test_snapshot_is_the_stats_view_of_the_fleet(fleet: FakeNvml, tmp_path: Path) -> None:
    fleet.set_topology(0, 1, 10)
    doc = snapshot(fleet, tmp_path / "s.json")
    assert doc["host"]["driver_version"] == fleet.globals["driver_version"]
    cuda = int(fleet.globals["cuda_version"])
    assert doc["host"]["cuda_version"] == f"{cuda // 1000}.{cuda % 1000 // 10}"
    assert [g["index"] for g in doc["gpus"]] == list(range(4))
    for g, raw in zip(doc["gpus"], fleet.gpus, strict=True):
        assert (g["uuid"], g["name"]) == (raw["uuid"], raw["name"])
        assert g["pci_bus_id"] == raw["bus_id"].lower().replace("00000000:", "0000:")
        assert g["memory_total_bytes"] == raw["mem_total"]
        assert g["memory_used_bytes"] == raw["mem_used"]
        assert g["utilization_ratio"] == pytest.approx(raw["util_gpu"] / 100)
        assert g["power_watts"] == pytest.approx(raw["power_mw"] / 1000)
        assert g["energy_joules"] == pytest.approx(raw["energy_mj"] / 1000)
        assert g["power_average_watts"] is None  # one reading (--window 0): no interval to average over
        assert g["pcie"] == {"generation": raw["pcie_gen"], "generation_max": raw["pcie_max_gen"],
                             "width": raw["pcie_width"], "width_max": raw["pcie_max_width"]}
    pairs = {(p["gpu"], p["peer"]): p for p in doc["p2p"]}
    assert len(pairs) == 4 * 3
    assert pairs[(0, 1)]["topology_level"] == pairs[(1, 0)]["topology_level"] == "single"
    assert pairs[(0, 3)]["topology_level"] == "system" and pairs[(2, 3)]["topology_level"] == "node"
    assert pairs[(0, 3)]["p2p"]["read"] is True

    table = nvml(fleet, "snapshot", "--window", "0")
    assert table.returncode == 0, table.stderr
    for g in doc["gpus"]:
        assert g["pci_bus_id"] in table.stdout
    assert "GPU0" in table.stdout and fleet.globals["driver_version"] in table.stdout


def test_snapshot_average_power_comes_from_the_energy_counter(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    p = gx("snapshot", "--backend", "simulated", "--simulated-gpus", "3", "--window", "1", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert "SIMULATED" in p.stderr
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, STATS)
    for g in doc["gpus"]:
        # the simulated energy counter integrates the reported power: the two must agree. The
        # counter's interval runs from collection to collection, the average's divisor from
        # snapshot to snapshot: on a loaded machine those differ by a few ms of the 1 s window.
        assert g["power_average_seconds"] >= 1.0
        assert g["power_average_watts"] == pytest.approx(g["power_watts"], rel=0.02)


def test_snapshot_unsupported_energy_gives_null_average(fleet: FakeNvml, tmp_path: Path) -> None:
    fleet.unsupported(2, "nvmlDeviceGetTotalEnergyConsumption")
    out = tmp_path / "s.json"
    p = nvml(fleet, "snapshot", "--window", "0.1", "-o", str(out))
    assert p.returncode == 0, p.stderr
    gpus = json.loads(out.read_text())["gpus"]
    assert gpus[2]["energy_joules"] is None and gpus[2]["power_average_watts"] is None
    assert gpus[1]["power_average_watts"] == 0.0  # the fake's counter stands still


def test_auto_without_a_gpu_fails_clearly(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    # probed in a fresh process: this one may hold the fake driver (tests/unit/tools/test_api.py)
    probe = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libnvidia-ml.so.1')"],
                           env={**os.environ, "LD_LIBRARY_PATH": str(empty)}, capture_output=True, timeout=60)
    if probe.returncode == 0:
        pytest.skip("a real NVIDIA driver is installed here")
    p = gx("snapshot", env={"LD_LIBRARY_PATH": str(empty), "ROCM_PATH": str(empty), "ROCM_HOME": str(empty),
                            "PATH": "/usr/bin:/bin"})
    assert p.returncode == 1
    assert "no GPU found" in p.stderr and "--backend simulated" in p.stderr and "nvml" in p.stderr
    assert p.stdout == ""
    bad = gx("snapshot", "--backend", "cuda")
    assert bad.returncode == 2 and "backend" in bad.stderr and "cuda" in bad.stderr


# ---- diff ---------------------------------------------------------------------------------------


def test_diff_catches_a_changed_pcie_link_and_a_foreign_load(fleet: FakeNvml, tmp_path: Path) -> None:
    before = tmp_path / "before.json"
    snapshot(fleet, before)
    same = tmp_path / "same.json"
    fleet.set(3, mem_used=fleet.gpus[3]["mem_used"] + 100 * MIB)  # within the default 256 MiB
    snapshot(fleet, same)
    p = gx("diff", str(before), str(same))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("unchanged")

    fleet.set(1, pcie_gen=3)
    fleet.set(2, mem_used=fleet.gpus[2]["mem_used"] + 10 * GIB, power_mw=fleet.gpus[2]["power_mw"] + 150_000)
    after = tmp_path / "after.json"
    snapshot(fleet, after)
    p = gx("diff", str(before), str(after))
    assert p.returncode == 1
    lines = p.stdout.splitlines()
    assert "gpu 1: pcie.generation changed: 5 -> 3 (must not change)" in lines
    assert any(ln.startswith("gpu 2: memory in use rose by 10.0 GiB") for ln in lines), lines
    assert any(ln.startswith("gpu 2: power rose by 150.0 W") for ln in lines), lines
    assert not any(ln.startswith(("gpu 0", "gpu 3")) for ln in lines), lines
    assert lines[-1].startswith("CHANGED: 3 differences")

    # thresholds and ignores are flags
    p = gx("diff", str(before), str(after), "--ignore", "pcie.generation", "--max-memory-rise", "11GiB",
           "--max-power-rise", "200")
    assert p.returncode == 0, p.stdout


def test_diff_catches_topology_driver_and_missing_gpu(fleet: FakeNvml, tmp_path: Path) -> None:
    before = tmp_path / "before.json"
    snapshot(fleet, before)
    fleet.set_topology(0, 2, 30)
    fleet.set_global(driver_version="550.90.07")
    fleet.set_count(3)
    after = tmp_path / "after.json"
    snapshot(fleet, after)
    p = gx("diff", str(before), str(after))
    assert p.returncode == 1
    assert "host: driver_version changed: 550.54.15 -> 550.90.07" in p.stdout
    assert "p2p gpu 0 <-> 2: topology_level changed: system -> hostbridge" in p.stdout
    assert p.stdout.count("p2p gpu 0 <-> 2: topology_level") == 1  # both directions, reported once
    assert "gpu 3: missing after the run" in p.stdout


def test_diff_rejects_bad_input(tmp_path: Path) -> None:
    junk = tmp_path / "junk.json"
    junk.write_text("{\"not\": \"a snapshot\"}")
    p = gx("diff", str(junk), str(junk))
    assert p.returncode == 2 and "junk.json" in p.stderr and "not a gpu-exporter snapshot" in p.stderr
    p = gx("diff", str(tmp_path / "missing.json"), str(junk))
    assert p.returncode == 2 and "missing.json" in p.stderr
    p = gx("diff", str(junk), str(junk), "--max-memory-rise", "lots")
    assert p.returncode == 2 and "--max-memory-rise" in p.stderr


# ---- record -------------------------------------------------------------------------------------

CHILD = """
import pathlib, signal, sys, time
marker = pathlib.Path(sys.argv[1])
def on_int(signum, frame):
    marker.write_text(marker.read_text() + "SIGINT\\n")
    sys.exit(42)
signal.signal(signal.SIGINT, on_int)
marker.write_text("ready\\n")
go = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else None
while go is None or not go.exists():
    time.sleep(0.02)
"""


def child(tmp_path: Path) -> tuple[list[str], Path, Path]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    marker, go = tmp_path / "marker", tmp_path / "go"
    return [sys.executable, str(script), str(marker), str(go)], marker, go


def test_record_aggregates_follow_the_fleet_and_exit_status(fleet: FakeNvml, tmp_path: Path) -> None:
    cmd, marker, _ = child(tmp_path)
    out = tmp_path / "run.json"
    proc = popen("record", "--backend", "nvml", "--interval", "0.1", "-o", str(out), "--",
                 *cmd[:3], env=fleet.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: marker.exists() and "ready" in marker.read_text(), 20, what="child started")
    # the recorder samples once before it starts the command, so this change comes after a sample
    energy0, util0 = fleet.gpus[0]["energy_mj"], fleet.gpus[0]["util_gpu"]
    fleet.set(0, energy_mj=energy0 + 5_000_000, util_gpu=93)  # the run uses 5 kJ on GPU 0
    proc.send_signal(signal.SIGINT)  # the child exits 42 once it gets the forwarded SIGINT
    assert proc.wait(20) == 42, proc.stderr.read() if proc.stderr else ""
    assert marker.read_text().count("SIGINT") == 1
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, RECORD)
    assert doc["exit_code"] == 42 and doc["command"] == cmd[:3]
    assert doc["sample_count"] >= 2 and len(doc["timestamps"]) == doc["sample_count"]
    assert sorted(doc["gpu_stats"]) == ["0", "1", "2", "3"]
    g0 = doc["gpu_stats"]["0"]
    assert g0["energy_joules"] == pytest.approx(5000.0)
    assert g0["utilization"]["samples"][-1] == 93 and g0["utilization"]["max"] == 93
    assert g0["utilization"]["min"] == util0
    assert len(g0["utilization"]["samples"]) == doc["sample_count"]
    g1, raw1 = doc["gpu_stats"]["1"], fleet.gpus[1]
    assert g1["uuid"] == raw1["uuid"] and g1["energy_joules"] == 0.0
    assert g1["memory_used_mb"]["max"] == pytest.approx(raw1["mem_used"] / MIB)
    percent = 100 * raw1["mem_used"] / raw1["mem_total"]
    assert g1["memory_usage_percent"]["mean"] == pytest.approx(percent, abs=0.01)
    assert g1["power_draw_w"]["mean"] == pytest.approx(raw1["power_mw"] / 1000)
    assert g1["temperature_c"]["max"] == raw1["temp_gpu"]


def test_record_exit_status_of_the_command(tmp_path: Path) -> None:
    sim = ("--backend", "simulated", "--simulated-gpus", "2", "--interval", "0.1")
    p = gx("record", *sim, "--", "sh", "-c", "exit 3")
    assert p.returncode == 3, p.stderr
    assert "gpu 1: util mean" in p.stderr  # without -o: a summary on stderr
    p = gx("record", *sim, "--", "sh", "-c", "kill -TERM $$")
    assert p.returncode == 128 + signal.SIGTERM
    p = gx("record", *sim, "--", "no-such-command-here")
    assert p.returncode == 127 and "command not found: no-such-command-here" in p.stderr
    p = gx("record", *sim)
    assert p.returncode == 2 and "put it after --" in p.stderr


def test_record_terminal_ctrl_c_reaches_the_command_once_and_shows_status(tmp_path: Path) -> None:
    """Ctrl-C typed in a terminal signals the whole foreground group: the recorder must not double it."""
    cmd, marker, _ = child(tmp_path)
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child process
        try:
            os.chdir(REPO)
            os.execv(sys.executable, [sys.executable, "-m", "exporter", "record", "--backend", "simulated",
                                      "--interval", "0.1", "--", *cmd[:3]])
        finally:
            os._exit(127)
    import fcntl
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    seen = bytearray()

    def read_some() -> bool:
        while select.select([fd], [], [], 0)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                return True
            if not chunk:
                return True
            seen.extend(chunk)
        return b"record " in seen and marker.exists() and "ready" in marker.read_text()

    wait_until(read_some, 20, what="recorder status line and child ready")
    os.write(fd, b"\x03")  # the terminal's Ctrl-C
    deadline = time.monotonic() + 20
    status = None
    while status is None and time.monotonic() < deadline:
        read_some()
        done, st = os.waitpid(pid, os.WNOHANG)
        status = st if done else None
        if status is None:
            select.select([fd], [], [], 0.05)  # block on the pty, not a sleep
    os.close(fd)
    assert status is not None, "recorder did not exit after Ctrl-C"
    assert os.waitstatus_to_exitcode(status) == 42
    assert marker.read_text().count("SIGINT") == 1
    text = seen.decode(errors="replace")
    assert "power" in text and "util" in text and "\x1b[K" in text


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_record_plot_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra is not installed; the hint path is tested below")
    png = tmp_path / "run.png"
    p = gx("record", "--backend", "simulated", "--simulated-gpus", "2", "--interval", "0.1",
           "--plot", str(png), "--", "sh", "-c", "exit 0")
    assert p.returncode == 0, p.stderr
    width, height = _png_size(png)
    assert width > 300 and height > 300


def test_record_plot_without_matplotlib_gives_a_hint_before_running(tmp_path: Path) -> None:
    # An importable "matplotlib" that fails like a missing one: the outside world, at the import seam.
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'matplotlib'\", "
                                        "name='matplotlib')\n")
    ran = tmp_path / "ran"
    p = gx("record", "--backend", "simulated", "--plot", str(tmp_path / "x.png"), "--", "touch", str(ran),
           env={"PYTHONPATH": str(shadow.parent)})
    assert p.returncode == 2
    assert "--plot needs matplotlib" in p.stderr and "pip install matplotlib" in p.stderr
    assert not ran.exists(), "the command must not run when the plot cannot be drawn"


# ---- pick ---------------------------------------------------------------------------------------


def expected_order(fleet: FakeNvml) -> list[int]:
    def score(g: dict[str, Any]) -> float:
        free = g["mem_total"] - g["mem_reserved"] - g["mem_used"]
        return 0.6 * free / g["mem_total"] + 0.4 * (1 - g["util_gpu"] / 100)

    return sorted(range(len(fleet.gpus)), key=lambda i: (-score(fleet.gpus[i]), i))


def test_pick_ranks_by_free_memory_and_idleness(fleet: FakeNvml) -> None:
    fleet.set(0, util_gpu=95)
    fleet.set(2, mem_used=75 * GIB, util_gpu=0)
    fleet.set(3, util_gpu=1, mem_used=GIB // 2)
    want = expected_order(fleet)[:3]
    p = nvml(fleet, "pick", "-n", "3", "--min-free", "0", "--max-util", "1")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == ",".join(map(str, want))
    p = nvml(fleet, "pick", "-n", "1", "--format", "uuid")
    assert p.stdout.strip() == fleet.gpus[want[0]]["uuid"]
    # default limits (8GiB free, 50% busy) exclude GPU 0 (95% busy) and GPU 2 (under 8 GiB free)
    p = nvml(fleet, "pick", "-n", "3")
    assert p.returncode == 1
    assert "need 3 GPUs" in p.stderr and "found 2" in p.stderr
    assert "gpu 0 is 95% busy (max 50%)" in p.stderr
    assert "gpu 2 has" in p.stderr and "needs 8.0 GiB" in p.stderr


def test_pick_waits_until_a_gpu_frees_up(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2, util_gpu=90)
    proc = popen("pick", "-n", "1", "--backend", "nvml", "--wait", "60", "--poll", "0.1", env=fleet.env(),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr is not None and proc.stdout is not None
    lines: list[str] = []
    while not (lines and lines[-1].startswith("waiting:")) and len(lines) < 20:
        lines.append(proc.stderr.readline())  # blocks until pick has checked once and found nothing
        assert lines[-1], f"pick exited early: {lines}"
    assert lines[-1].startswith("waiting: 0 of 1 GPUs qualify"), lines
    fleet.set(1, util_gpu=3)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert out.strip() == "1"


def test_pick_gives_up_with_what_was_missing(tmp_path: Path) -> None:
    fleet = FakeNvml(tmp_path / "fleet.conf", gpus=2, util_gpu=90)
    p = nvml(fleet, "pick", "-n", "2", "--wait", "0.3", "--poll", "0.1")
    assert p.returncode == 1
    assert "need 2 GPUs" in p.stderr and "found 0 after waiting" in p.stderr
    assert "gpu 0 is 90% busy (max 50%)" in p.stderr and "gpu 1 is 90% busy" in p.stderr
    p = nvml(fleet, "pick", "-n", "3")
    assert p.returncode == 1 and "need 3 GPUs but this machine has 2" in p.stderr


def test_pick_for_a_parallelism_config(fleet: FakeNvml, tmp_path: Path) -> None:
    fleet.set_count(8)
    cfg = tmp_path / "serve.json"
    cfg.write_text(json.dumps({"model": "m", "tensor-parallel-size": 2, "pp_size": 1,
                               "parallel": {"decode-context-parallel-size": 2, "dp": 1}}))
    p = nvml(fleet, "pick", "--for", str(cfg), "--min-free", "0", "--max-util", "1")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == ",".join(map(str, expected_order(fleet)[:4]))
    assert "-> 4 GPUs" in p.stderr
    cfg.write_text(json.dumps({"tp": 4, "pipeline-parallel-size": 4}))
    p = nvml(fleet, "pick", "--for", str(cfg))
    assert p.returncode == 1 and "need 16 GPUs but this machine has 8" in p.stderr


@pytest.mark.parametrize(("config", "gpus"), [
    ({"tensor-parallel-size": 2}, 2),
    ({"tp-size": 2, "pipeline_parallel_size": 3}, 6),
    ({"tp_size": 2, "pp-size": 2, "data-parallel-size": 2, "context_parallel_size": 4}, 16),
    ({"tp": 4, "pp": 2, "dp": 2, "cp": 1, "dcp": 3}, 24),
    ({"TP": "2", "dcp_size": 2}, 4),
    ({"engine": {"tensor_parallel_size": 8}}, 8),
])
def test_parallelism_spellings(config: dict[str, Any], gpus: int) -> None:
    assert estimate_requirements(config).gpus == gpus


@pytest.mark.parametrize("config", [{"tp": 0}, {"tp": 1.5}, {"tp": True}, {"tp": 2, "x": {"tp_size": 4}},
                                    {"tp": [2, "x"]}, {"pp": []}])
def test_parallelism_config_errors_name_the_culprit(config: dict[str, Any]) -> None:
    with pytest.raises(ValueError) as err:
        estimate_requirements(config)
    assert str(err.value).startswith("task_config: ") and "\n" not in str(err.value)


def test_cli_usage_lists_the_tools() -> None:
    p = gx("--help")
    for cmd in ("snapshot", "diff", "record", "pick"):
        assert f"  {cmd} " in p.stdout
    p = gx("pick", "-n", "1", "--max-util", "150%")
    assert p.returncode == 2 and "--max-util" in p.stderr


def test_output_file_is_replaced_whole_keeping_its_mode_and_links(tmp_path: Path) -> None:
    from exporter.tools.audit import write_file

    target = tmp_path / "out.json"
    target.write_text("old and longer than the new text\n")
    target.chmod(0o640)
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    write_file(str(link), "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    assert target.stat().st_mode & 0o777 == 0o640
    fresh, reference = tmp_path / "fresh.json", tmp_path / "reference.json"
    write_file(str(fresh), "x")
    reference.write_text("x")  # what a plain open() would have created (the umask applied)
    assert fresh.stat().st_mode & 0o777 == reference.stat().st_mode & 0o777
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.json", "latest.json", "out.json", "reference.json"]


def test_output_file_errors_name_the_file(tmp_path: Path) -> None:
    from exporter.platform.errors import ConfigError
    from exporter.tools.audit import write_file

    for path, why in ((tmp_path / "missing" / "out.json", "No such file or directory"),
                      (tmp_path, "Is a directory"), (Path("/dev/full"), "No space left on device")):
        with pytest.raises(ConfigError) as err:
            write_file(str(path), "x" * 10_000)
        assert str(err.value) == f"cannot write {path}: {why}"
    assert Path("/dev/full").is_char_device()  # written through, never renamed over
    assert list(tmp_path.iterdir()) == []


def test_output_file_cut_short_leaves_nothing_behind(tmp_path: Path) -> None:
    # a file size limit fails the write half-way, as a full disk does (EFBIG instead of ENOSPC)
    target = tmp_path / "out.json"
    target.write_text("previous\n")
    code = ("import resource, signal, sys\n"
            "from exporter.platform.errors import ConfigError\n"
            "from exporter.tools.audit import write_file\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "try:\n    write_file(sys.argv[1], 'x' * 100_000)\n"
            "except ConfigError as exc:\n    sys.exit(str(exc))\n")
    p = subprocess.run([sys.executable, "-c", code, str(target)], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1 and p.stderr.strip() == f"cannot write {target}: File too large"
    assert [f.name for f in tmp_path.iterdir()] == ["out.json"] and target.read_text() == "previous\n"


def test_snapshot_shows_each_gpus_health_state(fleet: FakeNvml, tmp_path: Path) -> None:
    """Issue 35: the snapshot table has a health column and its JSON the state and cause."""
    fleet.lose(2)
    doc = snapshot(fleet, tmp_path / "s.json")
    assert [g["health"] for g in doc["gpus"]] == ["ok", "ok", "lost", "ok"]
    assert "GPU is lost" in doc["gpus"][2]["health_cause"]
    table = nvml(fleet, "snapshot", "--window", "0")
    assert table.returncode == 0, table.stderr
    header = next(line for line in table.stdout.splitlines() if "GPU" in line and "health" in line.lower())
    assert header
    assert "lost" in table.stdout and "ok" in table.stdout
