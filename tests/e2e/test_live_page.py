"""The live page at / in real headless Chromium (Debian package `chromium`), against the exporter on
the simulated backend: one card per GPU, numbers matching the JSON API, host identity, links."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.harness.exporter import REPO, ExporterProcess

CHROMIUM = "/usr/bin/chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")
SCREENSHOT = REPO / "docs" / "live-page.png"


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: install the Debian package 'chromium' "
                    "(apt-get install chromium)")
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=60)


class Cards(HTMLParser):
    """{card id: {data-field: text}} plus the host fields and the links of the rendered page."""

    def __init__(self) -> None:
        super().__init__()
        self.cards: dict[str, dict[str, str]] = {}
        self.host: dict[str, str] = {}
        self.links: list[str] = []
        self._card: str | None = None
        self._field: tuple[dict[str, str], str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "section" and "card" in a.get("class", "").split():
            self._card = a["data-id"]
            self.cards[self._card] = {"uuid": a.get("data-uuid", "")}
        elif "data-field" in a and self._card is not None:
            self._field = (self.cards[self._card], a["data-field"])
        elif "data-host" in a:
            self._field = (self.host, a["data-host"])
        if tag == "a" and "href" in a:
            self.links.append(a["href"])

    def handle_data(self, data: str) -> None:
        if self._field is not None:
            target, name = self._field
            target[name] = target.get(name, "") + data

    def handle_endtag(self, tag: str) -> None:
        if tag in ("span", "b"):
            self._field = None
        if tag == "section":
            self._card = None


def close_to(shown: str, value: float | None, decimals: int) -> bool:
    """The page shows ``value`` rounded to ``decimals``; "n/a" when the API has null."""
    if value is None:
        return shown == "n/a"
    return abs(float(shown) - value) <= 0.5 * 10**-decimals + 1e-9


def test_live_page_renders_one_card_per_gpu_with_the_api_numbers(tmp_path: Path) -> None:
    # A background collection every hour: the page and this test see the very same reading.
    args = ["--backend", "simulated", "--simulated-gpus", "3", "--collection-interval", "3600",
            "--metrics-path", "/prom"]
    with ExporterProcess(args, env={"NODE_NAME": "bench-node-3"}) as ex:
        # virtual time: the page's 2 s polls run without the test waiting for them in real time
        dom = chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", ex.url + "/")
        assert dom.returncode == 0, dom.stderr[-2000:]
        status, body, _ = ex.get("/api/v1/monitoring/gpu-metrics")
        assert status == 200
        api = json.loads(body)
        stats = json.loads(ex.get("/stats")[1])
        shot = tmp_path / "live.png"
        snap = chromium(tmp_path, "--virtual-time-budget=60000", "--hide-scrollbars",  # 30 polls
                        "--window-size=1280,720", f"--screenshot={shot}", ex.url + "/")
        assert snap.returncode == 0, snap.stderr[-2000:]

    page = Cards()
    page.feed(dom.stdout)
    assert sorted(page.cards) == [g["id"] for g in api["gpus"]], dom.stdout[-3000:]
    for g in api["gpus"]:
        card = page.cards[g["id"]]
        assert card["uuid"] == g["uuid"]
        assert close_to(card["utilization"], g["utilization"], 0), (card, g)
        assert close_to(card["memory-used"], g["memory"]["used"] / 1024, 1), (card, g)
        assert close_to(card["memory-total"], g["memory"]["total"] / 1024, 1), (card, g)
        assert close_to(card["power"], g["power_usage"], 0), (card, g)
        assert close_to(card["temperature"], g["temperature"], 0), (card, g)
        assert close_to(card["clock-graphics"], g["clock_speeds"]["graphics"], 0), (card, g)
    assert page.host["node_name"] == stats["host"]["node_name"] == "bench-node-3"
    assert page.host["driver_version"] == stats["host"]["driver_version"]
    assert "/prom" in page.links and "/stats" in page.links

    width, height = png_size(shot)
    assert (width, height) == (1280, 720)
    if os.environ.get("GOLDEN_UPDATE") or not SCREENSHOT.exists():
        shutil.copyfile(shot, SCREENSHOT)  # docs/live-page.png; refreshed by `make golden`


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    w, h = struct.unpack(">II", data[16:24])
    return int(w), int(h)
