"""What each scheme costs, read from its records beside what it scores: training throughput,
evaluation throughput at each length, the peak memory of evaluation, and the parameters of the
scheme itself.

Every number is a field the runs recorded, or a quotient of two:

- training tokens/s: ``train_tokens / train_time_s`` (the fit's wall clock, its validation-loss
  points and checkpoint writes included); a fine-tune's ``finetune_tokens / finetune_time_s``;
- evaluation rate at each length: ``tokens / time_s``, the targets scored per second of one
  length's evaluation (all its windows; all draws of a scheme with random positions; for a
  synthetic task, instances per second);
- peak memory: ``peak_mem_mb``, the most of any length (CPU: the process's peak resident set,
  reset before each length; CUDA: the allocator's peak);
- ``params`` and ``pe_params`` (the scheme's own).

Each cell is the median over the label's runs (seeds). A field no record carries is left out
and named as missing; nothing is estimated. Times are only comparable on one machine, so the
hardware the records name (``hardware``, ``device``, ``torch``) goes with the table.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pe_bench.files import atomic_write_text
from pe_bench.report import latex
from pe_bench.report.aggregate import label_order
from pe_bench.report.markdown import cpu_kinds, distinct, markdown_table, write_csv

# (column, header, record fields it needs, what the text calls it)
RUN_COSTS = (
    ("params", "params", ("params",), "model parameters (`params`)"),
    ("pe_params", "PE params", ("pe_params",), "the scheme's own parameters (`pe_params`)"),
    (
        "train_tokens_per_s",
        "train tok/s",
        ("train_tokens", "train_time_s"),
        "training time (`train_time_s`, `train_tokens`)",
    ),
    (
        "finetune_tokens_per_s",
        "fine-tune tok/s",
        ("finetune_tokens", "finetune_time_s"),
        "fine-tuning time (`finetune_time_s`, `finetune_tokens`)",
    ),
    ("peak_mem_mb", "peak eval MB", ("peak_mem_mb",), "peak memory (`peak_mem_mb`)"),
)
EVAL_PREFIX = "eval_per_s_"  # + the eval length: the evaluation rate's columns


def has(df: pd.DataFrame, fields: tuple[str, ...]) -> bool:
    """Whether some record of ``df`` carries every one of ``fields``."""
    return all(f in df for f in fields) and bool(df[list(fields)].notna().all(axis=1).any())


def per_run(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (label, run) of the ok records: the run's cost fields and its evaluation
    rate at each length."""
    ok = df[df["status"] == "ok"].dropna(subset=["eval_len"])
    # a task column no record here fills (RULER's, read beside perplexity) is not a key
    keys = [k for k in ("task", "label") if k in ok and ok[k].notna().any()]
    runs = ok.drop_duplicates([*keys, "run_id"])[[*keys, "run_id"]].set_index([*keys, "run_id"])
    first = ok.groupby([*keys, "run_id"]).first()
    for column, _, fields, _ in RUN_COSTS:
        if not has(ok, fields):
            continue
        if column.endswith("_per_s"):
            runs[column] = first[fields[0]] / first[fields[1]]
        elif column == "peak_mem_mb":
            runs[column] = ok.groupby([*keys, "run_id"])[column].max()
        else:
            runs[column] = first[column]
    if has(ok, ("tokens", "time_s")):
        rate = ok.assign(rate=ok["tokens"] / ok["time_s"].where(ok["time_s"] > 0))
        wide = rate.pivot_table(index=[*keys, "run_id"], columns="eval_len", values="rate")
        for length in sorted(wide.columns):
            runs[f"{EVAL_PREFIX}{int(length)}"] = wide[length]
    return runs.reset_index()


