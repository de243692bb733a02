"""The sections of report.md, each a function from the aggregated tables to markdown lines:
summary, tables, caveats, figures, diverged and skipped runs, provenance, how to reproduce and
the runs table (the comparison with a published table: ``report.comparison``)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from pe_bench.data.tokenizer import BYTE
from pe_bench.records import TAIL_MODE
from pe_bench.report import aggregate
from pe_bench.report.inputs import (
    Options,
    Report,
    commands,
    tokenizer_names,
    training_length,
)
from pe_bench.report.markdown import (
    SKIPPED,
    SKIPPED_NOTE,
    all_pretrained,
    caption,
    count,
    cpu_kinds,
    distinct,
    format_value,
    markdown_table,
    one_cell,
    replicate,
    shared_count,
    shared_value,
    typical_n,
)
from pe_bench.report.metrics import spec
from pe_bench.report.significance import pairwise_markdown


def value_markdown(stats: pd.DataFrame, metric: str, skipped: pd.DataFrame | None = None) -> str:
    """Label x eval length table of ``mean [low, high]`` cells (``seed_stats`` rows); a cell
    with a skipped evaluation (``skipped_evaluations`` rows) is marked ‡."""
    fmt = spec(metric).fmt
    n = typical_n(stats)
    lengths = [str(length) for length in sorted(stats["eval_len"].unique())]
    marked = skipped_cells(skipped)
    rows = []
    for lab, cells in stats.groupby("label", sort=False):
        row = [lab + (" †" if cells["diverged"].iloc[0] else "")]
        for cell in cells.itertuples():
            mark = f" {SKIPPED}" if (lab, cell.eval_len) in marked else ""
            if cell.n == 0:
                row.append(("diverged" if cell.diverged else "–") + mark)
                continue
            text = fmt.format(cell.mean)
            if cell.n > 1:
                text += f" [{fmt.format(cell.ci_low)}, {fmt.format(cell.ci_high)}]"
            row.append(text + (f" (n={cell.n})" if cell.n != n else "") + mark)
        rows.append(row)
    return markdown_table(["scheme", *lengths], rows, "l" + "r" * len(lengths))


def skipped_cells(skipped: pd.DataFrame | None) -> set[tuple[str, int]]:
    """The (label, eval length) cells with a skipped evaluation."""
    if skipped is None or skipped.empty:
        return set()
    return set(zip(skipped["label"], skipped["eval_len"].astype(int), strict=True))


def ratio_markdown(ratio: pd.DataFrame, skipped: pd.DataFrame | None = None) -> str:
    """The ratio table; a missing ratio whose cell was skipped is marked ‡."""
    marked = skipped_cells(skipped)

    def cell(lab: str, length: int, x: float) -> str:
        if not pd.isna(x):
            return f"{x:.3f}"
        return "–" + (f" {SKIPPED}" if (lab, length) in marked else "")

    rows = [
        [lab, *(cell(lab, length, x) for length, x in values.items())]
        for lab, values in ratio.iterrows()
    ]
    return markdown_table(["scheme", *map(str, ratio.columns)], rows, "l" + "r" * ratio.shape[1])


def score_markdown(scores: pd.DataFrame) -> str:
    """The scores best first; a rank that labels share is marked ``=`` (``=2``: tied for 2)."""
    fmt = f"{{:.{aggregate.SCORE_DIGITS}f}}"
    shared = scores["rank"].value_counts()
    rows = []
    for s in scores.sort_values("rank", kind="stable", na_position="last").itertuples():
        ci = f"[{fmt.format(s.ci_low)}, {fmt.format(s.ci_high)}]" if s.n > 1 else "–"
        score = "–" if pd.isna(s.score) else fmt.format(s.score)
        rank = "–" if pd.isna(s.rank) else ("=" if shared[s.rank] > 1 else "") + str(s.rank)
        rows.append([rank, s.label, score, ci, str(s.n)])
    return markdown_table(["rank", "scheme", "score", "95% CI", "n"], rows, "rlrrr")


def diverged_note(diverged: pd.DataFrame) -> str:
    """One line naming every diverged run, for figure footnotes ('' when none)."""
    runs = [
        f"{d.label} seed {d.seed} at step {format_value(d.diverged_step)}"
        for d in diverged.itertuples()
    ]
    return ("diverged runs, left out: " + "; ".join(runs)) if runs else ""


def trained_models(df: pd.DataFrame) -> pd.DataFrame:
    """One record per run (per-run fields are the same in every record of a run), in the
    canonical order of their scheme and fine-tune, then by seed."""
    runs = df.drop_duplicates("run_id")
    order = [
        aggregate.order_key(scheme, "none", tuned)
        for scheme, tuned in zip(runs["scheme"], aggregate.finetunes(runs), strict=True)
    ]
    return runs.assign(order=order).sort_values(["order", "seed"])


def summary_markdown(
    df: pd.DataFrame, runs: pd.DataFrame, opts: Options, stats: pd.DataFrame
) -> str:
    """The report's opening paragraph: the models, the training and the evaluation."""
    lengths = ", ".join(str(n) for n in sorted(stats["eval_len"].unique()))
    if all_pretrained(runs):  # model=hf: pe_bench.pretrained.hf
        return (
            f"Pretrained {', '.join(dict.fromkeys(runs['model']))} (context L = "
            f"{training_length(df)} tokens), not trained here, evaluated on `"
            f"{shared_value(df, 'corpus')}` with {windows_phrase(opts.mode, lengths, df)} on "
            f"{count(len(runs), 'disjoint test slice')} of {shared_count(df, 'tokens')} tokens "
            "each (the tables' intervals are over these slices). A label "
            "`model+variant` is an eval-time RoPE variant applied to the pretrained model."
        ) + weights_markdown(df)
    return (
        f"{count(len(runs), 'trained model')} ({', '.join(dict.fromkeys(runs['scheme']))}; seeds "
        f"{distinct(runs, 'seed')}), trained at L = {training_length(df)} tokens on "
        f"`{shared_value(df, 'corpus')}` and evaluated with {opts.mode} windows of {lengths} "
        f"tokens on the same {shared_count(df, 'tokens')} test tokens at every length. A label "
        "`scheme+variant` is an eval-time variant applied to the trained `scheme` checkpoint."
    )


