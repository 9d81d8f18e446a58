"""The exporter's footprint: OpenSSL (``ssl``, ``hashlib``: libssl and libcrypto, about 6 MiB of RSS) is
loaded only when a web config asks for TLS or basic auth, so a plain ``serve`` stays near the README's
figure (docs/benchmarks.md: RSS at 1 and 8 GPUs)."""

from __future__ import annotations

from pathlib import Path

from tests.harness.exporter import ExporterProcess

OPENSSL = ("libssl.so", "libcrypto.so", "_ssl.cpython", "_hashlib.cpython")


def _loaded(pid: int) -> set[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {name for name in OPENSSL if name in maps}


def test_plain_serving_never_loads_openssl() -> None:
    with ExporterProcess(["--backend", "simulated", "--allow-simulated"]) as ex:
        for path in ("/metrics", "/stats", "/healthz", "/", "/nope"):
            ex.get(path)
        assert ex.scrape_text().count("gpu_up{") >= 1
        assert _loaded(ex.proc.pid) == set()


def test_basic_auth_loads_it_when_configured(tmp_path: Path) -> None:
    # bcrypt of "pw" (cost 4): the auth cache's key is a sha256, so hashlib (OpenSSL) is loaded here
    import bcrypt

    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  u: {hashed}\n")
    with ExporterProcess(["--backend", "simulated", "--allow-simulated", "--web.config.file", str(web)]) as ex:
        assert ex.get("/metrics")[0] == 401
        import base64

        status, _, _ = ex.get("/metrics", {"Authorization": "Basic " + base64.b64encode(b"u:pw").decode()})
        assert status == 200
        assert "_hashlib.cpython" in _loaded(ex.proc.pid)


def test_process_readings_match_prometheus_clients() -> None:
    from prometheus_client import ProcessCollector

    from exporter.core.host import process_readings

    ours = process_readings()
    theirs = {s.name: s.value for m in ProcessCollector(registry=None).collect() for s in m.samples}
    assert list(ours) == list(theirs)  # same families, same order
    for name in ("process_start_time_seconds", "process_max_fds", "process_virtual_memory_bytes"):
        assert ours[name] == theirs[name], name
    assert abs(ours["process_resident_memory_bytes"] - theirs["process_resident_memory_bytes"]) < 8 << 20
    # theirs is read later, so it is not less; both divide clock ticks, in another order (utime/t + stime/t
    # against (utime + stime)/t), so an equal reading may differ in the last bit: 25.869999999999997 and 25.87
    assert -1e-9 <= theirs["process_cpu_seconds_total"] - ours["process_cpu_seconds_total"] < 5


def test_process_readings_from_odd_proc_files(tmp_path: Path) -> None:
    from exporter.core.host import process_readings

    pid = tmp_path / "42"
    (pid / "fd").mkdir(parents=True)
    for n in range(3):
        (pid / "fd" / str(n)).touch()
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1700000000\n")
    # a command name holding ") " must not shift the fields
    fields = ["S"] + ["0"] * 10 + ["250", "50"] + ["0"] * 6 + ["1000", "4096000", "10"]
    (pid / "stat").write_text("42 (evil) name) " + " ".join(fields) + "\n")
    (pid / "limits").write_text("Limit  Soft Limit  Hard Limit  Units\nMax open files  unlimited  unlimited  files\n")
    got = process_readings(proc=str(tmp_path), pid="42")
    assert got["process_cpu_seconds_total"] == 300 / _ticks()
    assert got["process_virtual_memory_bytes"] == 4096000
    assert got["process_start_time_seconds"] == 1700000000 + 1000 / _ticks()
    assert got["process_open_fds"] == 3
    assert "process_max_fds" not in got  # unlimited: nothing to publish, never a sentinel
    assert process_readings(proc=str(tmp_path / "none")) == {}


def _ticks() -> float:
    import os

    return float(os.sysconf("SC_CLK_TCK"))
