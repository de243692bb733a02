"""A run next to a published table: the *shape* of extrapolation, not the absolute numbers.

A published table (``results/published/<name>.yaml``) holds a paper's numbers with their
citation and setup. Absolute perplexities differ with model size, data and tokenizer (the
papers' are per word or per subword token, pe-bench's per byte or per token of its tokenizer),
so the comparison is about:

- **Ratios**: each scheme's value at an eval length divided by its value at the training
  length, for the paper and for the run. Eval lengths are matched by their ratio to the
  training length (within 5%), so a run trained at 64 tokens meets a paper trained at 512.
- **Rank order** of the schemes at each matched length: for every pair of schemes, whether
  the paper and the run order them the same way. A pair agrees (concordant) or not
  (discordant); pairs with a tie, or that the paper's bounds (">1000") leave open, are left
  out. Kendall's tau = (concordant - discordant) / (concordant + discordant); 1 is the same
  order, -1 the reverse. The overall statistic pools the pairs of every length past the
  training length, where extrapolation happens.

Each table is read against the run's records of the mode that measures what its protocol
measures, where the run has it (``protocols``).

Pure pandas on a run's seed statistics (``aggregate.seed_stats``) and a ``Published`` table,
so every number can be checked by hand (``tests/report/test_compare.py``).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import itertools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from pe_bench.errors import UserError

log = logging.getLogger(__name__)

CITATION_FIELDS = ("authors", "title", "venue", "year", "arxiv", "table", "page", "read_from")
SETUP_FIELDS = ("corpus", "model", "train_len", "protocol", "stride", "unit")
RATIO_TOLERANCE = 0.05  # eval lengths match when their ratios to L_train differ by < 5%
FLAT = 0.05  # a ratio within 1 +- 5% of the training-length value counts as flat


@dataclass(frozen=True)
class Published:
    """A paper's table: citation, setup, and one row of values per scheme."""

    name: str  # the file's stem, e.g. alibi_paper
    citation: dict
    setup: dict
    metric: str  # ppl
    lengths: list[int]
    values: pd.DataFrame  # name, label, eval_len, value, bound (True: the paper gives "> value")

    @property
    def train_len(self) -> int:
        return int(self.setup["train_len"])

    def cite(self) -> str:
        """Short citation, e.g. ``Press et al. (2022), Table 2``."""
        authors = self.citation["authors"]
        who = authors[0].split()[-1] + (" et al." if len(authors) > 2 else "")
        if len(authors) == 2:
            who += " and " + authors[1].split()[-1]
        return f"{who} ({self.citation['year']}), {self.citation['table']}"


def resolve(name: str | Path) -> Path:
    """The file of a published table: a path (``.yaml`` optional), or a name such as
    ``published/alibi_paper`` or ``alibi_paper`` looked up among the tables shipped with
    pe-bench (``results/published/``)."""
    path = Path(name).expanduser()
    for candidate in (path, path.with_name(path.name + ".yaml")):
        if candidate.is_file():
            return candidate
    shipped = importlib.resources.files("pe_bench.published")
    stem = path.name.removesuffix(".yaml")
    if path.parent.name in ("", "published") and shipped.joinpath(stem + ".yaml").is_file():
        return Path(str(shipped.joinpath(stem + ".yaml")))
    known = sorted(
        p.name.removesuffix(".yaml") for p in shipped.iterdir() if p.name.endswith(".yaml")
    )
    shipped_names = ", ".join("published/" + k for k in known)
    raise UserError(f"no published table {str(name)!r}; shipped: {shipped_names} (or a YAML path)")


