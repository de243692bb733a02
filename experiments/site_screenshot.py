"""The README's picture of the leaderboard site: docs/site/zoo/index.html in headless Chromium
(Debian's ``chromium`` and ``chromium-driver``, through selenium), sorted by 16x in compact
mode (the means only, so every column fits), its top 1400 x 980 pixels saved as a 256-colour
PNG.

    python experiments/site_screenshot.py            # writes docs/leaderboard.png
"""

from __future__ import annotations

import argparse
import io
import shutil
from pathlib import Path

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

ROOT = Path(__file__).parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--site", default=ROOT / "docs" / "site" / "zoo" / "index.html")
    parser.add_argument("--out", default=ROOT / "docs" / "leaderboard.png")
    args = parser.parse_args()
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--window-size=1400,980", "--hide-scrollbars"):
        options.add_argument(arg)
    options.add_argument("--force-device-scale-factor=1")
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(Path(args.site).resolve().as_uri())
        driver.find_element("css selector", 'input[data-view="compact"]').click()
        heads = driver.find_elements("css selector", 'table[data-board="main"] thead th')
        next(h for h in heads if "(16x)" in h.text).click()
        driver.execute_script(
            "document.querySelectorAll('div.scroll').forEach(d => d.scrollLeft = 0)"
        )
        driver.execute_script("window.scrollTo(0, 0)")
        png = driver.get_screenshot_as_png()
    finally:
        driver.quit()
    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(256, dither=Image.Dither.NONE)
    image.save(args.out, optimize=True)
    print(f"{args.out}: {Path(args.out).stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
