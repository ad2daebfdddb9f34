"""The fleet dashboard in real headless Chromium, against ``edgekit fleet serve`` fed by a real Mosquitto
and the fleet simulator: the table lists the devices, a chart has drawn, a device whose process is
SIGKILLed shows offline within its keep-alive, and an offline alert appears; a device whose process
is frozen (SIGSTOP: its socket stays open, like a hung device or a pulled cable) goes offline when the
broker's keep-alive check expires. Screenshots (desktop and
phone width) are saved under the test's tmp_path, and copied to $EDGEKIT_SCREENSHOTS when it is set.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from chromium import open_chromium, require_chromium

from edgekit.testing.mosquitto import Mosquitto, free_port
from edgekit.testing.process import stop_process

ROOT = Path(__file__).resolve().parents[1]
SIM = [sys.executable, "-m", "edgekit.cli", "fleet", "simulate"]
FLEET = "demo"
KEEPALIVE_S = 2
# The broker declares a client gone after 1.5 x its keep-alive; then the Will travels to the collector
# and the page hears of it on the next SSE tick. The slack covers that path on a busy machine.
OFFLINE_BOUND_S = 1.5 * KEEPALIVE_S + 5.0
# A hung device closes nothing: only the broker's keep-alive check notices. Mosquitto 2.0 runs that
# check every 5-6 s (keepalive__check: `last_keepalive_check + 5 < now`, 1 s resolution), so its Will
# leaves between 1.5 x keep-alive and that plus 6 s after the last packet.
FROZEN_BOUND_S = 1.5 * KEEPALIVE_S + 6.0 + 4.0

require_chromium()
pytest.importorskip("fastapi", reason="the fleet extra is not installed (pip install -e '.[fleet]')")
from selenium.common.exceptions import WebDriverException  # noqa: E402  (after the skips above)


def _edgekit_exe() -> str:
    beside = Path(sys.executable).parent / "edgekit"
    found = str(beside) if beside.exists() else shutil.which("edgekit")
    if found is None:
        pytest.fail("the edgekit command is not installed (pip install -e '.[fleet]')")
    return found


def _wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except (OSError, WebDriverException) as err:  # a server still starting, a page mid-render
            last_error, value = err, None
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last error: {last_error})")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    stop_process(proc, grace_s=10)


class Processes:
    """The subprocesses of one test, each logging to a file, all stopped at the end."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}

    def start(
        self, name: str, argv: list[str], env_extra: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = self.logdir / f"{name}.log"
        env = dict(os.environ, TMPDIR=str(self.logdir), EDGEKIT_LOG="WARNING", PYTHONUNBUFFERED="1")
        env.update(env_extra or {})
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def log_of(self, proc: subprocess.Popen[bytes]) -> str:
        return self.logs[proc.pid].read_text(errors="replace")[-4000:]

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            _stop(proc)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    driver = open_chromium(tmp_path, console=True)
    try:
        yield driver
    finally:
        driver.quit()


def _serve(processes: Processes, mqtt_url: str, db: Path, token: str | None = None) -> str:
    port = free_port()
    server = processes.start(
        "fleet-serve",
        [
            _edgekit_exe(),
            "fleet",
            "serve",
            "--mqtt",
            mqtt_url,
            "--db",
            str(db),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        {"EDGEKIT_FLEET_TOKEN": token} if token else None,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if server.poll() is not None:
            pytest.fail(f"edgekit fleet serve exited with {server.returncode}:\n{processes.log_of(server)}")
        with urllib.request.urlopen(url + "/healthz", timeout=2) as resp:
            return resp.status == 200

    _wait_for("edgekit fleet serve to answer /healthz", healthy, timeout=60)
    return url


def _sim(
    processes: Processes, name: str, mqtt_url: str, devices: int, prefix: str
) -> subprocess.Popen[bytes]:
    return processes.start(
        name,
        [
            *SIM,
            "--mqtt",
            mqtt_url,
            "--fleet",
            FLEET,
            "--devices",
            str(devices),
            "--prefix",
            prefix,
            "--keepalive",
            str(KEEPALIVE_S),
        ],
    )


def _states(driver: Any) -> dict[str, str]:
    """{"fleet/device": "online"|"offline"} as the device table shows it."""
    return driver.execute_script(
        "const out = {};"
        "document.querySelectorAll('#devices tbody tr[data-device]').forEach(tr => {"
        "  const cell = tr.querySelector('td[data-state]');"
        "  out[tr.dataset.device] = cell ? cell.dataset.state : null; });"
        "return out;"
    )


# Pixels of the latency chart's canvas in the p50 series' colour: axes and grid alone never count.
_SERIES_PIXELS_JS = """
const canvas = document.querySelector(arguments[0] + ' canvas');
if (!canvas || !canvas.width) return 0;
const hex = getComputedStyle(document.documentElement).getPropertyValue('--accent').trim().replace('#', '');
const want = [0, 2, 4].map(i => parseInt(hex.slice(i, i + 2), 16));
const px = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
let n = 0;
for (let i = 0; i < px.length; i += 4) {
  if (px[i + 3] > 200 && Math.abs(px[i] - want[0]) + Math.abs(px[i + 1] - want[1])
      + Math.abs(px[i + 2] - want[2]) < 60) n++;
}
return n;
"""


def _js_errors(driver: Any) -> list[str]:
    entries = driver.get_log("browser")
    return [e["message"] for e in entries if e.get("level") == "SEVERE" and e.get("source") == "javascript"]


def _save(driver: Any, shots: Path, name: str) -> None:
    """The viewport as ``name``.png, and the whole page as ``name``-full.png."""
    path = shots / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"chromium did not write {path}"
    width, height = driver.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
    )
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
        },
    )
    (shots / f"{name}-full.png").write_bytes(base64.b64decode(shot["data"]))


