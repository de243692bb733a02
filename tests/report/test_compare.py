"""The comparison with a published table, on hand-made records and a hand-made paper table.

The paper (trained at 100) and the run (trained at 10), at ratios 1x, 2x and 4x:

    paper  A 10  20    40        run  a  2  3    5
           B 10  11    12             b  2  2.2  2.4
           C 10  >100  >100           c  2  2.5  6
           D 10  30    –              (no d in the run)

At 2x the paper orders B < A < C, the run b < c < a: pairs (A, B) and (B, C) agree, (A, C)
is reversed. At 4x both order B < A < C. So 5 of 6 pairs agree past 1x: tau = (5 - 1) / 6.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

from pe_bench.cli.report import main as report_main
from pe_bench.errors import UserError
from pe_bench.report import aggregate, compare, protocols
from pe_bench.report.build import build_report
from pe_bench.report.inputs import Options
from pe_bench.report.ranking import ranking_tables
from tests.helpers import record, write_runs

PAPER = {
    "citation": {
        "authors": ["Ada Lovelace", "Alan Turing", "Grace Hopper"],
        "title": "A Hand-Made Table",
        "venue": "Tests",
        "year": 2024,
        "arxiv": "2401.00001",
        "table": "Table 9",
        "page": 3,
        "read_from": "this test",
    },
    "setup": {
        "corpus": "none",
        "model": "none",
        "train_len": 100,
        "protocol": "nonoverlap",
        "stride": None,
        "unit": "per word",
    },
    "metric": "ppl",
    "lengths": [100, 200, 400],
    "rows": [
        {"name": "A", "label": "a", "values": [10, 20, 40]},
        {"name": "B", "label": "b", "values": [10, 11, 12]},
        {"name": "C", "label": "c", "values": [10, ">100", ">100"]},
        {"name": "D", "label": "d", "values": [10, 30, None]},
        {"name": "E", "label": None, "values": [1, 2, 3]},
    ],
}
RUN = {"a": [2, 3, 5], "b": [2, 2.2, 2.4], "c": [2, 2.5, 6]}


def write_paper(folder: Path, **changes) -> Path:
    path = folder / "paper.yaml"
    path.write_text(yaml.safe_dump({**PAPER, **changes}))
    return path


def run_stats(values: dict[str, list[float]], lengths=(10, 20, 40)) -> pd.DataFrame:
    """Seed statistics of hand-made records with the given perplexities (one seed)."""
    rows = [
        record(lab, 0, n, math.log(v), train_len=10)
        for lab, vs in values.items()
        for n, v in zip(lengths, vs, strict=True)
    ]
    return aggregate.seed_stats(aggregate.prepare(pd.DataFrame(rows)), "ppl")


@pytest.fixture
def comparison(tmp_path) -> compare.Comparison:
    published = compare.load_published(write_paper(tmp_path))
    return compare.compare(run_stats(RUN), 10, published)


def test_ratios_and_ratio_errors(comparison):
    cells = comparison.cells.set_index(["label", "eval_len"])
    assert cells.loc[("a", 40), "paper_ratio"] == pytest.approx(4.0)
    assert cells.loc[("a", 40), "ours_ratio"] == pytest.approx(2.5)
    assert cells.loc[("a", 40), "ratio_error"] == pytest.approx(2.5 / 4.0)
    assert cells.loc[("b", 20), "ratio_error"] == pytest.approx(1.1 / 1.1)
    assert cells.loc[("c", 20), "paper_ratio"] == pytest.approx(10.0)  # a bound: > 10
    assert cells.loc[("c", 20), "paper_bound"]
    assert cells.loc[("c", 40), "paper_len"] == 400
    assert set(cells.index.get_level_values("label")) == {"a", "b", "c"}  # E unmapped, d absent


def test_rank_agreement_per_length_and_overall(comparison):
    orders = comparison.orders.set_index("ratio_len")
    assert orders.loc[2.0, "paper_order"] == ["b", "a", "c"]
    assert orders.loc[2.0, "ours_order"] == ["b", "c", "a"]
    assert (orders.loc[2.0, "agree"], orders.loc[2.0, "disagree"]) == (2, 1)
    assert orders.loc[2.0, "tau"] == pytest.approx(1 / 3)
    assert orders.loc[2.0, "flipped"] == [("a", "c")]  # the paper's better one first
    assert (orders.loc[4.0, "agree"], orders.loc[4.0, "disagree"]) == (3, 0)
    assert orders.loc[1.0, "agree"] + orders.loc[1.0, "disagree"] == 0  # all tied at 1x
    assert (comparison.agree, comparison.disagree) == (5, 1)  # past 1x only
    assert comparison.tau == pytest.approx(4 / 6)
    assert comparison.missing == ["d"]


def test_kendall_tau_of_pair_counts():
    assert compare.kendall_tau(3, 0) == 1.0  # the same order
    assert compare.kendall_tau(0, 3) == -1.0  # the reverse
    assert compare.kendall_tau(2, 1) == pytest.approx(1 / 3)
    assert math.isnan(compare.kendall_tau(0, 0))  # no pair to count


def test_sentences_say_where_they_agree_and_where_not(comparison):
    assert comparison.sentences() == [
        "Rank order past the training length (2.0x, 4.0x): the paper and this run order 5 of 6 "
        "scheme pairs the same way (Kendall tau +0.67).",
        "Both rank b best at 4.0x; both rank c worst.",
        "At 2.0x this run reverses 1 of the 3 pairs the paper orders (its better scheme first): "
        "a over c.",
        "a degrades in both: at 4.0x, 4.00x its training-length value in the paper, 2.50x here.",
        "b degrades in both: at 4.0x, 1.20x its training-length value in the paper, 1.20x here.",
        "c degrades in both: at 4.0x, >10.0x its training-length value in the paper, 3.00x here.",
        "Not in this run: d.",
    ]


def test_a_flat_run_against_a_degrading_paper(tmp_path):
    published = compare.load_published(write_paper(tmp_path))
    flat = compare.compare(run_stats({"a": [2, 2, 2], "b": [2, 1.5, 1.2]}), 10, published)
    text = flat.sentences()
    assert "a degrades in the paper (4.00x at 4.0x) but stays flat here (1.00x)." in text
    assert "b degrades in the paper (1.20x at 4.0x) but improves here (0.60x)." in text
    assert "Both rank b best at 4.0x; both rank a worst." in text


def test_a_bound_that_leaves_the_order_open_is_not_counted():
    a = pd.Series({"paper": 100.0, "paper_bound": True})
    assert compare.paper_sign(a, pd.Series({"paper": 150.0, "paper_bound": False})) is None
    assert compare.paper_sign(a, pd.Series({"paper": 50.0, "paper_bound": False})) == 1
    assert compare.paper_sign(a, pd.Series({"paper": 100.0, "paper_bound": True})) is None
    assert compare.paper_sign(*(pd.Series({"paper": 7.0, "paper_bound": False}),) * 2) == 0


def test_lengths_match_by_ratio_to_the_training_length(tmp_path):
    alibi = compare.load_published("published/alibi_paper")
    matched = compare.match_lengths(alibi, [64, 126, 314, 564, 939], 64)
    assert matched == {512: 64, 1012: 126, 2512: 314, 4512: 564, 7512: 939}
    # 128 / 64 = 2 is within 5% of 1012 / 512 = 1.98; 256 / 64 = 4 is 18% off 4.9
    assert compare.match_lengths(alibi, [64, 128, 256], 64) == {512: 64, 1012: 128}
    with pytest.raises(UserError, match="no eval length of the run .* run experiment=alibi_paper_"):
        compare.match_lengths(alibi, [64, 256, 1024], 64)
    with pytest.raises(UserError, match="no records at its training length 64"):
        compare.match_lengths(alibi, [128, 256], 64)


def test_a_run_without_any_published_scheme(tmp_path):
    published = compare.load_published(write_paper(tmp_path))
    with pytest.raises(UserError, match=r"none of the published schemes \(a, b, c, d\)"):
        compare.compare(run_stats({"x": [2, 3, 4]}), 10, published)


def test_names_resolve_to_shipped_tables_or_paths(tmp_path):
    shipped = compare.resolve("published/alibi_paper")
    assert shipped.name == "alibi_paper.yaml" and shipped.is_file()
    assert compare.resolve("pi_paper").name == "pi_paper.yaml"
    path = write_paper(tmp_path)
    assert compare.resolve(path) == path
    assert compare.resolve(tmp_path / "paper") == path  # .yaml optional
    with pytest.raises(UserError, match="no published table 'published/nope'; shipped: "):
        compare.resolve("published/nope")


def test_a_pretrained_models_labels_are_read_as_a_rope_models():
    """model=hf labels (`<model>`, `<model>+<variant>`) meet a paper's rows without fine-tuning
    (`rope`, `rope+<variant>`); other labels stay."""
    stats = pd.DataFrame({"label": ["SmolLM2", "SmolLM2+yarn", "SmolLM2x", "alibi"], "mean": 1.0})
    assert protocols.as_rope(stats, "SmolLM2")["label"].tolist() == [
        "rope",
        "rope+yarn",
        "SmolLM2x",
        "alibi",
    ]


def test_the_yarn_table_reads_its_row_without_fine_tuning():
    """results/published/yarn_paper.yaml: Mistral 7B as released, 2.96 at its context of 8192
    and 36.8 at 2x (Table 6); the fine-tuned rows are not eval-time variants."""
    values = compare.load_published("published/yarn_paper").values.set_index(["label", "eval_len"])
    assert (
        values.loc[("rope", 8192), "value"] == 2.96 and values.loc[("rope", 16384), "value"] == 36.8
    )
    assert values.loc[("rope", 65536), ["value", "bound"]].tolist() == [1000.0, True]
    labels = set(values.index.get_level_values("label").dropna())
    assert labels == {"rope", "rope:yarn"}  # MistralLite and YaRN s = 16: no label


# A second hand-made paper, trained at 50, at 1x and 2x: it meets the run at 10 and 20.
SECOND = {
    **PAPER,
    "citation": {
        **PAPER["citation"],
        "authors": ["Emmy Noether", "Kurt Goedel"],
        "table": "Table 2",
    },
    "setup": {**PAPER["setup"], "train_len": 50},
    "lengths": [50, 100],
    "rows": [
        {"name": "A2", "label": "a", "values": [5, 9]},
        {"name": "B2", "label": "b", "values": [5, 6]},
    ],
}
# A third, at 1x and 3x: the run has no length at 3x, so it matches the training length only.
UNMATCHED = {**SECOND, "lengths": [50, 150]}


def write_table(folder: Path, name: str, doc: dict) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def write_run(folder: Path) -> Path:
    """``RUN``'s records (one seed, trained at 10) in pe-bench's layout under ``folder/run``."""
    rows = [
        record(lab, 0, n, math.log(v), train_len=10)
        for lab, vs in RUN.items()
        for n, v in zip((10, 20, 40), vs, strict=True)
    ]
    write_runs(folder / "run", rows)
    return folder / "run"


def test_two_tables_give_two_sections_and_both_papers_rows(tmp_path):
    run = write_run(tmp_path)
    first, second = write_paper(tmp_path), write_table(tmp_path, "second", SECOND)
    report = build_report(run, options=Options(compare=(str(first), str(second))), echo=False)
    assert [c.published.name for c in report.comparisons] == ["paper", "second"]
    text = report.path.read_text()
    assert text.count("\n## Comparison with ") == 2
    assert "## Comparison with Lovelace et al. (2024), Table 9" in text
    assert "## Comparison with Noether and Goedel (2024), Table 2" in text
    assert text.index("Lovelace et al. (2024), Table 9") < text.index("Noether and Goedel")
    assert f"--compare {first} --compare {second}" in text  # the command that remakes it
    compared = pd.read_csv(run / "tables" / "compare.csv")
    assert compared.columns[0] == "table"
    assert list(compared.columns[1:]) == list(report.comparisons[0].cells.columns)
    rows = {table: set(at["paper_name"]) for table, at in compared.groupby("table")}
    assert rows == {"paper": {"A", "B", "C"}, "second": {"A2", "B2"}}
    for name in ("paper", "second"):
        for kind in ("ppl", "ratio", "order"):
            assert (run / "tables" / f"compare_{name}_{kind}.tex").is_file()
    assert not (run / "tables" / "compare_ppl.tex").exists()


def test_one_compare_writes_what_it_wrote_before(tmp_path, capsys):
    """One table, from the command line or as a plain name: one section, compare.csv the
    comparison's cells (no ``table`` column), tables/compare_{ppl,ratio,order}.tex."""
    run = write_run(tmp_path)
    paper = write_paper(tmp_path)
    report_main([str(run), "--compare", str(paper)])
    assert "Comparison with Lovelace et al. (2024), Table 9:" in capsys.readouterr().out
    text = (run / "report.md").read_text()
    assert text.count("\n## Comparison with ") == 1
    assert f"--compare {paper}" in text and text.count("--compare") == 1
    compared = pd.read_csv(run / "tables" / "compare.csv")
    cells = compare.compare(run_stats(RUN), 10, compare.load_published(paper)).cells
    assert list(compared.columns) == list(cells.columns)
    assert {f.name for f in (run / "tables").glob("compare*")} == {
        "compare.csv",
        "compare_ppl.tex",
        "compare_ratio.tex",
        "compare_order.tex",
    }
    # a plain name (an experiment's compare: or the old Options) writes the same files
    names = ("report.md", "tables/compare.csv", "tables/compare_ppl.tex")
    before = {name: (run / name).read_text() for name in names}
    build_report(run, options=Options(compare=str(paper)), echo=False)
    assert {name: (run / name).read_text() for name in names} == before


