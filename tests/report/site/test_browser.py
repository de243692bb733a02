"""The leaderboard site in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven through selenium; no browser download) opens the committed sites
under docs/site/ from disk, as a reader would, and what a person sees is asserted: sorting by
16x, filtering a family, hovering a curve, opening a scheme page. Skipped, with the reason,
where Chromium or its driver is not installed (``.ci/run`` installs them where apt exists)."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.helpers import ROOT
from tests.report.site.browser import no_errors, open_page

ZOO, TASKS = ROOT / "docs" / "site" / "zoo", ROOT / "docs" / "site" / "tasks_quick"
pytestmark = pytest.mark.slow


def visible_rows(browser, board: str) -> list[str]:
    rows = browser.find_elements("css selector", f'table[data-board="{board}"] tbody tr')
    return [r.get_attribute("data-label") for r in rows if r.is_displayed()]


def ppl() -> pd.DataFrame:
    return pd.read_csv(ROOT / "results" / "zoo" / "tables" / "ppl.csv")


def head(browser, board: str, text: str):
    heads = browser.find_elements("css selector", f'table[data-board="{board}"] thead th')
    (found,) = [h for h in heads if text in h.text]
    return found


def test_sorting_by_16x_puts_the_lowest_perplexity_first(browser):
    open_page(browser, ZOO / "index.html")
    at = ppl()[ppl()["eval_len"] == 1024].sort_values("mean")
    column = head(browser, "main", "(16x)")
    column.click()
    assert column.get_attribute("aria-sort") == "ascending"
    assert visible_rows(browser, "main")[:3] == at["label"].tolist()[:3]
    column.click()  # again: worst first
    assert column.get_attribute("aria-sort") == "descending"
    assert visible_rows(browser, "main")[0] == at["label"].iloc[-1]
    first = browser.find_element("css selector", 'table[data-board="main"] tbody tr')
    assert first.text.startswith(at["label"].iloc[-1])
    no_errors(browser)


def test_filtering_a_family_shows_its_rows_curves_and_best(browser):
    from selenium.webdriver.support.select import Select

    open_page(browser, ZOO / "index.html")
    Select(browser.find_element("css selector", 'select[data-filter="family"]')).select_by_value(
        "additive bias"
    )
    rows = browser.find_elements("css selector", 'table[data-board="main"] tbody tr')
    shown = [r for r in rows if r.is_displayed()]
    assert {r.get_attribute("data-family") for r in shown} == {"additive bias"}
    labels = [r.get_attribute("data-label") for r in shown]
    assert "alibi" in labels and "rope" not in labels and len(labels) < len(rows)
    panels = browser.find_elements("css selector", "#curves figure.panel")
    captions = [p.find_element("tag name", "figcaption").text for p in panels if p.is_displayed()]
    assert captions == ["additive bias"]
    # the best of the rows shown at 16x is bold, whatever is best over all rows
    at = ppl()[(ppl()["eval_len"] == 1024) & ppl()["label"].isin(labels)]
    best = at.sort_values("mean")["label"].iloc[0]
    cells = browser.find_elements(
        "css selector", 'table[data-board="main"] td.best[data-len="1024"]'
    )
    assert [c.find_element("xpath", "..").get_attribute("data-label") for c in cells] == [best]
    assert cells[0].value_of_css_property("font-weight") == "700"
    no_errors(browser)


def test_marking_what_the_seeds_do_not_separate_from_a_chosen_scheme(browser):
    from selenium.webdriver.support.select import Select

    open_page(browser, ZOO / "index.html")
    Select(browser.find_element("css selector", 'select[data-filter="ref"]')).select_by_value(
        "alibi"
    )
    pairs = pd.read_csv(ROOT / "results" / "zoo" / "tables" / "pairwise.csv")
    at = pairs[(pairs["eval_len"] == 1024) & ~pairs["separated"] & (pairs["n"] > 1)]
    near = set(at.loc[at["label_a"] == "alibi", "label_b"]) | set(
        at.loc[at["label_b"] == "alibi", "label_a"]
    )
    board = 'table[data-board="main"]'

    def marked(kind: str) -> set[str]:
        cells = browser.find_elements("css selector", f'{board} td.{kind}[data-len="1024"]')
        return {c.find_element("xpath", "..").get_attribute("data-label") for c in cells}

    assert marked("best") == {"alibi"}
    assert marked("tied") == near and near
    no_errors(browser)


def test_hovering_a_curve_shows_its_value(browser):
    from selenium.webdriver.common.action_chains import ActionChains

    open_page(browser, ZOO / "index.html")
    tip = browser.find_element("id", "tip")
    assert not tip.is_displayed()
    # sinusoidal at 16x: a point no other line's covers
    point = browser.find_element(
        "css selector", '#curves g.series[data-label="sinusoidal"] circle.pt:last-of-type'
    )
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", point)
    ActionChains(browser).move_to_element(point).perform()
    cell = ppl().set_index(["label", "eval_len"]).loc[("sinusoidal", 1024)]
    value = f"{cell['mean']:.2f} [{cell['ci_low']:.2f}, {cell['ci_high']:.2f}]"
    assert tip.is_displayed() and tip.text == f"sinusoidal · 1024 (16x): {value}"
    line = browser.find_element("css selector", '#curves g.series[data-label="sinusoidal"]')
    assert "hot" in line.get_attribute("class")
    no_errors(browser)


def test_a_scheme_page_opens_with_what_the_scheme_is_and_costs(browser):
    open_page(browser, ZOO / "index.html")
    browser.find_element(
        "css selector", 'table[data-board="main"] a[href="schemes/alibi.html"]'
    ).click()
    assert browser.current_url.endswith("/schemes/alibi.html")
    assert browser.find_element("tag name", "h1").text == "alibi"
    text = browser.find_element("tag name", "main").text
    assert "Attention with linear biases (Press et al. 2022" in text
    cost = browser.find_element("css selector", 'table[data-board="cost-alibi"]')
    assert cost.is_displayed() and "alibi" in cost.text and "train tok/s" in cost.text
    browser.find_element("link text", "Back to the leaderboard").click()
    assert browser.current_url.endswith("/zoo/index.html")
    no_errors(browser)


def test_the_task_site_filters_a_multiple_of_each_tasks_length_and_sorts_by_rank(browser):
    from selenium.webdriver.support.select import Select

    open_page(browser, TASKS / "index.html")
    Select(browser.find_element("css selector", 'select[data-filter="length"]')).select_by_value(
        "2"
    )
    for board, length in (("copy_exact_match", "32 (2x)"), ("flip_flop_token_acc", "64 (2x)")):
        heads = browser.find_elements("css selector", f'table[data-board="{board}"] th')
        shown = [h.text for h in heads if h.is_displayed()]
        assert shown == [
            "scheme",
            length,
            "family",
            "kind",
            "paper",
        ]  # copy trains at 16, flip-flop at 32
    mrr = pd.read_csv(ROOT / "results" / "tasks_quick" / "tables" / "mrr.csv")
    head(browser, "mrr", "MRR").click()  # best (highest) first
    assert visible_rows(browser, "mrr")[0] == mrr.sort_values("mrr")["label"].iloc[-1]
    no_errors(browser)