def test_dashboard_lists_devices_draws_charts_and_shows_a_killed_device_offline(
    tmp_path: Path, processes: Processes, browser: Any
) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    broker = Mosquitto(tmp_path).start()
    try:
        url = _serve(processes, broker.url, tmp_path / "fleet.db")
        steady = _sim(processes, "sim-cams", broker.url, devices=4, prefix="cam")
        doomed = _sim(processes, "sim-kill", broker.url, devices=1, prefix="kill")
        hung = _sim(processes, "sim-frozen", broker.url, devices=1, prefix="frozen")
        expected = {f"{FLEET}/cam-0{i}" for i in range(1, 5)} | {f"{FLEET}/kill-01", f"{FLEET}/frozen-01"}
        killed, frozen = f"{FLEET}/kill-01", f"{FLEET}/frozen-01"

        browser.set_window_size(1280, 900)
        browser.get(url + "/")

        def all_online() -> bool:
            for proc in (steady, doomed, hung):
                if proc.poll() is not None:
                    pytest.fail(f"the simulator exited with {proc.returncode}:\n{processes.log_of(proc)}")
            states = _states(browser)
            return set(states) == expected and all(s == "online" for s in states.values())

        _wait_for(f"the device table to list {sorted(expected)} online", all_online, timeout=60)
        _wait_for(
            "the first chart to draw",
            lambda: browser.execute_script("return document.body.dataset.chartsDrawn") == "1",
            timeout=30,
        )
        # A fresh server has one step (a dot); wait for a line across steps.
        _wait_for(
            "the fleet latency chart to draw its p50 line",
            lambda: browser.execute_script(_SERIES_PIXELS_JS, "#chart-latency") > 40,
            timeout=60,
        )
        assert browser.find_element("id", "conn").get_attribute("data-conn") == "live", "SSE is not live"
        kpi_online = browser.find_element("id", "kpi-online").text
        assert kpi_online == "6", f"header says {kpi_online} devices online"
        # The collector's refusals are in the header (none: the simulated devices stay within their quotas).
        assert browser.find_element("id", "kpi-refused").text == "0"
        _save(browser, shots, "desktop-online")

        doomed.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        doomed.wait(5)

        def killed_offline() -> bool:
            return _states(browser).get(killed) == "offline"

        _wait_for(f"{killed} to show offline", killed_offline, timeout=OFFLINE_BOUND_S + 30, interval=0.1)
        took = time.monotonic() - killed_at
        print(f"\n{killed} showed offline {took:.1f} s after SIGKILL (bound {OFFLINE_BOUND_S:.1f} s)")
        assert took <= OFFLINE_BOUND_S, (
            f"{killed} showed offline {took:.1f} s after SIGKILL; its keep-alive is {KEEPALIVE_S} s "
            f"(bound {OFFLINE_BOUND_S:.1f} s)"
        )
        states = _states(browser)
        assert all(states[d] == "online" for d in expected - {killed}), states

        # A hung device: the process stops but its TCP connection stays open, so only the broker's
        # keep-alive check (1.5 x keep-alive without a packet) can notice, and then it sends the Will.
        hung.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            _wait_for(
                f"{frozen} to show offline",
                lambda: _states(browser).get(frozen) == "offline",
                timeout=FROZEN_BOUND_S + 30,
                interval=0.1,
            )
            took_frozen = time.monotonic() - frozen_at
        finally:
            hung.send_signal(signal.SIGKILL)
            hung.send_signal(signal.SIGCONT)
        print(f"{frozen} showed offline {took_frozen:.1f} s after SIGSTOP (bound {FROZEN_BOUND_S:.1f} s)")
        assert took_frozen <= FROZEN_BOUND_S, f"{frozen} took {took_frozen:.1f} s to show offline"
        # Not the socket closing: the keep-alive expiring (its last packet was at most a window before).
        assert took_frozen >= KEEPALIVE_S * 1.5 - 1.5, f"{frozen} went offline too soon: {took_frozen:.1f} s"

        alert = _wait_for(
            f"an offline alert for {killed}",
            lambda: browser.execute_script(
                "return [...document.querySelectorAll('#alerts li[data-kind=\"offline\"]')]"
                ".filter(li => li.dataset.device === arguments[0]).map(li => li.textContent)[0];",
                killed,
            ),
            timeout=15,
        )
        assert "offline since" in alert, alert
        _save(browser, shots, "desktop-offline")

        # The device page of the killed device: its facts, its chart, a way back.
        browser.find_element("css selector", f'tr[data-device="{killed}"]').click()
        _wait_for(
            "the device page to show the killed device offline",
            lambda: browser.find_element("id", "dev-badge").get_attribute("data-state") == "offline",
            timeout=15,
        )
        assert browser.find_element("id", "dev-title").text == killed
        assert browser.find_element("id", "dev-birth").text, "the device page shows no birth facts"
        _wait_for(
            "the device latency chart to draw",
            lambda: browser.execute_script(_SERIES_PIXELS_JS, "#dev-chart-latency"),
            timeout=15,
        )
        _save(browser, shots, "desktop-device")
        browser.find_element("css selector", "a.back").click()
        _wait_for(
            "the fleet view again",
            lambda: browser.find_element("id", "fleet-view").is_displayed(),
            timeout=10,
        )

        # Another window: the page reconnects its SSE stream for it.
        browser.find_element("css selector", '.windows button[data-window="900"]').click()
        _wait_for(
            "a snapshot for the 15-minute window",
            lambda: browser.execute_script("return document.body.dataset.window") == "900",
            timeout=15,
        )
        assert _states(browser).get(killed) == "offline"

        # Phone width: nothing wider than the screen; the table scrolls inside its own box.
        browser.set_window_size(375, 812)
        inner = _wait_for(
            "the phone-width layout",
            lambda: browser.execute_script("return innerWidth <= 400 ? innerWidth : 0"),
            timeout=10,
        )

        def fits() -> bool:
            return browser.execute_script("return document.documentElement.scrollWidth") <= inner

        _wait_for("the page to fit 375 px without horizontal overflow", fits, timeout=10)
        _wait_for(
            "the latency chart to be resized to the phone's width",
            lambda: browser.execute_script(
                "const c = document.querySelector('#chart-latency .uplot');"
                "return c && c.getBoundingClientRect().width <= innerWidth;"
            ),
            timeout=10,
        )
        _save(browser, shots, "phone-offline")

        errors = _js_errors(browser)
        assert not errors, f"JavaScript errors on the page: {errors}"
    finally:
        broker.stop()
        print(f"\nfleet dashboard screenshots: {shots}")
        target = os.environ.get("EDGEKIT_SCREENSHOTS")
        if target:
            Path(target).mkdir(parents=True, exist_ok=True)
            for shot in shots.glob("*.png"):
                shutil.copy(shot, Path(target) / shot.name)
            print(f"copied to {target}")


