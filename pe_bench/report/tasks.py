"""The report of synthetic-task runs (``pe_bench.data.tasks``): accuracy instead of perplexity.

``report.build_report`` hands it the records of a folder whose runs trained on tasks (mode
``task``); a folder that mixes them with perplexity records is refused, so one report never
puts accuracies and perplexities side by side. It writes::

    report.md                                  what was run, the tables, figures, provenance
    tables/<task>_{exact_match,token_acc}.*    mean over seeds and 95% CI per label x length
    tables/<task>_<metric>_pairwise.csv        paired differences of each metric
    tables/<task>_<metric>_ranks.*             ranks the seeds support
    tables/mrr.csv|md                          rank per task and mean reciprocal rank
    tables/cost.csv|md                         what each (task, label) costs
    tables/*.tex                               each table above as a LaTeX table
    figures/{exact_match,token_acc}_vs_length  one panel per task

Each task is its own protocol (its records are checked as one by ``aggregate.prepare``): the
tables of two tasks are never pooled, except in the mean reciprocal rank, which only ranks.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pandas as pd

from pe_bench.data.tasks import TASKS
from pe_bench.files import atomic_write_text
from pe_bench.records import TASK_MODE
from pe_bench.report import aggregate, cost, figures, latex, metrics
from pe_bench.report.best import legend, value_marks
from pe_bench.report.inputs import Options, Report, commands, report_lock
from pe_bench.report.markdown import count, distinct, shared_count, shared_value, write_csv
from pe_bench.report.metrics import spec
from pe_bench.report.ranking import (
    compare_markdown,
    compare_section,
    headlines,
    mrr_markdown,
    mrr_section,
    ranking_tables,
)
from pe_bench.report.sections import cpu_line, runs_markdown, trained_models, value_markdown
from pe_bench.report.significance import pairwise_tables, ranks_markdown
from pe_bench.report.styles import styles

LEARNED = 0.5  # mean exact match at the training length below which a task counts as not learned
MEANING = (
    "Each model was trained on one task, on instances of every input length up to the "
    "training length, with the loss on answer tokens only; it is scored on fixed evaluation "
    "instances (drawn from seeds no training run uses, the same for every scheme and seed) "
    "at each length. **Exact match** is the fraction of instances whose every answer token "
    "is the model's top prediction given the right answer so far{eos}. **Token "
    "accuracy** is the fraction of answer tokens predicted right given the right prefix. "
    "Each task's headline metric is the one its paper reports: exact match, and token "
    "accuracy for flip-flop (the share of reads right) and associative recall (of queries). "
    "Cells are means over seeds with a 95% t-interval (clipped to [0, 1])."
)

# Said only of reports with a task whose answer ends with EOS (``Task.ends_with_eos``).
EOS = (
    "; copy's, reverse's and "
    "addition's answers end with an end-of-sequence token that is scored too, so exact match "
    "equals exact match of greedy decoding to EOS (as McGill-NLP/length-generalization scores "
    "Kazemnejad et al.'s tasks): an answer that stops early or runs on fails"
)

CHANCE = {
    "flip_flop": " Chance is not 0: flip-flop's bits are right half the time by guessing.",
    "assoc_recall": (
        " Associative recall's token accuracy is 1/n by guessing among the n values in context."
    ),
}


def task_order(tasks: list[str]) -> list[str]:
    """Tasks in ``TASKS`` order, unknown ones after them alphabetically."""
    known = [t for t in TASKS if t in tasks]
    return known + sorted(t for t in tasks if t not in TASKS)


def build_task_report(
    root: Path, out: Path, records: pd.DataFrame, options: Options, echo: bool = True
) -> Report:
    """Tables, figures and report.md of the task records under ``root``, written to ``out``."""
    per_task = {
        task: aggregate.prepare(records[records["task"] == task], TASK_MODE, options.schemes)
        for task in task_order(list(records["task"].unique()))
    }
    df = pd.concat(per_task.values(), ignore_index=True)
    report = Report(out / "report.md", options, skipped=aggregate.skipped_evaluations(df))
    report.frame, report.records, report.tasks = df, records, list(per_task)
    for task, rows in per_task.items():
        for metric in [s.name for s in metrics.present(metrics.TASK, rows)]:
            stats = {metric: aggregate.seed_stats(rows, metric)}
            pairwise = pairwise_tables(rows, stats, metric)
            report.tables[f"{task}_{metric}"] = stats[metric]
            report.tables |= {f"{task}_{metric}_{kind}": t for kind, t in pairwise.items()}
    report.tables |= ranking_tables(df, list(per_task), options.compare)
    report.tables["cost"] = cost.cost_table(df)
    with report_lock(out):
        write_task_tables(out / "tables", report, list(per_task))
        report.latex = write_task_latex(out / "tables", report, list(per_task))
        report.figures = draw_task_figures(out / "figures", report, list(per_task), df)
        atomic_write_text(report.path, task_markdown(root, out, df, report, list(per_task)))
    if echo:
        for task in per_task:
            print(f"\n{task}: exact match (mean over seeds)")
            print(value_markdown(report.tables[f"{task}_exact_match"], "exact_match"))
    return report


def task_metrics(report: Report, task: str) -> list[str]:
    """The task metrics (``report.metrics``) of ``task``'s tables, in their registered order."""
    return [m for m in metrics.names(metrics.TASK) if f"{task}_{m}" in report.tables]


