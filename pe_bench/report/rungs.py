"""The rungs of a scale ladder: which records form one, and each rung's statistics.

A folder whose records differ only in what a rung may change (``RUNG_FIELDS``: width, depth,
training length) and agree on everything else a report compares (corpus, eval tokens, steps,
training tokens) is a ladder; a rung is the group of records of one (width, depth, length).
Each rung is analysed exactly as a one-protocol report is (``aggregate``), so that the ladder
report (``ladder``) and the claims tested at each rung (``claims``) read the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from pe_bench.report import aggregate
from pe_bench.report.inputs import Options

RUNG_FIELDS = ("d_model", "num_layers", "train_len")  # what one rung may change
SHARED_FIELDS = tuple(f for f in aggregate.PROTOCOL if f not in RUNG_FIELDS)


@dataclass(frozen=True)
class Rung:
    """One cell of the ladder: a model size and a training length."""

    name: str  # the folder's ``rung=`` setting, else d<d_model>-l<layers>-L<train_len>
    d_model: int
    num_layers: int
    train_len: int
    params: int  # of the model without its scheme's own parameters (NoPE's count)


@dataclass
class RungResult:
    """One rung's records and the statistics every ladder table reads."""

    rung: Rung
    frame: pd.DataFrame  # aggregate.prepare's records of this rung
    nll: pd.DataFrame  # aggregate.seed_stats(..., "nll")
    pairs: pd.DataFrame  # aggregate.paired_differences(..., "nll"), every length
    scores: pd.DataFrame  # aggregate.extrapolation_scores
    score_pairs: pd.DataFrame  # aggregate.score_differences

    def factor_len(self, factor: float) -> int:
        return round(factor * self.rung.train_len)

    def per_seed(self) -> pd.DataFrame:
        """NLL by (label, seed) x eval length, ok records only."""
        ok = self.frame[self.frame["status"] == "ok"].dropna(subset=["nll", "eval_len"])
        return ok.pivot_table(index=["label", "seed"], columns="eval_len", values="nll")


def is_ladder(df: pd.DataFrame) -> bool:
    """Records of a rung sweep (every job folder names its ``rung=``) that vary in a rung field
    and agree on every other protocol field. Records whose L_train differs by accident are no
    ladder: their report fails, naming the field, as before."""
    if "folder" not in df or not df["folder"].map(rung_of).notna().all():
        return False
    varies = [f for f in RUNG_FIELDS if f in df and df[f].dropna().nunique() > 1]
    shared = all(df[f].dropna().nunique() <= 1 for f in SHARED_FIELDS if f in df)
    return bool(varies) and shared


def rung_of(folder: str) -> str | None:
    """The ``rung=`` override in a job folder's name, if any."""
    for part in folder.rsplit("/", 1)[-1].split(","):
        if part.startswith("rung="):
            return part.removeprefix("rung=")
    return None


def rung_name(folder: str, d_model: int, num_layers: int, train_len: int) -> str:
    """The ``rung=`` override in a job folder's name, or a name made of the rung's fields."""
    return rung_of(folder) or f"d{d_model}-l{num_layers}-L{train_len}"


def split_rungs(df: pd.DataFrame) -> list[tuple[Rung, pd.DataFrame]]:
    """The records of each rung, rungs ordered by training length, then parameters."""
    rungs = []
    for (d_model, layers, train_len), group in df.groupby(list(RUNG_FIELDS)):
        names = {rung_name(f, d_model, layers, train_len) for f in group["folder"].unique()}
        name = "/".join(sorted(names))
        trunk = int((group["params"] - group["pe_params"].fillna(0)).min())
        rung = Rung(name, int(d_model), int(layers), int(train_len), trunk)
        rungs.append((rung, group.drop(columns=["setting"], errors="ignore")))
    return sorted(rungs, key=lambda r: (r[0].train_len, r[0].params))


def analyse(rung: Rung, records: pd.DataFrame, options: Options) -> RungResult:
    """One rung's statistics, as a one-protocol report computes them."""
    df = aggregate.prepare(records, options.mode, options.schemes)
    return RungResult(
        rung=rung,
        frame=df,
        nll=aggregate.seed_stats(df, "nll"),
        pairs=aggregate.paired_differences(df, "nll"),
        scores=aggregate.extrapolation_scores(df),
        score_pairs=aggregate.score_differences(df),
    )
