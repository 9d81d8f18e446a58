"""The exporter caps glibc's malloc arenas (RSS at 64 GPUs), unless the operator set MALLOC_ARENA_MAX."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from tests.harness.exporter import REPO


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")
def test_two_arenas_unless_the_operator_chose() -> None:
    code = ("from exporter.serve.main import limit_malloc_arenas\n"
            "print(limit_malloc_arenas({}), limit_malloc_arenas({'MALLOC_ARENA_MAX': '8'}))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.stdout.split() == ["True", "False"], res.stderr