def write_task_tables(folder: Path, report: Report, tasks: list[str]) -> None:
    for task in tasks:
        for metric in task_metrics(report, task):
            name = f"{task}_{metric}"
            table, ranks = report.tables[name], report.tables[f"{name}_ranks"]
            write_csv(folder / f"{name}.csv", table)
            atomic_write_text(folder / f"{name}.md", value_markdown(table, metric) + "\n")
            write_csv(folder / f"{name}_pairwise.csv", report.tables[f"{name}_pairwise"])
            write_csv(folder / f"{name}_ranks.csv", ranks.rename_axis("label").reset_index())
            atomic_write_text(folder / f"{name}_ranks.md", ranks_markdown(ranks) + "\n")
    write_csv(folder / "mrr.csv", report.tables["mrr"])
    if "compare" in report.tables:
        write_csv(folder / "compare.csv", report.tables["compare"])
    atomic_write_text(folder / "mrr.md", mrr_markdown(report.tables["mrr"], tasks) + "\n")
    cost.write(folder, report.frame, report.tables["cost"])


def write_task_latex(folder: Path, report: Report, tasks: list[str]) -> list[Path]:
    """The LaTeX tables: each task's values (best bold, the ones the seeds do not separate
    from it underlined) and ranks, the mean reciprocal rank, the comparison and the cost."""
    written = []
    for task in tasks:
        for metric in task_metrics(report, task):
            name, higher, shown = f"{task}_{metric}", spec(metric).higher_is_better, spec(metric)
            table, ranks = report.tables[name], report.tables[f"{name}_ranks"]
            marks = value_marks(table, report.tables[f"{name}_pairwise"], higher_is_better=higher)
            title = f"{task}: {shown.title.lower()} by input length, mean over seeds [95% CI]."
            note = legend(marks, higher_is_better=higher)
            text, keyed = value_markdown(table, metric), latex.header_marks(marks)
            written.append(latex.write(folder, name, text, title, [note], keyed))
            flags = ranks.fillna(0).eq(1)
            ones = {
                (lab, str(n)): "best" for lab, r in flags.iterrows() for n, hit in r.items() if hit
            }
            title = f"{task}: rank by {spec(metric).title.lower()} that the seeds support."
            written.append(
                latex.write(
                    folder, f"{name}_ranks", ranks_markdown(ranks), title, ["Bold: rank 1."], ones
                )
            )
    mrr = report.tables["mrr"]
    top = mrr["mrr"].max()
    keyed = {(lab, "MRR"): "best" for lab in mrr.loc[mrr["mrr"] == top, "label"]}
    title = (
        "Mean rank per task and mean reciprocal rank (MRR) past the training length, each task "
        "ranked by its headline metric."
    )
    written.append(
        latex.write(
            folder, "mrr", mrr_markdown(mrr, tasks), title, ["Bold: the highest MRR."], keyed
        )
    )
    if "compare" in report.tables:
        table = report.tables["compare"]
        title = f"Mean reciprocal rank (rank), {table.attrs['cite']} and this run."
        written.append(latex.write(folder, "compare", compare_markdown(table), title))
    written.append(cost.write_latex(folder, report.frame, report.tables["cost"]))
    return written


