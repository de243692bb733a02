"""The mean reciprocal rank over synthetic tasks (Kazemnejad et al. 2023's summary) and its
comparison with a published ranking: each task ranked by its headline metric (the one its
paper reports), ties sharing the better rank, and beside the comparison the paper's own
tie-break (its notebook's ``rank(method="first")``), so that the order is compared like with
like and the reader sees what the tie-break alone does."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from pe_bench.data.tasks import TASKS
from pe_bench.errors import UserError
from pe_bench.report import aggregate
from pe_bench.report.compare import CITATION_FIELDS, kendall_tau, resolve
from pe_bench.report.markdown import markdown_table


def headlines(tasks: list[str]) -> dict[str, str]:
    """Each task's headline metric (``Task.headline``; exact match for a task not in
    ``TASKS``)."""
    return {task: TASKS[task].headline if task in TASKS else "exact_match" for task in tasks}


def ranking_tables(df: pd.DataFrame, tasks: list[str], published: tuple[str, ...] = ()) -> dict:
    """``mrr`` (ties shared) and, with a published ranking, ``compare``: the paper's MRR next
    to ours, and ours with ties broken as the paper breaks them where it says how. The task
    report compares with one ranking at most."""
    if len(published) > 1:
        raise UserError(
            f"the task report compares with one published ranking, not {len(published)} "
            f"({', '.join(published)}); allowed: one --compare"
        )
    metrics = headlines(tasks)
    tables = {"mrr": aggregate.reciprocal_ranks(df, metrics)}
    if published:
        paper = load_ranking(published[0])
        first = None
        if paper.tie_order:
            first = aggregate.reciprocal_ranks(df, metrics, paper.tie_order)
        table = ranking_comparison(tables["mrr"], paper, first)
        table.attrs |= {
            "cite": paper.cite(),
            "tie_order": paper.tie_order,
            "splits": paper.setup.get("splits"),
            "seeds": paper.setup.get("seeds"),
        }
        tables["compare"] = table
    return tables


def mrr_markdown(mrr: pd.DataFrame, tasks: list[str]) -> str:
    """Mean rank per task (over seeds), the mean reciprocal rank and its (task, seed) cells."""
    rows = [
        [
            row["label"],
            *("–" if pd.isna(row.get(t)) else f"{row[t]:.2g}" for t in tasks),
            "–" if pd.isna(row["mrr"]) else f"{row['mrr']:.2f}",
            str(row["n"]),
        ]
        for _, row in mrr.iterrows()
    ]
    header = ["scheme", *(f"rank: {t}" for t in tasks), "MRR", "n"]
    return markdown_table(header, rows, "l" + "r" * (len(tasks) + 2))


def ranked_by(tasks: list[str]) -> str:
    """What each task is ranked by, in words."""
    metrics = headlines(tasks)
    by_token = [t for t in tasks if metrics[t] == "token_acc"]
    if not by_token:
        return "exact match"
    if len(by_token) == len(tasks):
        return "token accuracy (the share of answer tokens right, as their papers score)"
    return (
        f"each task's headline metric (exact match; token accuracy for {', '.join(by_token)}, "
        "the share of reads or queries right, as their papers score)"
    )


def mrr_section(mrr: pd.DataFrame, tasks: list[str], tied: list[str]) -> list[str]:
    """The MRR section of report.md; ``tied``: the tasks no scheme solves past L."""
    ties = (
        f" On {', '.join(tied)} no scheme solves an instance past the training length, so every "
        "scheme shares rank 1 there; see each task's token accuracy below."
        if tied
        else ""
    )
    return [
        "## Mean reciprocal rank over tasks",
        "",
        f"As Kazemnejad et al. (2023) summarise: for each task and seed, schemes ranked by "
        f"{ranked_by(tasks)} averaged over the lengths beyond the training length (each length "
        "as many instances: the paper pools its test lengths; ties share the better rank), "
        "then 1/rank averaged over the (task, seed) cells (n). A point ranking: the per-task "
        "tables below say which differences the seeds support." + ties,
        "",
        mrr_markdown(mrr, tasks),
        "",
    ]


def compare_markdown(table: pd.DataFrame) -> str:
    header, align = ["scheme", "paper", "ours"], "lrr"
    rows = [
        [r.label, f"{r.paper:.2f} ({r.paper_rank})", f"{r.ours:.2f} ({r.ours_rank})"]
        for r in table.itertuples()
    ]
    if "first" in table:
        header, align = [*header, "ours, ties as the paper"], align + "r"
        for row, r in zip(rows, table.itertuples(), strict=True):
            row.append(f"{r.first:.2f} ({r.first_rank})")
    return markdown_table(header, rows, align)


def tau_text(tau: float) -> str:
    return "–" if pd.isna(tau) else f"{tau:.2f}"


def compare_section(table: pd.DataFrame, tasks: list[str], seeds: int) -> list[str]:
    attrs = table.attrs
    scope = (
        f"The published MRR averages over the paper's {attrs['splits']} task splits and "
        f"{attrs['seeds']} seeds; this run ranks {len(tasks)} task{'s' * (len(tasks) > 1)} "
        f"({', '.join(tasks)}) over {seeds} seed{'s' * (seeds > 1)}, so the two MRRs summarise "
        "different tasks: a scheme that does well on the splits this run lacks ranks higher "
        "there and not here. "
        if attrs.get("splits")
        else ""
    )
    ties = (
        f" The paper's notebook breaks ties by its rows' order ({', '.join(attrs['tie_order'])}; "
        'pandas\' rank(method="first")), handing a tie to the scheme listed first; the last '
        "column ranks this run that way (Kendall's tau "
        f"{tau_text(attrs.get('tau_first', float('nan')))}). The comparison itself uses the "
        "shared rank, which credits no scheme for its place in a list."
        if attrs.get("tie_order")
        else ""
    )
    return [
        f"## Compared with {attrs['cite']}",
        "",
        f"Mean reciprocal rank (rank among these schemes). {scope}The paper's models and "
        "budget are far larger too (see results/published): compare the order, not the "
        f"values. Kendall's tau of the two orders, tied schemes sharing a rank: "
        f"{tau_text(attrs['tau'])} (1: the same order, -1: reversed; over the pairs neither "
        "side ties)." + ties,
        "",
        compare_markdown(table),
        "",
    ]


RANKING_SETUP = ("tasks", "model", "score")


@dataclass(frozen=True)
class PublishedRanking:
    """A paper's summary ranking over synthetic tasks (``metric: mrr``): one value per scheme."""

    name: str
    citation: dict
    setup: dict
    values: pd.DataFrame  # name, label, value
    tie_order: list[str] | None = None  # labels in the order the paper breaks ties (if it does)

    def cite(self) -> str:
        authors = self.citation["authors"]
        return (
            f"{authors[0].split()[-1]} et al. ({self.citation['year']}), {self.citation['table']}"
        )