def load_published(name: str | Path) -> Published:
    """Read and check a published table (the schema is in ``results/published/README.md``)."""
    path = resolve(name)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from err
    where = path.name
    if not isinstance(doc, dict):
        raise UserError(f"{where}: expected a mapping with citation, setup, lengths and rows")
    for section, fields in (("citation", CITATION_FIELDS), ("setup", SETUP_FIELDS)):
        missing = [f for f in fields if f not in (doc.get(section) or {})]
        if missing:
            raise UserError(f"{where}: {section} lacks {', '.join(missing)}")
    if doc.get("metric") != "ppl":
        raise UserError(f"{where}: metric {doc.get('metric')!r} is not supported; allowed: ppl")
    lengths = doc.get("lengths")
    if (
        not isinstance(lengths, list)
        or not all(isinstance(n, int) and n > 0 for n in lengths)
        or lengths != sorted(set(lengths))
    ):
        raise UserError(f"{where}: lengths {lengths!r} must be positive integers, ascending")
    train_len = doc["setup"]["train_len"]
    if train_len not in lengths:
        raise UserError(f"{where}: setup.train_len {train_len!r} is not one of lengths {lengths}")
    rows = []
    for row in doc.get("rows") or []:
        values = row.get("values")
        if not row.get("name") or not isinstance(values, list) or len(values) != len(lengths):
            raise UserError(
                f"{where}: row {row.get('name')!r} needs a name and {len(lengths)} values "
                "(one per length; null where the paper has none)"
            )
        for length, value in zip(lengths, values, strict=True):
            if value is None:
                continue
            number, bound = parse_value(value, f"{where}: {row['name']} at {length}")
            if bound and length == train_len:
                raise UserError(f"{where}: {row['name']}: a bound at the training length")
            rows.append([row["name"], row.get("label"), length, number, bound])
    if not rows:
        raise UserError(f"{where}: no rows with values")
    columns = ["name", "label", "eval_len", "value", "bound"]
    return Published(
        name=path.name.removesuffix(".yaml"),
        citation=doc["citation"],
        setup=doc["setup"],
        metric=doc["metric"],
        lengths=lengths,
        values=pd.DataFrame(rows, columns=columns),
    )


def parse_value(value: object, where: str) -> tuple[float, bool]:
    """A table cell: a positive number, or ``">1000"`` for a lower bound -> (number, bound)."""
    bound = isinstance(value, str) and value.strip().startswith(">")
    text = value.strip().lstrip(">").strip() if isinstance(value, str) else value
    try:
        number = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number <= 0:
        raise UserError(f"{where}: {value!r} is not a positive number or a bound like '>1000'")
    return number, bound


def match_lengths(published: Published, ours: list[int], train_len: int) -> dict[int, int]:
    """Paper length -> the run's eval length with the same ratio to its training length.

    Refuses a run without its training length (ratios need it) or without any length past
    it that matches one of the paper's.
    """
    if train_len not in ours:
        raise UserError(
            f"the run has no records at its training length {train_len}: ratios need them"
        )
    matched = {}
    for length in published.lengths:
        want = length / published.train_len
        best = min(ours, key=lambda n: abs(math.log(n / train_len / want)))
        if abs(best / train_len / want - 1) < RATIO_TOLERANCE:
            matched[length] = best
    if len(matched) < 2:
        ratios = ", ".join(f"{n / published.train_len:.3g}" for n in published.lengths)
        raise UserError(
            f"{published.name}: no eval length of the run (trained at {train_len}: "
            f"{', '.join(map(str, ours))}) has the paper's ratios to its training length "
            f"({ratios}); run experiment={published.name}_mini or set eval.lengths"
        )
    return matched


@dataclass
class Comparison:
    published: Published
    cells: pd.DataFrame  # one row per (label, matched length): values, ratios, ratio error
    orders: pd.DataFrame  # one row per matched length: both rank orders, pairs, tau
    agree: int  # concordant pairs past the training length
    disagree: int  # discordant pairs past the training length
    missing: list[str]  # published labels the run has no records of
    mode: str = ""  # the run's eval mode the comparison read (``protocol_mode``)
    stride: int | None = None  # and its stride (sliding, tail)

    @property
    def tau(self) -> float:
        return kendall_tau(self.agree, self.disagree)

    def sentences(self) -> list[str]:
        """Where the paper and the run agree and where they don't, in words."""
        return describe(self)