def windows_phrase(mode: str, lengths: str, df: pd.DataFrame) -> str:
    """How the windows score their targets, e.g. ``nonoverlap windows of 256, 512 tokens``."""
    if mode == TAIL_MODE:
        return (
            f"windows of {lengths} tokens that end at the scored tokens, each scoring its last "
            f"{shared_value(df, 'stride')} (`tail` mode: the context before them is the corpus's)"
        )
    return f"{mode} windows of {lengths} tokens"


def weights_markdown(df: pd.DataFrame) -> str:
    """A GGUF model's weights: its file, sha256 and quantization, and the caveat its records
    carry ('' for other models)."""
    if "weights_file" not in df or df["weights_file"].isna().all():
        return ""
    first = df.dropna(subset=["weights_file"]).iloc[0]
    return (
        f" Weights: `{first['weights_file']}`, sha256 `{first['weights_sha256']}`, "
        f"{first['quantization']}. Caveat: {first['weights_caveat']}."
    )


def tables_markdown(df: pd.DataFrame, report: Report) -> list[str]:
    """The sections of the value table (the chosen metric), the ratio table and the scores."""
    opts = report.options
    stats = report.tables[opts.metric]
    title = spec(opts.metric).title
    how = caption(stats, opts.metric, df)
    grid = ", ".join(str(n) for n in aggregate.score_grid(df))
    score_unit = "log-perplexity (NLL, nats/token)"
    if report.tokenizers:  # the score of mixed tokenizers: see ``mixed_tokenizers``
        score_unit = "NLL per byte (nats/byte: bits per byte x ln 2)"
    note = [f"{SKIPPED_NOTE} below.", ""] if len(report.skipped) else []
    unit = replicate(df).name
    return [
        f"## {title} by evaluation length",
        "",
        how[0].upper() + how[1:] + ".",
        "",
        value_markdown(stats, opts.metric, report.skipped),
        "",
        *note,
        *caveats_markdown(df),
        f"## Ratio to L = {opts.baseline}",
        "",
        f"{title} at each length divided by the same scheme's value at L = {opts.baseline}.",
        "",
        ratio_markdown(report.tables["ratio"], report.skipped),
        "",
        *note,
        "## Extrapolation score",
        "",
        f"Mean {score_unit} over the eval lengths {grid} per run, then the mean over "
        f"{unit}s; lower is better, best first. Scores equal to the digits shown share a rank "
        f"(marked =); which differences the {unit}s support is in the next section.",
        "",
        score_markdown(report.tables["score"]),
        "",
        *pairwise_markdown(report),
    ]


def caveats_markdown(df: pd.DataFrame) -> list[str]:
    """One line per scheme whose protocol departs from its paper's, under the value table."""
    noted = aggregate.caveats(df)
    if not noted:
        return []
    lines = [f"Caveat, {lab}: {text}." for lab, text in noted.items()]
    return ["\n".join(f"{line}  " for line in lines).rstrip(), ""]


def figures_markdown(report: Report, out: Path) -> list[str]:
    """The figures section: each PNG with its caption and a link to its PDF."""
    title = spec(report.options.metric).title
    captions = {
        "length": f"{title} vs evaluation length",
        "ratio": f"{title} relative to L = {report.options.baseline}",
        "positions": "Loss by position inside the window",
        "truncate": "Loss by position in documents truncated to the window (papers' protocol)",
        "curves": "Training curves",
    }
    lines = ["## Figures", ""]
    for key, png in report.figures.items():
        rel = png.relative_to(out).as_posix()
        pdf = rel.removesuffix(".png") + ".pdf"
        lines += [f"![{captions[key]}]({rel})", "", f"{captions[key]} ([PDF]({pdf})).", ""]
    return lines