def load_ranking(name: str | Path) -> PublishedRanking:
    """Read and check a published ranking (``metric: mrr``, e.g. ``published/kazemnejad_paper``)."""
    path = resolve(name)
    doc = yaml.safe_load(path.read_text())
    where = path.name
    if not isinstance(doc, dict) or doc.get("metric") != "mrr":
        raise UserError(
            f"{where}: not a published ranking (metric: mrr); the task report needs one"
        )
    for section, fields in (("citation", CITATION_FIELDS), ("setup", RANKING_SETUP)):
        missing = [f for f in fields if f not in (doc.get(section) or {})]
        if missing:
            raise UserError(f"{where}: {section} lacks {', '.join(missing)}")
    rows = doc.get("rows") or []
    if not rows or not all(isinstance(r.get("value"), (int, float)) for r in rows):
        raise UserError(f"{where}: rows need a name, a label and a numeric value")
    values = pd.DataFrame(
        [[r["name"], r.get("label"), float(r["value"])] for r in rows],
        columns=["name", "label", "value"],
    )
    tie_order = doc.get("tie_order")
    if tie_order is not None and (
        not isinstance(tie_order, list) or sorted(tie_order) != sorted(values["label"].dropna())
    ):
        raise UserError(f"{where}: tie_order must list every row's label once, got {tie_order!r}")
    name = path.name.removesuffix(".yaml")
    return PublishedRanking(name, doc["citation"], doc["setup"], values, tie_order)


def ranking_comparison(
    ours: pd.DataFrame, published: PublishedRanking, first: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The paper's MRR and ours per scheme both have (``ours``: ``aggregate.reciprocal_ranks``
    rows, ties sharing a rank), with each side's rank among those schemes, and the rank
    order's Kendall tau as an attribute (``.attrs['tau']``, over the pairs neither side
    ties). ``first``: our MRR with ties broken as the paper breaks them, beside it
    (``first``, ``first_rank``; its tau is ``.attrs['tau_first']``)."""
    paper = published.values.dropna(subset=["label"]).set_index("label")["value"]
    mine = ours.set_index("label")["mrr"]
    both = [label for label in paper.index if label in mine.index]
    table = pd.DataFrame({"paper": paper[both], "ours": mine[both]})
    table["paper_rank"] = table["paper"].rank(ascending=False, method="min").astype(int)
    table["ours_rank"] = table["ours"].rank(ascending=False, method="min").astype(int)
    table.attrs["tau"] = ranking_tau(table["paper"], table["ours"])
    if first is not None:
        table["first"] = first.set_index("label")["mrr"].reindex(both)
        table["first_rank"] = table["first"].rank(ascending=False, method="min").astype(int)
        table.attrs["tau_first"] = ranking_tau(table["paper"], table["first"])
    return table.rename_axis("label").reset_index()


def ranking_tau(paper: pd.Series, ours: pd.Series) -> float:
    """Kendall's tau of two orders of the same labels, over the pairs neither side ties."""
    agree = disagree = 0
    for a, b in itertools.combinations(paper.index, 2):
        if paper[a] != paper[b] and ours[a] != ours[b]:
            sign = math.copysign(1, paper[a] - paper[b]) * math.copysign(1, ours[a] - ours[b])
            agree, disagree = agree + (sign > 0), disagree + (sign < 0)
    return kendall_tau(agree, disagree)