def test_a_report_leaves_no_comparison_tables_of_the_one_before(tmp_path):
    """Two tables, then one, then none: each report's tables/ holds its own comparison files
    only (the two-table names, then compare.csv, are another report's)."""
    run = write_run(tmp_path)
    first, second = write_paper(tmp_path), write_table(tmp_path, "second", SECOND)
    build_report(run, options=Options(compare=(str(first), str(second))), echo=False)
    build_report(run, options=Options(compare=str(first)), echo=False)
    assert {f.name for f in (run / "tables").glob("compare*")} == {
        "compare.csv",
        "compare_ppl.tex",
        "compare_ratio.tex",
        "compare_order.tex",
    }
    build_report(run, options=Options(), echo=False)
    assert not list((run / "tables").glob("compare*"))


def test_a_table_that_fits_nothing_is_skipped_when_another_fits(tmp_path, caplog):
    run = write_run(tmp_path)
    paper, unmatched = write_paper(tmp_path), write_table(tmp_path, "unmatched", UNMATCHED)
    with caplog.at_level(logging.WARNING, logger="pe_bench.report.compare"):
        report = build_report(
            run, options=Options(compare=(str(paper), str(unmatched))), echo=False
        )
    assert [c.published.name for c in report.comparisons] == ["paper"]
    (warning,) = caplog.messages
    assert warning.startswith("not compared with unmatched: no eval length of the run")
    assert "table" not in pd.read_csv(run / "tables" / "compare.csv").columns  # one table left


