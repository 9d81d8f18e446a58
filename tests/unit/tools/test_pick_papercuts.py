"""Issue 28, findings 8 and 15: ``pick`` footguns and the Python API's small inconsistencies."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import exporter
from exporter import python_api as gpus
from exporter.platform.units import parse_size
from exporter.python_api.selection import DEFAULT_MIN_FREE_BYTES
from exporter.tools import pick
from tests.harness.cli import gx
from tests.harness.exporter import REPO


def run_pick(*args: str) -> subprocess.CompletedProcess[str]:
    return gx("pick", *args, "--backend", "simulated")


def _error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if "SIMULATED" not in ln]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize(("value", "words"), [("8", ("'8'", "no unit", "8GiB")), ("512", ("no unit",)),
                                              ("-1GiB", ("negative",)), ("-5", ("negative",))])
def test_min_free_needs_a_unit_and_no_sign(value: str, words: tuple[str, ...]) -> None:
    proc = run_pick("-n", "1", "--min-free", value)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = _error_line(proc)
    assert line.startswith("gpu-exporter pick: error: --min-free"), line
    assert "expected one argument" not in line
    for word in words:
        assert word in line, line


@pytest.mark.parametrize("value", ["0", "4096B", "1GiB", "10GB"])
def test_min_free_with_a_unit_or_zero(value: str) -> None:
    proc = run_pick("-n", "1", "--min-free", value)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"[0-9]+\n", proc.stdout)


def test_sub_second_poll_is_reported_as_such() -> None:
    proc = run_pick("-n", "2", "--min-free", "1000GiB", "--wait", "0.6", "--poll", "0.5")
    assert proc.returncode == 1
    assert "checking again in 0.5 s" in proc.stderr, proc.stderr
    assert "in 0 s" not in proc.stderr


def test_readme_pick_line_fails_loudly(tmp_path: Path) -> None:
    """The README's way of setting CUDA_VISIBLE_DEVICES from pick: when pick fails, the script
    stops with a non-zero status instead of going on with every GPU hidden."""
    readme = (REPO / "README.md").read_text()
    block = next(b for b in re.findall(r"```sh\n(.*?)```", readme, re.S) if "gpu-exporter pick" in b)
    assert "export CUDA_VISIBLE_DEVICES=$(" not in block
    lines = [ln for ln in block.splitlines() if "pick" in ln or "CUDA_VISIBLE_DEVICES" in ln]
    # 6 simulated GPUs: 0 and 5 idle (simulated.PATTERNS), so two qualify at any moment; with 4, the
    # second depended on the clock (the periodic GPU's low phase, the bursty one's noise) and pick waited
    shim = (f'gpu-exporter() {{ PYTHONPATH={REPO} {sys.executable} -m exporter "$@" --backend simulated '
            '--simulated-gpus 6; }\n')
    for count, ok in (("2", True), ("64", False)):
        script = tmp_path / f"use-{count}.sh"
        body = "\n".join(ln.replace("-n 2", f"-n {count}") for ln in lines)
        script.write_text(shim + body + '\necho "REACHED CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"\n')
        proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120, check=False)
        if ok:
            assert proc.returncode == 0, proc.stderr
            assert re.search(r"REACHED CUDA_VISIBLE_DEVICES=[0-9],[0-9]$", proc.stdout.strip()), proc.stdout
        else:
            assert proc.returncode != 0 and "REACHED" not in proc.stdout, proc.stdout + proc.stderr


def test_select_gpus_floor_is_picks() -> None:
    default = parse_size(pick.parser().get_default("min_free"))
    assert default == DEFAULT_MIN_FREE_BYTES == 8 * 2**30
    for fn in (exporter.select_gpus, exporter.check_availability, exporter.wait_for_availability):
        assert inspect.signature(fn).parameters["min_free_bytes"].default == default, fn.__name__


def test_gpu_unavailable_is_public() -> None:
    assert "GpuUnavailable" in exporter.__all__
    from exporter import GpuUnavailable

    assert GpuUnavailable is gpus.GpuUnavailable
    with pytest.raises(exporter.GpuUnavailable):
        exporter.select_gpus(1, backend="rocm-smi,nvml")  # neither library nor CLI on this machine