def compare(stats: pd.DataFrame, train_len: int, published: Published) -> Comparison:
    """The run's ``seed_stats`` (of ppl) next to the published table.

    Rows without a ``label`` in the published file (schemes pe-bench does not run) and labels
    the run lacks are left out; the run's eval lengths must include its training length.
    """
    table = published.values.dropna(subset=["label"])
    ours = stats[stats["n"] > 0].set_index(["label", "eval_len"])["mean"]
    run_labels = set(stats["label"])
    missing = [lab for lab in dict.fromkeys(table["label"]) if lab not in run_labels]
    table = table[table["label"].isin(run_labels)]
    if table.empty:
        raise UserError(
            f"{published.name}: the run has none of the published schemes "
            f"({', '.join(dict.fromkeys(published.values['label'].dropna()))})"
        )
    lengths = match_lengths(published, sorted(stats["eval_len"].unique()), train_len)
    rows = []
    for name, label in table[["name", "label"]].drop_duplicates().itertuples(index=False):
        paper_row = table[table["name"] == name].set_index("eval_len")
        base = paper_row["value"].get(published.train_len, math.nan)
        our_base = ours.get((label, train_len), math.nan)
        for paper_len, our_len in lengths.items():
            if paper_len not in paper_row.index:
                continue
            paper, bound = paper_row.loc[paper_len, ["value", "bound"]]
            our = ours.get((label, our_len), math.nan)
            rows.append(
                {
                    "label": label,
                    "paper_name": name,
                    "ratio_len": paper_len / published.train_len,
                    "paper_len": paper_len,
                    "eval_len": our_len,
                    "paper": paper,
                    "paper_bound": bool(bound),
                    "ours": our,
                    "paper_ratio": paper / base,
                    "ours_ratio": our / our_base,
                }
            )
    cells = pd.DataFrame(rows)
    cells["ratio_error"] = cells["ours_ratio"] / cells["paper_ratio"]
    orders = rank_orders(cells)
    past = orders[orders["ratio_len"] > 1]
    return Comparison(
        published=published,
        cells=cells,
        orders=orders,
        agree=int(past["agree"].sum()),
        disagree=int(past["disagree"].sum()),
        missing=missing,
    )


def compare_all(
    stats: pd.DataFrame | Callable[[Published], tuple[pd.DataFrame, pd.DataFrame]],
    train_len: int,
    tables: list[Published],
) -> list[Comparison]:
    """The run next to each of ``tables``, in their order: the run's seed statistics, or those
    ``stats`` gives for each table with the records they are of (``protocols.protocol_stats``).
    A table the run does not fit (none of its schemes, no eval length at its ratios) is
    refused in one line when it is the only one, skipped with a warning naming it when another
    fits, and when none fits the reasons, one per table, make one line."""
    done, failed = [], {}
    for table in tables:
        try:
            if isinstance(stats, pd.DataFrame):
                done.append(compare(stats, train_len, table))
                continue
            ppl, records = stats(table)
            strides = records["stride"].dropna().unique()
            stride = int(strides[0]) if len(strides) == 1 else None
            found = compare(ppl, train_len, table)
            done.append(
                dataclasses.replace(found, mode=str(records["mode"].iloc[0]), stride=stride)
            )
        except UserError as err:
            failed[table.name] = str(err)
    if failed and not done:
        if len(failed) == 1:
            raise UserError(next(iter(failed.values())))
        reasons = dict.fromkeys(
            why if why.startswith(f"{name}:") else f"{name}: {why}" for name, why in failed.items()
        )
        raise UserError(f"no published table fits this run: {'; '.join(reasons)}")
    for name, why in failed.items():
        log.warning("not compared with %s: %s", name, why.removeprefix(f"{name}: "))
    return done


def kendall_tau(agree: int, disagree: int) -> float:
    """Kendall's tau of ``agree`` concordant and ``disagree`` discordant pairs; NaN for none."""
    pairs = agree + disagree
    return (agree - disagree) / pairs if pairs else math.nan


def paper_sign(a: pd.Series, b: pd.Series) -> int | None:
    """-1 if the paper's a is better (lower) than b, 1 if worse, 0 for a tie, None when its
    bounds leave the order open (">1000" vs 1200, or two bounds)."""
    if a["paper_bound"] and b["paper_bound"]:
        return None
    if a["paper_bound"]:
        return 1 if a["paper"] >= b["paper"] else None
    if b["paper_bound"]:
        return -1 if b["paper"] >= a["paper"] else None
    return (a["paper"] > b["paper"]) - (a["paper"] < b["paper"])