def test_a_run_that_fits_no_table_is_refused_in_one_line(tmp_path):
    stats = run_stats(RUN)
    unmatched = compare.load_published(write_table(tmp_path, "unmatched", UNMATCHED))
    with pytest.raises(UserError, match=r"^unmatched: no eval length of the run") as alone:
        compare.compare_all(stats, 10, [unmatched])
    assert "\n" not in str(alone.value)  # as a single table was refused before
    nothing = compare.load_published(
        write_table(
            tmp_path, "nothing", {**SECOND, "rows": [{"name": "X", "label": "x", "values": [5, 9]}]}
        )
    )
    with pytest.raises(UserError) as both:
        compare.compare_all(stats, 10, [unmatched, nothing])
    message = str(both.value)
    assert message.startswith("no published table fits this run: unmatched: no eval length")
    assert "; nothing: the run has none of the published schemes (x)" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("given", "names"),
    [
        (None, ()),
        ("", ()),
        ("published/yarn_paper", ("published/yarn_paper",)),
        (
            ["published/yarn_paper", "published/pi_paper"],
            ("published/yarn_paper", "published/pi_paper"),
        ),
        (("a", "b", "a"), ("a", "b")),  # each table once
        (OmegaConf.create({"c": ["a", "b"]}).c, ("a", "b")),  # a Hydra config's list
    ],
)
def test_compare_is_a_name_or_a_list_of_names(given, names):
    assert Options(compare=given).compare == names


@pytest.mark.parametrize("given", [3, ["a", 3], {"a": 1}, ["a", ""]])
def test_compare_that_is_no_name_is_refused(given):
    with pytest.raises(UserError, match="must name a published table or list them"):
        Options(compare=given)


def test_the_task_report_compares_with_one_ranking():
    with pytest.raises(UserError, match="compares with one published ranking, not 2"):
        ranking_tables(pd.DataFrame(), [], ("published/a", "published/b"))