def test_with_a_token_the_page_works_once_opened_with_it(
    tmp_path: Path, processes: Processes, browser: Any
) -> None:
    """``/?token=`` once: the cookie it sets carries the page's modules, its JSON and its SSE stream."""
    token = "browser-token-0123456789abcdef"
    broker = Mosquitto(tmp_path).start()
    try:
        url = _serve(processes, broker.url, tmp_path / "fleet.db", token=token)
        _sim(processes, "sim-cams", broker.url, devices=2, prefix="cam")
        browser.get(url + "/")
        assert "needs its token" in browser.find_element("tag name", "body").text
        browser.get(f"{url}/?token={token}")
        assert browser.current_url == url + "/"  # the token left the address bar
        expected = {f"{FLEET}/cam-01", f"{FLEET}/cam-02"}
        _wait_for(
            "the device table to list the devices online",
            lambda: set(_states(browser)) == expected and set(_states(browser).values()) == {"online"},
            timeout=60,
        )
        _wait_for(
            "the live stream",
            lambda: browser.find_element("id", "conn").get_attribute("data-conn") == "live",
            timeout=30,
        )
        assert not _js_errors(browser)
        cookies = {c["name"]: c for c in browser.get_cookies()}
        assert cookies["edgekit_fleet"]["httpOnly"] and token not in cookies["edgekit_fleet"]["value"]
    finally:
        broker.stop()