def train_lengths(df: pd.DataFrame, tasks: list[str]) -> dict[str, int]:
    """Each task's training length (one per task: ``aggregate.prepare`` checks it)."""
    return {task: int(df.loc[df["task"] == task, "train_len"].iloc[0]) for task in tasks}


def draw_task_figures(
    folder: Path, report: Report, tasks: list[str], df: pd.DataFrame
) -> dict[str, Path]:
    train_len = train_lengths(df, tasks)
    style = styles(aggregate.label_order(df))
    drawn = {}
    with figures.theme():
        for metric in metrics.names(metrics.TASK):
            having = [t for t in tasks if metric in task_metrics(report, t)]
            stats = {t: report.tables[f"{t}_{metric}"] for t in having}
            if not stats:
                continue
            figure = figures.task_figure(stats, style, metric, train_len)
            drawn[metric] = figures.save(figure, folder, f"{metric}_vs_length")
    return drawn


def learned_note(stats: pd.DataFrame, train_len: int) -> str:
    """Which labels solve the task at the training length (mean exact match >= ``LEARNED``):
    past it, a label that never learned the task shows no extrapolation, only its absence."""
    at_train = stats[stats["eval_len"] == train_len].set_index("label")["mean"]
    missed = [lab for lab, value in at_train.items() if not value >= LEARNED]
    if not missed:
        return f"Every scheme learned the task: exact match >= {LEARNED} at the training length."
    return (
        f"Not learned at the training length (exact match < {LEARNED} at L = {train_len}): "
        f"{', '.join(missed)}; their numbers at longer lengths say nothing about extrapolation."
    )


def task_markdown(root: Path, out: Path, df: pd.DataFrame, report: Report, tasks: list[str]) -> str:
    """The text of report.md."""
    runs = trained_models(df)  # by scheme, then task in report order, then seed
    runs = runs.assign(nth=runs["task"].map(tasks.index)).sort_values(["order", "nth", "seed"])
    train_lens, grids = train_lengths(df, tasks), []
    for task, train_len in train_lens.items():
        lengths = sorted(df.loc[df["task"] == task, "eval_len"].dropna().astype(int).unique())
        grids.append(f"{task}: L = {train_len}, evaluated at {', '.join(map(str, lengths))}")
    summary = (
        f"{count(len(runs), 'trained model')} ({', '.join(dict.fromkeys(runs['scheme']))}; seeds "
        f"{distinct(runs, 'seed')}) on {count(len(tasks), 'synthetic task')}, "
        f"each trained on inputs of every length up to its training length L and evaluated on "
        f"{shared_count(df, 'tokens')} instances at each input length (in tokens; "
        f"{'; '.join(grids)})."
    )
    eos = EOS if any(TASKS[t].ends_with_eos for t in tasks if t in TASKS) else ""
    meaning = MEANING.format(eos=eos) + "".join(CHANCE[t] for t in tasks if t in CHANCE)
    lines = [f"# Synthetic task report: {root.resolve().name}", "", summary, "", meaning, ""]
    tied = [
        t
        for t in tasks
        if headlines(tasks)[t] == "exact_match"
        and unsolved_past(report.tables[f"{t}_exact_match"], train_lens[t])
    ]
    lines += mrr_section(report.tables["mrr"], tasks, tied)
    if "compare" in report.tables:
        seeds = df["seed"].nunique()
        lines += compare_section(report.tables["compare"], tasks, seeds)
    for task in tasks:
        lines += task_section(report, task, train_lens[task])
    lines += cost.section(df, report.tables["cost"])
    lines += ["## Figures", ""]
    for metric, path in report.figures.items():
        lines += [f"![{spec(metric).title} vs length]({os.path.relpath(path, out)})", ""]
    lines += ["## Runs", "", runs_markdown(runs), "", *provenance(df, tasks)]
    lines += reproduce(root, out, report.options)
    return "\n".join(lines)