def rank_orders(cells: pd.DataFrame) -> pd.DataFrame:
    """Per matched length: both orders (best first), concordant and discordant pairs, tau,
    and the discordant pairs as (paper's better, paper's worse)."""
    rows = []
    for ratio_len, at in cells.groupby("ratio_len", sort=True):
        at = at.dropna(subset=["ours"])
        agree, flipped = 0, []
        for (_, a), (_, b) in itertools.combinations(at.iterrows(), 2):
            paper = paper_sign(a, b)
            ours = (a["ours"] > b["ours"]) - (a["ours"] < b["ours"])
            if not paper or not ours:
                continue
            if paper == ours:
                agree += 1
            else:
                flipped.append((a["label"], b["label"]) if paper < 0 else (b["label"], a["label"]))
        rows.append(
            {
                "ratio_len": ratio_len,
                "paper_len": int(at["paper_len"].iloc[0]) if len(at) else 0,
                "eval_len": int(at["eval_len"].iloc[0]) if len(at) else 0,
                "paper_order": list(at.sort_values("paper", kind="stable")["label"]),
                "ours_order": list(at.sort_values("ours", kind="stable")["label"]),
                "agree": agree,
                "disagree": len(flipped),
                "tau": kendall_tau(agree, len(flipped)),
                "flipped": flipped,
            }
        )
    return pd.DataFrame(rows)


def times(ratio: float, bound: bool = False) -> str:
    """A ratio as text: ``14.6x``, ``>139x``."""
    return (">" if bound else "") + f"{ratio:.{1 if ratio >= 10 else 2}f}x"


def trend(ratio: float) -> str:
    if ratio > 1 + FLAT:
        return "degrades"
    if ratio < 1 - FLAT:
        return "improves"
    return "stays flat"


def describe(comparison: Comparison) -> list[str]:
    """Generated sentences: overall rank agreement, best and worst at the longest length,
    where the orders differ, and each scheme's trend at the longest length it has."""
    cells, orders = comparison.cells, comparison.orders
    past = orders[orders["ratio_len"] > 1]
    out = []
    if comparison.agree + comparison.disagree:
        spans = ", ".join(f"{r:.1f}x" for r in past["ratio_len"])
        out.append(
            f"Rank order past the training length ({spans}): the paper and this run order "
            f"{comparison.agree} of {comparison.agree + comparison.disagree} scheme pairs the "
            f"same way (Kendall tau {comparison.tau:+.2f})."
        )
    last = past.iloc[-1] if len(past) else None
    if last is not None and len(last["paper_order"]) > 1:
        at = f"{last['ratio_len']:.1f}x"
        paper, ours = last["paper_order"], last["ours_order"]
        best = (
            f"Both rank {paper[0]} best at {at}"
            if paper[0] == ours[0]
            else f"At {at} the paper ranks {paper[0]} best, this run {ours[0]}"
        )
        worst = (
            f"both rank {paper[-1]} worst"
            if paper[-1] == ours[-1]
            else f"the paper ranks {paper[-1]} worst, this run {ours[-1]}"
        )
        out.append(f"{best}; {worst}.")
    for row in past.itertuples():
        if row.flipped:
            pairs = ", ".join(f"{a} over {b}" for a, b in row.flipped)
            out.append(
                f"At {row.ratio_len:.1f}x this run reverses {row.disagree} of the "
                f"{row.agree + row.disagree} pairs the paper orders (its better scheme first): "
                f"{pairs}."
            )
    for label, rows in cells.groupby("label", sort=False):
        rows = rows.dropna(subset=["paper_ratio", "ours_ratio"])
        rows = rows[rows["ratio_len"] > 1]
        if rows.empty:
            continue
        row = rows.iloc[-1]
        at = f"{row['ratio_len']:.1f}x"
        paper, ours = trend(row["paper_ratio"]), trend(row["ours_ratio"])
        p = times(row["paper_ratio"], row["paper_bound"])
        o = times(row["ours_ratio"])
        if paper == ours:
            out.append(
                f"{label} {paper} in both: at {at}, {p} its training-length value in the "
                f"paper, {o} here."
            )
        else:
            out.append(f"{label} {paper} in the paper ({p} at {at}) but {ours} here ({o}).")
    if comparison.missing:
        out.append(f"Not in this run: {', '.join(comparison.missing)}.")
    return out
