"""The index of a synthetic-task report's site: the mean reciprocal rank over tasks, then per
task its exact-match and token-accuracy boards (tables and curves), cost and provenance."""

from __future__ import annotations

import pandas as pd

from pe_bench.data.tasks import TASKS
from pe_bench.report.inputs import Report
from pe_bench.report.markdown import count, distinct
from pe_bench.report.metrics import spec
from pe_bench.report.ranking import headlines
from pe_bench.report.site.boards import Board, Label, board_panels, board_table, metric_board
from pe_bench.report.site.html import (
    Cell,
    Column,
    Row,
    Sources,
    data_json,
    e,
    paragraph,
    section,
    table,
)
from pe_bench.report.tasks import learned_note, task_metrics, train_lengths


def task_boards(report: Report) -> list[Board]:
    """Each task's boards, one per task metric of its records (exact match, token accuracy:
    higher is better, 0 to 1), its headline metric's first."""
    found = []
    lengths, first = train_lengths(report.frame, report.tasks), headlines(report.tasks)
    for task in report.tasks:
        for metric in sorted(task_metrics(report, task), key=lambda m: m != first[task]):
            name = f"{task}_{metric}"
            headline = " (headline)" if metric == first[task] else ""
            title = f"{task}: {spec(metric).title.lower()}{headline}"
            pairs = report.tables[f"{name}_pairwise"]
            board = metric_board(name, title, report.tables[name], pairs, metric, lengths[task])
            board.task, board.csv = task, (name, f"{name}_pairwise", f"{name}_ranks")
            found.append(board)
    return found


def mrr_table(report: Report, info: dict[str, Label]) -> str:
    """The mean reciprocal rank over tasks, sortable; the highest MRR of the rows shown in
    bold (``site.js``; no paired test, so nothing is marked tied)."""
    mrr, tasks = report.tables["mrr"], report.tasks
    top = mrr["mrr"].max()
    columns = [Column("scheme", "text"), *(Column(f"rank: {t}") for t in tasks)]
    columns += [Column("MRR", best="high", mark="mrr"), Column("n", "")]
    rows = []
    for _, row in mrr.iterrows():
        lab = info[row["label"]]
        cells = [Cell(lab.name, lab.name)]
        cells += [Cell("–" if pd.isna(row.get(t)) else f"{row[t]:.2g}", row.get(t)) for t in tasks]
        mark = "best" if row["mrr"] == top else ""
        cells += [Cell(f"{row['mrr']:.2f}", row["mrr"], mark), Cell(str(row["n"]))]
        rows.append(Row(cells, {"label": lab.name, "family": lab.family, "kind": lab.kind}))
    data = {"higher": True, "labels": mrr["label"].tolist(), "ties": {}}
    return table(columns, rows, "mrr") + "\n" + data_json("pairs-mrr", data)


def separating(report: Report) -> str:
    """Which tasks the MRR's differences come from: a task on which every scheme has the same
    mean rank (all tie, e.g. every scheme learned it) adds the same to every MRR."""
    mrr, tasks = report.tables["mrr"], report.tasks
    if len(mrr) < 2:
        return ""
    alike = {t: mrr[t].dropna().iloc[0] for t in tasks if mrr[t].dropna().nunique() == 1}
    differ = [t for t in tasks if t not in alike]
    if not alike:
        return f"Every task ranks the schemes differently: the MRR combines all {len(tasks)}."
    if not differ:
        return "Every scheme has the same rank on every task: the MRR does not separate them."
    same = " and ".join(
        f"{listing([t for t in alike if alike[t] == r])} (rank {r:g}"
        + (", a tie in every seed)" if r == 1 else " on average)")
        for r in dict.fromkeys(alike.values())
    )
    return (
        f"Every scheme has the same rank on {same}, so the differences in MRR come from "
        f"{listing(differ)} alone."
    )


def listing(names: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def factors(report: Report) -> list[tuple[str, str]]:
    """The length filter's choices: each multiple of the training length some task was scored
    at, with the length it is for each task (tasks train at different lengths)."""
    df, trained = report.frame, train_lengths(report.frame, report.tasks)
    at: dict[float, list[str]] = {}
    for task in report.tasks:
        for n in sorted(df.loc[df["task"] == task, "eval_len"].dropna().unique()):
            at.setdefault(n / trained[task], []).append(f"{task} {int(n)}")
    return [(f"{x:g}", f"{x:g}x ({', '.join(where)})") for x, where in sorted(at.items())]


def task_sections(
    report: Report, found: list[Board], info: dict[str, Label], src: Sources
) -> list[str]:
    """One section per task: what it is, whether it was learned, its two boards."""
    parts = []
    for task in report.tasks:
        doc = (TASKS[task].__doc__ or "").strip().split("\n\n")[0] if task in TASKS else task
        mine = [b for b in found if b.key in {f"{task}_{m}" for m in task_metrics(report, task)}]
        exact = next(b for b in mine if b.key == f"{task}_exact_match")
        body = [
            paragraph(" ".join(doc.split())),
            paragraph(learned_note(exact.stats, exact.train_len)),
        ]
        for board in mine:
            body += [
                f"<h3>{e(board.title)}</h3>",
                board_table(board, info, ""),
                src.links(board.csv),
            ]
        body.append(
            '<div class="panels">' + "".join(board_panels(b, info) for b in mine) + "</div>"
        )
        parts.append(section(f"task-{task}", task, *body))
    return parts


def summary(report: Report) -> str:
    df = report.frame
    runs = df.drop_duplicates("run_id")
    return (
        f"{count(len(runs), 'trained model')} ({', '.join(dict.fromkeys(runs['scheme']))}; seeds "
        f"{distinct(runs, 'seed')}) on {count(len(report.tasks), 'synthetic task')} "
        f"({', '.join(report.tasks)}), each trained on inputs up to its training length and "
        "scored on the same instances at every input length. Exact match: the share of "
        "instances whose every answer token (and end of answer, where it has one) is the top "
        "prediction; token accuracy: the share of answer tokens. Each task's headline metric "
        "is the one its paper reports (token accuracy for flip-flop's reads and associative "
        "recall's queries). Higher is better; cells are means over seeds [95% t-interval]."
    )
