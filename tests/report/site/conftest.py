from __future__ import annotations

import pytest

from tests.report.site.browser import missing, start


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module (skipped, with the reason, where it is missing)."""
    if missing():
        pytest.skip(missing())
    driver = start()
    yield driver
    driver.quit()
