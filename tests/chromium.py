"""Headless Chromium for the preview's tests: Debian's chromium and chromedriver through selenium.

``require_chromium()`` skips the calling module when they (or selenium) are missing;
``open_chromium(tmp)`` starts a browser with a fresh profile under ``tmp``, at a fixed
window size and a device pixel ratio of 1, so a screenshot's pixels are the page's CSS pixels;
``console=True`` keeps the page's console messages for ``driver.get_log("browser")``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def require_chromium() -> None:
    pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip(
            "Debian's chromium and chromedriver are needed (apt-get install chromium chromium-driver)",
            allow_module_level=True,
        )


def open_chromium(tmp: Path, size: tuple[int, int] = (1100, 800), *, console: bool = False) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp)
    for arg in (
        "--headless=new",
        "--no-sandbox",  # chromium refuses to run as root with its sandbox
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={size[0]},{size[1]}",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    if console:  # a test that fails on the page's JavaScript errors reads them from this log
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: selenium-manager never goes looking on the internet.
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)  # a page that never loads fails the test instead of hanging it
    return driver


def screenshot_bgr(driver: Any) -> np.ndarray:
    """The viewport as a BGR image (CSS pixels, the scale factor being 1)."""
    png = np.frombuffer(driver.get_screenshot_as_png(), np.uint8)
    image: np.ndarray = cv2.imdecode(png, cv2.IMREAD_COLOR)
    return image


def image_rect(driver: Any, element_id: str) -> dict[str, float]:
    """``left, top, width, height`` of an ``<img>`` in the viewport, and its ``naturalWidth``/``Height``."""
    rect: dict[str, float] = driver.execute_script(
        "const img = document.getElementById(arguments[0]); const r = img.getBoundingClientRect();"
        "return {left: r.left, top: r.top, width: r.width, height: r.height,"
        " naturalWidth: img.naturalWidth, naturalHeight: img.naturalHeight};",
        element_id,
    )
    return rect


def drawn_box(
    image: np.ndarray, colour: tuple[int, int, int], min_edge: int
) -> tuple[int, int, int, int] | None:
    """Where a box outline of ``colour`` (BGR) is in ``image``: ``(left, top, right, bottom)``, or None.

    Its edges are the outermost columns and rows with at least ``min_edge`` pixels of that colour
    (the label's text, in the same colour on black, is too sparse to count).  JPEG and scaling
    blur colours, hence the tolerance of the match.
    """
    diff = np.abs(image.astype(np.int16) - np.array(colour, np.int16)).max(axis=2)
    mask = diff < 90
    cols = np.flatnonzero(mask.sum(axis=0) >= min_edge)
    rows = np.flatnonzero(mask.sum(axis=1) >= min_edge)
    if cols.size < 2 or rows.size < 2:
        return None
    return int(cols[0]), int(rows[0]), int(cols[-1]), int(rows[-1])
