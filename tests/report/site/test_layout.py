"""The committed leaderboards in headless Chromium at a 1,400 px window and a 420 px phone:
no page is wider than its window, the main table's score and cost columns are in reach, its
header row and label column stay in view while it scrolls (and the filter bar never covers
the header), best marks follow the filters and the search box, the column chooser and
compact mode work, and each scheme page shows its runs' values and links their records."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

import pandas as pd
import pytest

from tests.helpers import ROOT
from tests.report.site.browser import no_errors, open_page, window

SITES = {name: ROOT / "docs" / "site" / name for name in ("zoo", "tasks_quick", "scale")}
ZOO = SITES["zoo"] / "index.html"
MAIN = 'table[data-board="main"]'

pytestmark = pytest.mark.slow


def js(browser, script: str, *args):
    return browser.execute_script(script, *args)


def rect(browser, element) -> dict[str, float]:
    return js(browser, "return arguments[0].getBoundingClientRect().toJSON()", element)


def on_top(browser, element) -> bool:
    """Whether a reader sees ``element`` at its centre (nothing drawn over it)."""
    return js(
        browser,
        "var r = arguments[0].getBoundingClientRect();"
        "var at = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);"
        "return at !== null && arguments[0].contains(at);",
        element,
    )


def shown_labels(browser, selector: str) -> list[str]:
    rows = browser.find_elements("css selector", f"{selector} tbody tr")
    return [r.get_attribute("data-label") for r in rows if r.is_displayed()]


def best_labels(browser, column: str) -> list[str]:
    """The labels of the rows whose cell of ``column`` (a data-col or data-len) is bold, and
    of any hidden row carrying a mark (there should be none)."""
    return js(
        browser,
        "return Array.from(document.querySelectorAll(arguments[0])).map(function (td) {"
        "  var tr = td.parentNode; return (tr.hidden ? 'hidden:' : '') + tr.dataset.label; });",
        f'{MAIN} td.best[data-col="{column}"], {MAIN} td.best[data-len="{column}"]',
    )


@pytest.mark.parametrize("width", [1400, 420])
def test_no_page_is_wider_than_its_window(browser, width):
    window(browser, width)
    for site in SITES.values():
        for path in [site / "index.html", *sorted((site / "schemes").glob("*.html"))]:
            open_page(browser, path)
            wide = js(
                browser,
                "return [window.innerWidth, document.documentElement.scrollWidth,"
                " document.body.scrollWidth]",
            )
            assert max(wide) <= width, (path, wide)  # a phone widens its viewport to fit
            no_errors(browser)


def test_the_score_and_cost_columns_are_in_reach_at_1400(browser):
    window(browser, 1400)
    open_page(browser, ZOO)
    table = browser.find_element("css selector", MAIN)
    box = table.find_element("xpath", "..")
    heads = table.find_elements("css selector", "thead th")
    assert [h.text for h in heads[:2]] == ["scheme", "score"]  # the headline beside the label
    assert rect(browser, heads[1])["right"] <= 1400 and on_top(browser, heads[1])
    # the table is wider than the window: it scrolls sideways in its own box, not the page
    assert js(browser, "return arguments[0].scrollWidth > arguments[0].clientWidth", box)
    js(browser, "arguments[0].scrollLeft = arguments[0].scrollWidth", box)
    cost = next(h for h in heads if h.text == "train tok/s")
    assert rect(browser, cost)["left"] >= 0 and rect(browser, cost)["right"] <= 1400
    assert js(browser, "return document.documentElement.scrollWidth") <= 1400
    # compact mode (the means only) fits the whole table in the window
    browser.find_element("css selector", 'input[data-view="compact"]').click()
    assert js(browser, "return arguments[0].scrollWidth <= arguments[0].clientWidth", box)
    cell = table.find_element("css selector", "tbody td .ci")
    assert not cell.is_displayed()
    no_errors(browser)


@pytest.mark.parametrize("width", [1400, 420])
def test_the_header_row_and_label_column_stay_in_view(browser, width):
    from selenium.webdriver.support.wait import WebDriverWait

    window(browser, width)
    open_page(browser, ZOO)
    table = browser.find_element("css selector", MAIN)
    js(
        browser,
        "window.scrollTo(0, arguments[0].getBoundingClientRect().top + scrollY + 400)",
        table,
    )
    bar = browser.find_element("css selector", "form.filters")
    below = max(0.0, rect(browser, bar)["bottom"])  # sticky at 1400; on a phone it scrolls away
    heads = table.find_elements("css selector", "thead th")
    WebDriverWait(browser, 5).until(lambda b: abs(rect(b, heads[1])["top"] - below) < 1)
    edge = rect(browser, table.find_element("xpath", ".."))["right"]
    for head in heads[:3]:
        assert abs(rect(browser, head)["top"] - below) < 1, head.text
        r = rect(browser, head)
        if r["left"] + r["width"] / 2 < edge:  # on a phone a column may lie past the box's edge
            assert on_top(browser, head), head.text
    # sideways, the label column stays at the box's left edge, drawn over the numbers
    box = table.find_element("xpath", "..")
    js(browser, "arguments[0].scrollLeft = 300", box)
    row = next(
        r
        for r in table.find_elements("css selector", "tbody tr")
        if rect(browser, r)["top"] > rect(browser, heads[0])["bottom"] + 2
    )
    label = row.find_element("css selector", "td")
    assert abs(rect(browser, label)["left"] - rect(browser, box)["left"]) < 1
    assert on_top(browser, label)
    no_errors(browser)


def test_best_marks_follow_the_filters_and_the_search(browser):
    from selenium.webdriver.support.select import Select

    window(browser, 1400)
    open_page(browser, ZOO)
    scores = pd.read_csv(ROOT / "results" / "zoo" / "tables" / "score.csv").set_index("label")
    ppl = pd.read_csv(ROOT / "results" / "zoo" / "tables" / "ppl.csv")
    at = ppl[ppl["eval_len"] == 1024].set_index("label")["mean"]
    overall = scores["score"].idxmin()
    assert best_labels(browser, "score") == [overall]

    def check() -> None:
        shown = shown_labels(browser, MAIN)
        assert overall not in shown
        assert best_labels(browser, "score") == [scores.loc[shown, "score"].idxmin()]
        assert best_labels(browser, "1024") == [at[shown].idxmin()]

    rows = browser.find_elements("css selector", f"{MAIN} tbody tr")
    family = {r.get_attribute("data-label"): r.get_attribute("data-family") for r in rows}
    other = next(f for f in sorted(set(family.values())) if f != family[overall])
    Select(browser.find_element("css selector", 'select[data-filter="family"]')).select_by_value(
        other
    )
    check()
    Select(browser.find_element("css selector", 'select[data-filter="family"]')).select_by_value("")
    search = browser.find_element("css selector", 'input[data-filter="q"]')
    search.send_keys("rope")
    check()
    no_errors(browser)


def test_searching_shows_the_matching_rows_and_curves(browser):
    window(browser, 1400)
    open_page(browser, ZOO)
    rows = browser.find_elements("css selector", f"{MAIN} tbody tr")
    family = {r.get_attribute("data-label"): r.get_attribute("data-family") for r in rows}
    browser.find_element("css selector", 'input[data-filter="q"]').send_keys("ALiBi")
    found = [lab for lab in family if "alibi" in f"{lab} {family[lab]}".lower()]
    assert shown_labels(browser, MAIN) == found and len(found) < len(family)
    legend = browser.find_elements("css selector", "#curves ul.legend li")
    assert {li.get_attribute("data-label") for li in legend if li.is_displayed()} == set(found)
    assert set(shown_labels(browser, 'table[data-board="schemes"]')) <= set(found)
    browser.find_element("css selector", 'input[data-filter="q"]').clear()
    js(browser, "document.querySelector('input[data-filter=q]').dispatchEvent(new Event('input'))")
    assert shown_labels(browser, MAIN) == list(family)
    no_errors(browser)


def test_the_column_chooser_hides_a_column_and_the_csv_links_resolve(browser):
    window(browser, 1400)
    open_page(browser, ZOO)
    browser.find_element("css selector", "details.columns summary").click()
    choices = browser.find_elements("css selector", "details.columns input[data-col]")
    names = [c.get_attribute("data-col") for c in choices]
    assert {"score", "family", "kind", "paper"} <= set(names)
    choices[names.index("family")].click()
    family = browser.find_element("css selector", f'{MAIN} th[data-col="family"]')
    assert not family.is_displayed()
    assert not browser.find_element("css selector", f'{MAIN} td[data-col="family"]').is_displayed()
    paper = browser.find_element(
        "css selector", f'{MAIN} tr[data-label="alibi"] td[data-col="paper"]'
    )
    assert paper.text == "Press et al. 2022"
    links = browser.find_elements("css selector", 'p.data a[href$=".csv"]')
    assert "ppl.csv" in [a.text for a in links]
    for a in links:
        assert Path(unquote(urlparse(a.get_attribute("href")).path)).is_file(), a.text
    no_errors(browser)


def test_a_scheme_page_shows_each_runs_values_and_links_its_records(browser):
    window(browser, 1400)
    open_page(browser, SITES["zoo"] / "schemes" / "alibi.html")
    table = browser.find_element("css selector", 'table[data-board="seeds-main-alibi"]')
    rows = table.find_elements("css selector", "tbody tr")
    n = pd.read_csv(ROOT / "results" / "zoo" / "tables" / "ppl.csv").query("label == 'alibi'")
    assert table.is_displayed() and len(rows) == n["n"].max()
    for row in rows:
        href = row.find_element("css selector", "a").get_attribute("href")
        assert href.endswith("/records.jsonl") and Path(unquote(urlparse(href).path)).is_file()
    no_errors(browser)
