"""Headless Chromium for the browser tests: Debian's ``chromium`` and ``chromium-driver``,
driven through selenium (no browser download); the ``browser`` fixture is in conftest.py."""

from __future__ import annotations

import shutil
from pathlib import Path

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
DRIVER = shutil.which("chromedriver")


def missing() -> str:
    """Why the browser tests cannot run here ('' when they can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if CHROMIUM is None:
        return "Chromium is not installed (Debian: apt-get install chromium chromium-driver)"
    if DRIVER is None:
        return "chromedriver is not installed (Debian: apt-get install chromium-driver)"
    return ""


def start():
    """A headless Chromium with a 1,400 px window that keeps the page's console log."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.add_argument("--disable-dev-shm-usage")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(DRIVER), options=options)


def window(browser, width: int, height: int = 900) -> None:
    """Lay pages out ``width`` CSS pixels wide; under 600 as a phone does (the page's viewport
    meta applies, and a page wider than the screen widens the layout viewport, which is how a
    phone shows overflow). A desktop window cannot be made this narrow."""
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
    )


def open_page(browser, path: Path):
    from selenium.webdriver.support.wait import WebDriverWait

    browser.get(path.as_uri())
    ready = WebDriverWait(browser, 10)
    ready.until(lambda b: b.execute_script("return document.readyState") == "complete")
    return browser


def no_errors(browser) -> None:
    """Nothing the page logged is an error (a script that failed, a file that did not load)."""
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe
