"""The published tables in results/published/: citation, setup and numbers that parse, and
files that break the schema are refused with the field named."""

from __future__ import annotations

import re

import pytest
import yaml

from pe_bench.errors import UserError
from pe_bench.positions import registered
from pe_bench.report.compare import (
    CITATION_FIELDS,
    SETUP_FIELDS,
    load_published,
    resolve,
)
from pe_bench.report.ranking import load_ranking
from tests.helpers import ROOT

ALL_PUBLISHED = sorted((ROOT / "results" / "published").glob("*.yaml"))
RANKINGS = [p for p in ALL_PUBLISHED if yaml.safe_load(p.read_text())["metric"] == "mrr"]
PUBLISHED = [p for p in ALL_PUBLISHED if p not in RANKINGS]  # perplexity tables
EXPERIMENTS = ROOT / "conf" / "experiment"


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.stem)
def test_published_table_schema(path):
    table = load_published(path)
    doc = yaml.safe_load(path.read_text())
    for field in CITATION_FIELDS:
        assert str(doc["citation"][field]).strip(), field
    for field in SETUP_FIELDS:
        assert field == "stride" or str(doc["setup"][field]).strip(), field
    assert isinstance(doc["citation"]["authors"], list) and len(doc["citation"]["authors"]) > 1
    assert re.fullmatch(r"\d{4}\.\d{4,5}", doc["citation"]["arxiv"])
    assert 2000 < doc["citation"]["year"] < 2100 and doc["citation"]["page"] > 0
    assert table.lengths == sorted(table.lengths) and table.train_len == table.lengths[0]
    assert (table.values["value"] > 0).all()
    # every label names a pe-bench scheme (label = scheme, scheme+variant or scheme:finetune)
    for label in table.values["label"].dropna().unique():
        scheme = re.split(r"[+:]", label)[0]
        assert scheme in registered(), label
    # the experiments that reproduce it exist and compare with it
    for name in (table.name, table.name + "_mini"):
        config = yaml.safe_load((EXPERIMENTS / f"{name}.yaml").read_text())
        assert config["compare"] == f"published/{table.name}"


def test_alibi_table_2_numbers():
    """The twenty numbers of Press et al. (2022), Table 2 (p. 16), at 512 ... 7512 tokens."""
    values = load_published("published/alibi_paper").values
    rows = {name: list(cells["value"]) for name, cells in values.groupby("name", sort=False)}
    assert rows == {
        "Sinusoidal": [20.05, 43.54, 132.41, 209.37, 293.02],
        "Rotary": [20.07, 21.37, 31.58, 39.15, 51.12],
        "T5 Bias": [19.65, 18.79, 20.41, 25.91, 39.29],
        "ALiBi": [19.73, 18.73, 18.41, 18.41, 18.33],
    }


def test_pi_table_bounds_and_gaps():
    values = load_published("published/pi_paper").values.set_index(["label", "eval_len"])
    assert values.loc[("rope", 4096), ["value", "bound"]].tolist() == [1000.0, True]  # ">10^3"
    assert values.loc[("rope:pi", 8192), "value"] == 6.95
    assert values.loc[("rope+pi", 8192), "value"] == 16.10  # Table 3, step 0
    assert ("rope:ft", 16384) not in values.index  # null: not in the table


GOOD = {
    "citation": {field: "x" for field in CITATION_FIELDS},
    "setup": {field: "x" for field in SETUP_FIELDS} | {"train_len": 8, "stride": None},
    "metric": "ppl",
    "lengths": [8, 16],
    "rows": [{"name": "R", "label": "rope", "values": [2.0, 3.0]}],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"citation": {"title": "x"}}, "citation lacks authors, venue, year, arxiv, table, page"),
        ({"lengths": [16, 8]}, "lengths [16, 8] must be positive integers, ascending"),
        ({"metric": "bpb"}, "metric 'bpb' is not supported; allowed: ppl"),
        ({"rows": [{"name": "R", "values": [2.0]}]}, "row 'R' needs a name and 2 values"),
        ({"rows": [{"name": "R", "values": [2.0, "abc"]}]}, "R at 16: 'abc' is not a positive"),
        ({"rows": [{"name": "R", "values": [">2", 3.0]}]}, "R: a bound at the training length"),
        ({"setup": {**GOOD["setup"], "train_len": 4}}, "setup.train_len 4 is not one of lengths"),
    ],
)
def test_a_broken_table_is_refused(tmp_path, change, message):
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump({**GOOD, **change}))
    with pytest.raises(UserError, match=re.escape(message)):
        load_published(path)


def test_the_unbroken_table_loads(tmp_path):
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    table = load_published(path)
    assert table.train_len == 8 and table.values["value"].tolist() == [2.0, 3.0]


@pytest.mark.parametrize("path", RANKINGS, ids=lambda p: p.stem)
def test_published_ranking_schema(path):
    """A ranking's rows name pe-bench schemes, its MRRs are those of schemes ranked in every
    cell (they sum to 1 + 1/2 + ... + 1/k), and two experiments compare with it."""
    ranking = load_ranking(path)
    assert set(ranking.values["label"]) <= set(registered())
    total = sum(1 / k for k in range(1, len(ranking.values) + 1))
    assert ranking.values["value"].sum() == pytest.approx(total, abs=1e-5)
    for name in (ranking.name, ranking.name + "_mini"):
        config = yaml.safe_load((EXPERIMENTS / f"{name}.yaml").read_text())
        assert config["compare"] == f"published/{ranking.name}"


def test_kazemnejad_figure_1_order():
    values = load_ranking("published/kazemnejad_paper").values.set_index("label")["value"]
    assert list(values.sort_values(ascending=False).index) == [
        "nope",
        "t5",
        "alibi",
        "rope",
        "sinusoidal",
    ]
    assert values.round(2).tolist() == [0.69, 0.55, 0.50, 0.33, 0.22]


def test_a_perplexity_table_is_not_a_ranking():
    with pytest.raises(UserError, match="not a published ranking"):
        load_ranking("published/alibi_paper")


def test_a_ranking_says_how_the_paper_breaks_ties(tmp_path):
    ranking = load_ranking("published/kazemnejad_paper")
    assert ranking.tie_order == ["rope", "alibi", "t5", "sinusoidal", "nope"]  # its rows, in order
    assert ranking.setup["splits"] == 17 and ranking.setup["seeds"] == 3
    doc = yaml.safe_load(resolve("published/kazemnejad_paper").read_text())
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**doc, "tie_order": ["rope", "alibi"]}))
    with pytest.raises(UserError, match="tie_order must list every row's label once"):
        load_ranking(path)
