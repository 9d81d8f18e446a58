"""``LiveWebConfig`` on its own (the mutation module ``webconfig-reload``): when a reload happens, in which
thread, what it logs (once), what it keeps when the new file cannot be used, and ``SIGHUP``.

Basic-auth configs with cost-4 hashes and no TLS, so each test takes milliseconds: the reload's rules
about TLS are ``_weakens``'s, tested in test_webconfig_reload.py, and real TLS reloads in
test_http_survivors.py.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from exporter.platform import webconfig
from tests.harness.poll import wait_until
from tests.unit.platform.test_webconfig_reload import write

LOGGER = "exporter.platform.webconfig"


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "web.yml"
    write(path, "alice")
    return path


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == LOGGER]


def _loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = webconfig.load

    def counting(path: str) -> webconfig.WebConfig:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(webconfig, "load", counting)
    return calls


def _watched(cfg: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
             level: int) -> tuple[webconfig.WebConfig, webconfig.LiveWebConfig, list[str]]:
    """The config loaded from ``cfg``, a LiveWebConfig of it, the loads it makes from now, logs at ``level``."""
    first = webconfig.load(str(cfg))
    live = webconfig.LiveWebConfig(first)
    calls = _loads(monkeypatch)
    caplog.set_level(level, LOGGER)
    return first, live, calls


def test_nothing_changed_nothing_loaded(cfg: Path, monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    first, live, calls = _watched(cfg, monkeypatch, caplog, logging.DEBUG)
    assert live.current() is first and live.current(block=False) is first
    assert live.reload() is True  # the files as recorded: nothing to do
    assert calls == [] and _lines(caplog) == []


def test_a_change_is_loaded_by_the_next_check_and_said_once(cfg: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    live = webconfig.LiveWebConfig(webconfig.load(str(cfg)))
    calls = _loads(monkeypatch)
    caplog.set_level(logging.INFO, LOGGER)
    write(cfg, "bob")
    assert set(live.current().users) == {"bob"}
    assert set(live.current().users) == {"bob"} and calls == [str(cfg)]
    assert _lines(caplog) == [("INFO", f"web config {cfg} reloaded (changed on disk)")]


def test_the_io_thread_never_loads_itself(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``block=False`` answers with the config in force at once and loads in a background thread; none
    is started while a reload holds the lock."""
    first = webconfig.load(str(cfg))
    live = webconfig.LiveWebConfig(first)
    release = threading.Event()
    started = threading.Event()
    real = webconfig.load
    threads: list[str] = []

    def slow(path: str) -> webconfig.WebConfig:
        threads.append(threading.current_thread().name)
        started.set()
        release.wait(5)
        return real(path)

    monkeypatch.setattr(webconfig, "load", slow)
    write(cfg, "bob")
    assert live.current(block=False) is first  # at once, while the load waits
    assert started.wait(5) and threads == ["web-config-reload"]
    assert next(t for t in threading.enumerate() if t.name == "web-config-reload").daemon
    for _ in range(5):  # the lock is held by that reload: no second thread
        assert live.current(block=False) is first
    assert threads == ["web-config-reload"]
    release.set()
    wait_until(lambda: set(live.current(block=False).users) == {"bob"}, 5, what="the background reload")
    assert threads == ["web-config-reload"]


def test_a_file_that_does_not_load_keeps_the_old_config_and_is_said_once(
        cfg: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = webconfig.load(str(cfg))
    live = webconfig.LiveWebConfig(first)
    caplog.set_level(logging.INFO, LOGGER)
    cfg.write_text("basic_auth_users: [\n")
    for _ in range(3):
        assert live.current() is first
    assert _lines(caplog) == [("ERROR", f"web config {cfg} (changed on disk) cannot be used, keeping the previous "
                                        f"one: web config {cfg} line 2: not valid YAML")]  # the culprit named
    assert live.reload("SIGHUP") is False  # asked for: said again, with why
    assert _lines(caplog)[-1][1].startswith(f"web config {cfg} (SIGHUP) cannot be used, keeping the previous one: ")
    assert len(_lines(caplog)) == 2
    write(cfg, "bob")  # fixed: loaded
    assert set(live.current().users) == {"bob"}


def test_a_weaker_file_keeps_the_old_config_and_is_said_once(cfg: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = webconfig.load(str(cfg))
    live = webconfig.LiveWebConfig(first)
    caplog.set_level(logging.INFO, LOGGER)
    cfg.write_text("")  # a half-written file: no users, which would be no auth
    for _ in range(3):
        assert live.current() is first
    assert _lines(caplog) == [("ERROR", f"web config {cfg} (changed on disk) drops basic_auth_users: keeping the "
                                        "previous one (a half-written file looks the same; to change this on "
                                        "purpose, restart)")]
    assert live.reload("SIGHUP") is False
    assert _lines(caplog)[-1][1].startswith(f"web config {cfg} (SIGHUP) drops basic_auth_users: ")
    write(cfg, "carol")
    assert set(live.current().users) == {"carol"}


def test_sighup_loads_even_when_nothing_changed(cfg: Path, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    first, live, calls = _watched(cfg, monkeypatch, caplog, logging.INFO)
    assert live.reload("SIGHUP") is True
    assert calls == [str(cfg)] and live.current() is not first and set(live.current().users) == {"alice"}
    assert _lines(caplog) == [("INFO", f"web config {cfg} reloaded (SIGHUP)")]
    assert live.current() is live.current() and calls == [str(cfg)]  # and records what it loaded


def test_a_reload_records_the_stamp_it_loaded_from(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a failed or refused load the stamp is the failing file's (no load on every check); after a
    good one, the stamp taken before the load (a change during it is loaded by the next check)."""
    live = webconfig.LiveWebConfig(webconfig.load(str(cfg)))
    calls = _loads(monkeypatch)
    cfg.write_text("basic_auth_users: [\n")
    for _ in range(3):
        live.current()
    assert len(calls) == 1
    cfg.write_text("")
    for _ in range(3):
        live.current()
    assert len(calls) == 2
    write(cfg, "bob")
    for _ in range(3):
        live.current()
    assert len(calls) == 3 and set(live.current().users) == {"bob"}
