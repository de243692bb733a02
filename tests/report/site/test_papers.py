"""The paper column: each scheme's citation as its docstrings give it."""

from __future__ import annotations

from pe_bench.report.site.papers import Citation, citation


def test_a_scheme_cites_its_docstrings_reference():
    assert citation("alibi") == Citation(
        "Press et al. 2022", 2022, "https://arxiv.org/abs/2108.12409"
    )
    assert citation("su_unregistered") == Citation()  # a pretrained model, a plugin not loaded
    assert citation("learned").html() == "–"  # GPT-2 style: its docstring cites no paper


def test_a_scheme_without_its_own_reference_cites_its_base_not_its_neighbours():
    # DAPE on ALiBi: the DAPE paper (its base class's docstring), not ALiBi's
    assert citation("dape_alibi").text == "Zheng et al. 2024"
    assert citation("dape_alibi").url == "https://arxiv.org/abs/2405.14722"
    # dynamic NTK names its authors but no address: none is borrowed from RoPE's docstring
    assert citation("dynamic_ntk") == Citation("bloc97 and emozilla 2023", 2023, "")
    assert citation("ntk").html() == (
        '<a href="https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/">bloc97 2023</a>'
    )
