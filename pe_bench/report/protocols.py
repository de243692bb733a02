"""Which of a run's records a published table is read against, and in what unit.

A table's ``setup.protocol`` names how the paper scored (``results/published/README.md``);
``PROTOCOL_MODES`` names the run's eval modes that measure the same thing, best first, and the
comparison reads the first the run has (``protocol_stats``), else the report's own mode with a
sentence saying they differ. A run's perplexity is per byte with the byte tokenizer, else per
token of its tokenizer (``perplexity_unit``), which the comparison says beside the paper's. The
truncate mode's loss by position (``truncate_positions``) is drawn whatever mode the tables hold.
"""

from __future__ import annotations

import pandas as pd

from pe_bench.data.tokenizer import BYTE
from pe_bench.report import aggregate, compare
from pe_bench.report.markdown import all_pretrained

# The run's eval modes that measure what a published protocol measures, best first: a table of
# documents truncated to the window (YaRN's) is met by the truncate mode, else by windows back
# to back (every position scored from a window's start, without a document's start); sliding
# windows over long documents (PI's) by sliding windows, else by the tail's.
PROTOCOL_MODES = {
    "truncate": ("truncate", "nonoverlap"),
    "nonoverlap": ("nonoverlap", "truncate"),
    "sliding": ("sliding", "tail"),
}


def protocol_mode(published: compare.Published, modes: list[str]) -> str | None:
    """The run's mode (of ``modes``) that matches the table's protocol; None: none does."""
    wanted = PROTOCOL_MODES.get(published.setup["protocol"], ())
    return next((mode for mode in wanted if mode in modes), None)


def as_rope(stats: pd.DataFrame, model: str) -> pd.DataFrame:
    """A pretrained RoPE model's labels as a published table names them: the model as
    pretrained is ``rope``, ``<model>+<variant>`` is ``rope+<variant>`` (an eval-time variant
    of a RoPE model, as the papers' rows without fine-tuning are)."""

    def rename(label: str) -> str:
        if label == model or label.startswith(model + "+"):
            return "rope" + label[len(model) :]
        return label

    return stats.assign(label=stats["label"].map(rename))


def protocol_stats(
    perplexity: pd.DataFrame, df: pd.DataFrame, stats: pd.DataFrame, schemes: tuple[str, ...]
):
    """``compare.compare_all``'s statistics for a table: the ppl seed statistics of the run's
    mode that matches the table's protocol (``stats`` of the report's records ``df`` when that
    is the report's mode, or none matches) and the records they are of; a pretrained model's
    labels as a RoPE model's (``as_rope``)."""
    modes = sorted(perplexity["mode"].unique())
    pretrained = all_pretrained(df)

    def of(table: compare.Published) -> tuple[pd.DataFrame, pd.DataFrame]:
        mode = protocol_mode(table, modes)
        same = mode is None or mode == df["mode"].iloc[0]
        frame = df if same else aggregate.prepare(perplexity, mode, schemes)
        ppl = stats if same else aggregate.seed_stats(frame, "ppl")
        return (as_rope(ppl, str(df["scheme"].iloc[0])) if pretrained else ppl), frame

    return of


def truncate_positions(
    rows: pd.DataFrame, perplexity: pd.DataFrame, schemes: tuple[str, ...]
) -> pd.DataFrame:
    """Loss by bucket of positions inside the window with its 95% t-interval over documents
    (``aggregate.position_intervals``) for the truncate mode's records of ``perplexity`` (the
    chosen ``schemes``), from the position ``rows`` beside them: the per-position view of the
    papers' protocol, drawn by the report and the site whatever mode their tables hold;
    empty without truncate records."""
    if "truncate" not in set(perplexity["mode"]):
        return aggregate.position_intervals(pd.DataFrame(), perplexity)
    return aggregate.position_intervals(rows, aggregate.prepare(perplexity, "truncate", schemes))


def perplexity_unit(df: pd.DataFrame) -> str:
    """What this run's perplexity is per: a byte (the byte tokenizer), else a token of its
    tokenizer (the model's own, for a pretrained model)."""
    names = sorted(set(df["tokenizer"].fillna(BYTE))) if "tokenizer" in df else [BYTE]
    if names == [BYTE]:
        return "perplexity per byte"
    return f"perplexity per token ({', '.join(f'`{name}`' for name in names)})"


def unit_note(df: pd.DataFrame) -> str:
    """How perplexities of two units relate, for this run's unit."""
    if perplexity_unit(df) == "perplexity per byte":
        return (
            "a ratio of perplexities per word or subword token is about the per-byte ratio to "
            "the power of the bytes per word or token"
        )
    return (
        "a ratio of perplexities per word or token is about this run's per-token ratio to the "
        "power of the paper's bytes per word or token over this run's bytes per token"
    )