def diverged_markdown(diverged: pd.DataFrame) -> list[str]:
    """The diverged-runs section; none when no run diverged."""
    if diverged.empty:
        return []
    rows = [
        [d.label, format_value(d.seed), d.run_id, format_value(d.diverged_step)]
        for d in diverged.itertuples()
    ]
    return [
        "## Diverged runs",
        "",
        "† in a table marks a scheme with diverged runs: they have no numbers and are left "
        "out of its means, CIs and score.",
        "",
        markdown_table(["scheme", "seed", "run id", "diverged at step"], rows, "lrlr"),
        "",
    ]


def skipped_markdown(skipped: pd.DataFrame) -> list[str]:
    """The skipped-evaluations section, with each reason; none when nothing was skipped."""
    if skipped.empty:
        return []
    rows = [
        [s.label, format_value(s.seed), s.run_id, format_value(s.eval_len), one_cell(s.reason)]
        for s in skipped.itertuples()
    ]
    return [
        "## Skipped evaluations",
        "",
        f"{SKIPPED} in a table marks a cell with a skipped evaluation: it has no number, and "
        "the extrapolation score averages over the lengths every scheme has numbers at.",
        "",
        markdown_table(["scheme", "seed", "run id", "eval length", "reason"], rows, "lrlrl"),
        "",
    ]


def provenance_markdown(df: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """The provenance section: code, corpus, model, training, hardware and dates."""
    params = sorted(int(p) for p in runs["params"].dropna()) if "params" in runs else []
    dates = sorted(df["date"].dropna()) if "date" in df else []
    return [
        "## Provenance",
        "",
        f"- code: git {distinct(df, 'git_sha')}",
        f"- corpus: `{shared_value(df, 'corpus')}`, sha256 {shared_value(df, 'corpus_sha')}",
        *tokenizer_line(df),
        f"- model: d_model {shared_value(df, 'd_model')}, {shared_value(df, 'num_layers')} "
        "layers, "
        + (f"{params[0]:,} to {params[-1]:,} parameters" if params else "parameters unknown"),
        f"- training: {shared_value(df, 'train_steps')} steps, "
        f"{shared_count(df, 'train_tokens')} tokens at L = {training_length(df)} per run",
        *weights_line(df),
        f"- hardware: {distinct(df, 'hardware')}; device {distinct(df, 'device')}; "
        f"torch {distinct(df, 'torch')}",
        *cpu_line(df),
        f"- records dated {dates[0]} to {dates[-1]}" if dates else "- records undated",
        "- config hash: the suffix of each run id",
        "",
    ]


def cpu_line(df: pd.DataFrame) -> list[str]:
    """The provenance line naming the CPU model and ATen's CPU kernels, where records carry
    them (none otherwise: a report of older records reads as it did)."""
    kinds = cpu_kinds(df)
    return [f"- CPU (ATen kernels): {kinds}"] if kinds else []


def weights_line(df: pd.DataFrame) -> list[str]:
    """The provenance line of GGUF weights (none for other models)."""
    if "weights_file" not in df or df["weights_file"].isna().all():
        return []
    first = df.dropna(subset=["weights_file"]).iloc[0]
    return [f"- weights: `{first['weights_file']}`, sha256 {first['weights_sha256']}"]


def tokenizer_line(df: pd.DataFrame) -> list[str]:
    """The provenance line naming the tokenizers, when any is not bytes (none otherwise)."""
    names = sorted(set(tokenizer_names(df)))
    return [f"- tokenizer: {'; '.join(names)}"] if names != [BYTE] else []


def reproduce_markdown(root: Path, out: Path, opts: Options) -> list[str]:
    """The commands that made the records under ``root``, then the report in ``out``."""
    return [
        "## Reproduce",
        "",
        "Train and evaluate (writes the records), then make this report from them:",
        "",
        "```bash",
        *(
            commands(root)
            or ["# unknown: no multirun.yaml or .hydra/overrides.yaml by the records"]
        ),
        opts.command(os.path.relpath(root, out)) + "  # run in this report's folder",
        "```",
        "",
    ]


# (header, record field, format) of the runs table; fields a record lacks are left out.
RUN_COLUMNS = (
    ("scheme", "scheme", "{}"),
    ("task", "task", "{}"),
    ("fine-tune", "finetune", "{}"),
    ("seed", "seed", "{}"),
    ("run id", "run_id", "{}"),
    ("params", "params", "{:,}"),
    ("PE params", "pe_params", "{:,}"),
    ("final val loss", "final_val_loss", "{:.4f}"),
    ("train time (s)", "train_time_s", "{:.0f}"),
    ("fine-tune val loss", "finetune_final_val_loss", "{:.4f}"),
    ("status", "status", "{}"),
)


def runs_markdown(runs: pd.DataFrame) -> str:
    """One row per trained model."""
    columns = [(header, key, fmt) for header, key, fmt in RUN_COLUMNS if key in runs]
    rows = [
        ["–" if pd.isna(run[key]) else fmt.format(run[key]) for _, key, fmt in columns]
        for _, run in runs.iterrows()
    ]
    left = ("scheme", "task", "finetune", "run_id", "status")
    align = "".join("l" if key in left else "r" for _, key, _ in columns)
    return markdown_table([header for header, _, _ in columns], rows, align)