def cost_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per label (per task and label for synthetic tasks), in the order of ``df``'s labels:
    n (runs) and the median over runs of each cost ``per_run`` finds. Columns no record
    carries are absent."""
    runs = per_run(df)
    keys = [k for k in ("task", "label") if k in runs]
    if runs.empty:  # no ok record (every run diverged): nothing was measured
        return pd.DataFrame(columns=[*keys, "n"])
    values = [c for c in runs.columns if c not in (*keys, "run_id")]
    grouped = runs.groupby(keys)
    table = grouped[values].median().assign(n=grouped.size()).reset_index()
    order = {lab: i for i, lab in enumerate(label_order(df))}
    tasks = {task: i for i, task in enumerate(pd.unique(df["task"]))} if "task" in keys else {}
    rank = table["label"].map(order) + (table["task"].map(tasks) * len(order) if tasks else 0)
    table = table.assign(rank=rank).sort_values("rank", kind="stable")
    return table[[*keys, "n", *values]].reset_index(drop=True)


def missing(df: pd.DataFrame) -> list[str]:
    """What the records do not carry, as the text names it (the fine-tune's only where some
    model is fine-tuned)."""
    ok = df[df["status"] == "ok"]
    gaps = [name for column, _, fields, name in RUN_COSTS if not has(ok, fields)]
    if "finetune" not in ok or ok["finetune"].isna().all():
        gaps = [g for g in gaps if not g.startswith("fine-tuning")]
    if not has(ok, ("tokens", "time_s")):
        gaps.append("evaluation time (`time_s`)")
    return gaps


def rate(x: float) -> str:
    """A rate or a size as report text: thousands separated, 3 significant digits below 100."""
    if pd.isna(x):
        return "–"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def count(x: float) -> str:
    return "–" if pd.isna(x) else f"{int(x):,}"


def cost_markdown(table: pd.DataFrame) -> str:
    """The cost table: one row per label (and task), the costs the records carry."""
    keys = [k for k in ("task", "label") if k in table]
    header = (["task"] if "task" in keys else []) + ["scheme", "n"]
    columns = [(c, h) for c, h, _, _ in RUN_COSTS if c in table]
    evals = [c for c in table.columns if c.startswith(EVAL_PREFIX)]
    header += [h for _, h in columns] + [f"eval {c.removeprefix(EVAL_PREFIX)}" for c in evals]
    rows = []
    for _, row in table.iterrows():
        cells = [str(row[k]) for k in keys] + [str(row["n"])]
        cells += [count(row[c]) if "params" in c else rate(row[c]) for c, _ in columns]
        rows.append(cells + [rate(row[c]) for c in evals])
    align = "l" * len(keys) + "r" * (len(header) - len(keys))
    return markdown_table(header, rows, align)


def hardware(df: pd.DataFrame) -> str:
    """Where the records were made, as the text says it: the hardware's own parentheses
    (its CPU and threads) and then the device and torch, after commas."""
    ok = df[df["status"] == "ok"]
    device, torch = distinct(ok, "device"), distinct(ok, "torch")
    return f"{distinct(ok, 'hardware')}, device {device}, torch {torch}"


def cost_notes(df: pd.DataFrame, table: pd.DataFrame) -> list[str]:
    """The sentences under the table: units, hardware, what is missing, what a row shares."""
    task = "task" in table
    per = "instances per second of a synthetic task" if task else "scored tokens per second"
    notes = [
        f"Median over the n runs of each row. train tok/s: `train_tokens / train_time_s` (the "
        f"fit's wall clock, validation-loss points and checkpoints included); eval L: {per} "
        "at length L (`tokens / time_s`); peak eval MB: the most `peak_mem_mb` of any length "
        "(CPU: the process's peak resident set; CUDA: the allocator's peak); PE params: the "
        "scheme's own parameters.",
        f"Measured on {hardware(df)}: one wall-clock measurement per run and length, taken as "
        "the run ran, not a controlled benchmark (`experiments/bench_throughput.py` is one); "
        "compare times within one machine.",
    ]
    ok = df[df["status"] == "ok"]
    kinds = cpu_kinds(ok)  # '' for records that name no CPU: the notes read as they did
    if kinds:
        notes.append(f"CPU (ATen kernels): {kinds}.")
    machine_columns = [c for c in ("hardware", "cpu_model") if c in ok]
    machines = len(ok[machine_columns].drop_duplicates()) if machine_columns else 0
    if machines > 1:
        notes.append(
            f"The records come from {machines} machines (thread count and CPU model); a row's "
            "median mixes them where its runs ran on more than one."
        )
    gaps = missing(df)
    if gaps:
        notes.append(f"Not in the records, so not shown: {', '.join(gaps)}.")
    if "variant" in ok and (ok["variant"] != "none").any():
        notes.append(
            "An eval-time variant (`scheme+variant`) is scored on its scheme's checkpoint: "
            "its training and parameter columns are that checkpoint's."
        )
    if "position_draws" in ok and ok["position_draws"].notna().any():
        draws = ok.dropna(subset=["position_draws"]).drop_duplicates("label")
        which = ", ".join(f"{r.label} ({int(r.position_draws)})" for r in draws.itertuples())
        notes.append(f"The evaluation time covers every draw of random positions: {which}.")
    return notes


def section(df: pd.DataFrame, table: pd.DataFrame) -> list[str]:
    """The report's "Cost" section."""
    notes = cost_notes(df, table)
    return [
        "## Cost",
        "",
        "What each scheme costs, from the same records as its numbers above.",
        "",
        cost_markdown(table),
        "",
        "\n".join(f"{note}  " for note in notes).rstrip(),
        "",
    ]


CAPTION = "What each scheme costs: training and evaluation throughput, peak memory, parameters."


def write(folder: Path, df: pd.DataFrame, table: pd.DataFrame) -> None:
    """tables/cost.csv (full precision) and cost.md (the report's table and notes)."""
    write_csv(folder / "cost.csv", table)
    notes = "\n".join(cost_notes(df, table))
    atomic_write_text(folder / "cost.md", cost_markdown(table) + "\n\n" + notes + "\n")


def write_latex(folder: Path, df: pd.DataFrame, table: pd.DataFrame) -> Path:
    """tables/cost.tex: the table with its notes."""
    return latex.write(folder, "cost", cost_markdown(table), CAPTION, cost_notes(df, table))