def task_section(report: Report, task: str, train_len: int) -> list[str]:
    doc = (TASKS[task].__doc__ or "").strip().split("\n\n")[0] if task in TASKS else task
    exact, headline = report.tables[f"{task}_exact_match"], headlines([task])[task]
    lines = [f"## {task}", "", " ".join(doc.split()), "", learned_note(exact, train_len), ""]
    if unsolved_past(exact, train_len):
        lines += [
            "Past the training length no scheme solves a single instance (exact match 0 at "
            "every longer length, at every seed), so exact match cannot tell them apart there; "
            "token accuracy says how much of each answer a scheme still gets right.",
            "",
        ]
    for metric in sorted(task_metrics(report, task), key=lambda m: m != headline):
        name, title = f"{task}_{metric}", spec(metric).title
        title += " (headline: the metric its paper reports)" if metric == headline else ""
        lines += [f"{title}:", "", value_markdown(report.tables[name], metric), ""]
        pairs, ranks = report.tables[f"{name}_pairwise"], report.tables[f"{name}_ranks"]
        lines += ranks_lines(pairs, ranks, metric)
    return lines


def unsolved_past(exact: pd.DataFrame, train_len: int) -> bool:
    """No instance solved past the training length by any label at any seed (a mean of
    exact matches is 0 only when each of them is)."""
    past = exact[exact["eval_len"] > train_len]
    return len(past) > 0 and bool((past["mean"] == 0).all())


def ranks_lines(pairs: pd.DataFrame, ranks: pd.DataFrame, metric: str) -> list[str]:
    """Which differences of ``metric`` the seeds support, and the ranks they allow (none from
    one seed, where every rank would be 1)."""
    n = int(pairs["n"].max()) if len(pairs) else 0
    if n < 2:
        return ["One seed: no difference can be told from seed noise.", ""]
    title = spec(metric).title.lower()
    better = "higher" if spec(metric).higher_is_better else "lower"
    return [
        f"Rank by {title} = 1 + the schemes whose {title} is {better} and separated (95% "
        f"t-interval of the paired difference over {n} seeds excludes 0); "
        f"{int(pairs['separated'].sum())} of {len(pairs)} pairs are separated.",
        "",
        ranks_markdown(ranks),
        "",
    ]


def provenance(df: pd.DataFrame, tasks: list[str]) -> list[str]:
    shas = df.drop_duplicates("task").set_index("task")["corpus_sha"]
    dates = sorted(df["date"].dropna()) if "date" in df else []
    return [
        "## Provenance",
        "",
        f"- code: git {distinct(df, 'git_sha')}",
        "- tasks: " + ", ".join(f"`{t}` (sha256 {shas[t][:12]})" for t in tasks),
        f"- model: d_model {shared_value(df, 'd_model')}, {shared_value(df, 'num_layers')} "
        "layers; training steps per run: "
        + ", ".join(f"{t} {shared_value(df[df['task'] == t], 'train_steps')}" for t in tasks),
        f"- hardware: {distinct(df, 'hardware')}; torch {distinct(df, 'torch')}",
        *cpu_line(df),
        f"- records dated {dates[0]} to {dates[-1]}" if dates else "- records undated",
        "",
    ]


def reproduce(root: Path, out: Path, options: Options) -> list[str]:
    report_cmd = ["pe-bench-report", os.path.relpath(root, out)]
    if options.schemes:
        report_cmd += ["--schemes", *options.schemes]
    for name in options.compare:
        report_cmd += ["--compare", name]
    return [
        "## Reproduce",
        "",
        "```bash",
        *(commands(root) or ["# unknown: no multirun.yaml or .hydra/overrides.yaml"]),
        shlex.join(report_cmd) + "  # run in this report's folder",
        "```",
        "",
    ]
