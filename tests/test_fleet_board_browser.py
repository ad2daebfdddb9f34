"""The large-fleet board (``/board``) in real headless Chromium, served by ``edgekit fleet serve
--no-collect`` over a backfilled PostgreSQL: the list is the server's worst-first page, the search box
and a group's square filter it, paging moves through it, offline devices are one alert, and at phone
width each device's p50, p99 and missed share show without sideways scrolling."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chromium import open_chromium, require_chromium
from postgres import PostgresServer

from edgekit.testing.fleet_backfill import Plan, backfill
from edgekit.testing.mosquitto import free_port
from edgekit.testing.process import stop_process

ROOT = Path(__file__).resolve().parents[1]

require_chromium()
pytest.importorskip("fastapi", reason="the fleet extra is not installed (pip install -e '.[fleet]')")


def api(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def board(pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = pg_server.new_database()
    backfill(db, Plan(devices=300, days=1, minute_hours=1, raw_minutes=5, sites=40, offline_share=0.05))
    port = free_port()
    log = tmp_path_factory.mktemp("board") / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgekit.cli", "fleet", "serve", "--no-collect", "--db", db, "--port", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("w"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                api(url + "/healthz")
                break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail(log.read_text())
        yield url
    finally:
        stop_process(proc, grace_s=10, sig=signal.SIGINT)


def ready(driver: Any, url: str) -> None:
    driver.get(url)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = driver.execute_script("return [document.body.dataset.ready, document.body.dataset.error]")
        assert not state[1], state[1]
        if state[0]:
            return
        time.sleep(0.05)
    pytest.fail("the board did not draw")


def rows(driver: Any) -> list[str]:
    return list(
        driver.execute_script(
            "return [...document.querySelectorAll('#devices tbody tr')].map(r => r.dataset.device)"
        )
    )


def wait_rows(driver: Any, check: Any) -> list[str]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = rows(driver)
        if check(got):
            return got
        time.sleep(0.05)
    pytest.fail(f"the list never showed what was expected: {rows(driver)}")


def test_the_board_lists_filters_pages_and_groups_from_the_server(board: str, tmp_path: Path) -> None:
    driver = open_chromium(tmp_path, (1200, 900))
    try:
        ready(driver, board + "/board")
        worst = api(board + "/api/v2/devices?limit=50")
        assert rows(driver) == [r["device"] for r in worst["devices"]]
        offline = api(board + "/api/v2/devices?state=offline&limit=1")["total"]
        assert offline > 1
        alert = driver.execute_script(
            "return document.querySelector('#alerts details[data-kind=offline] summary').textContent"
        )
        assert alert == f"{offline} devices offline"  # one alert for them all

        driver.find_element("id", "next").click()
        second = api(board + "/api/v2/devices?limit=50&offset=50")
        wait_rows(driver, lambda got: got == [r["device"] for r in second["devices"]])

        site = worst["devices"][0]["site"]
        driver.find_element("id", "q").send_keys(site)
        found = api(board + "/api/v2/devices?limit=50&q=" + site)
        wait_rows(driver, lambda got: got == [r["device"] for r in found["devices"]])

        driver.find_element("id", "q").clear()
        driver.execute_script("document.getElementById('q').dispatchEvent(new Event('input'))")
        square = driver.find_element("css selector", "#heat button")  # the worst site
        key = square.get_attribute("data-key")
        square.click()
        members = api(board + "/api/v2/devices?limit=50&site=" + key)
        wait_rows(driver, lambda got: got == [r["device"] for r in members["devices"]])
        assert len(driver.find_elements("css selector", "#heat button")) == len(
            api(board + "/api/v2/groups")["groups"]
        )
    finally:
        driver.quit()


def test_at_phone_width_each_device_shows_p50_p99_and_missed_without_scrolling_sideways(
    board: str, tmp_path: Path
) -> None:
    driver = open_chromium(tmp_path, (390, 844))
    try:
        ready(driver, board + "/board")
        assert driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        shown = driver.execute_script(
            "const r = document.querySelector('#devices tbody tr');"
            "return [...r.querySelectorAll('td')].filter(td => td.offsetWidth > 0).map(td => td.dataset.label || 'name')"
        )
        assert shown == ["name", "p50", "p99", "missed"]
        driver.save_screenshot(str(tmp_path / "board-phone.png"))
    finally:
        driver.quit()
