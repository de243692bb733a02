"""What a report reads and holds: its options, the ``Report`` it builds, the checks a record
must pass to enter it, the records of the other files beside it, and the folder lock that keeps
two writers of one report apart."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from pe_bench.data.tokenizer import BYTE
from pe_bench.errors import UserError
from pe_bench.files import exclusive_lock, read_jsonl
from pe_bench.records import (
    COMMANDS,
    MODES,
    PASSKEY_MODE,
    PROBES,
    RECORDS,
    TASK_MODE,
    is_ruler,
    searchpath,
    sweep_command,
)
from pe_bench.report import compare, metrics, probes

# The fields every record needs for the report to place it (type names for the message); an ok
# record needs its numbers too. Records pe-bench writes always have them.
REQUIRED = {
    "run_id": (str,),
    "scheme": (str,),
    "variant": (str,),
    "seed": (int,),
    "train_len": (int,),
    "eval_len": (int,),
    "mode": (str,),
    "stride": (int,),
}


NUMBER = (int, float)
TASK_FIELDS = {"task": (str,)}  # besides REQUIRED, in a synthetic task's records


STATUSES = ("ok", "skipped", "diverged")


def record_problem(record: dict) -> str:
    """What keeps the report from using ``record`` ('' if nothing): a missing field, a field of
    the wrong type or an unknown status. Checked when loading, so the error names the file. An
    ok record needs its numbers: perplexity's, or a synthetic task's accuracies (a probe's
    are read by its own section)."""
    status = record.get("status") or "ok"
    if status not in STATUSES:
        return f"status {status!r} is not one of {', '.join(STATUSES)}"
    task = record.get("mode") == TASK_MODE
    needed = {**REQUIRED, **(TASK_FIELDS if task else {})}
    optional = {}
    retrieval = record.get("mode") in (*PROBES, PASSKEY_MODE) or is_ruler(record.get("mode"))
    if status == "ok" and not retrieval:
        specs = metrics.of_kind(metrics.TASK if task else metrics.LM)
        needed |= {s.name: NUMBER for s in specs if s.required}
        optional = {s.name: NUMBER for s in specs if not s.required}
    for name, types in {**needed, **optional}.items():
        value = record.get(name)
        if value is None and name in optional:
            continue
        if value is None:
            return f"record lacks {name!r} (the report needs {', '.join(needed)})"
        if not isinstance(value, types) or isinstance(value, bool):
            kind = " or ".join(t.__name__ for t in types)
            return f"record field {name!r} is {value!r}; expected {kind}"
    return ""


@dataclass(frozen=True)
class Options:
    """What a report shows. None: chosen from the records (``resolve``)."""

    metric: str = "ppl"  # of the figures and the ratio table: a metric of report.metrics
    mode: str | None = None  # eval mode: nonoverlap when present
    baseline: int | None = None  # ratio denominator length: the training length
    schemes: tuple[str, ...] = ()  # schemes or labels (rope+ntk) to keep; empty: all
    # published tables, e.g. ("published/alibi_paper",); a name or a list (a config's
    # ``compare:``) is read as the tuple of its names (``compare_names``)
    compare: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "compare", compare_names(self.compare))

    def resolve(self, df: pd.DataFrame) -> Options:
        """These options with the choices left to the records made: the mode of ``df`` (one
        mode, from ``aggregate.prepare``) and its training length as the baseline."""
        return Options(
            metric=self.metric,
            mode=str(df["mode"].iloc[0]),
            baseline=self.baseline or training_length(df),
            schemes=tuple(self.schemes),
            compare=self.compare,
        )

    def command(self, records: str) -> str:
        """The ``pe-bench-report`` command line that makes this report from ``records``."""
        args = ["pe-bench-report", records, "--metric", self.metric, "--mode", str(self.mode)]
        args += ["--baseline", str(self.baseline)]
        if self.schemes:
            args += ["--schemes", *self.schemes]
        for name in self.compare:
            args += ["--compare", name]
        return shlex.join(args)


def compare_names(value: object) -> tuple[str, ...]:
    """The published tables a report compares with, from ``--compare`` (repeatable) or a
    config's ``compare:``: none (None, ""), one name, or a list of names; each name once, in
    the order given."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return (value,)
    if OmegaConf.is_list(value):
        value = OmegaConf.to_container(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) and v for v in value):
        return tuple(dict.fromkeys(value))
    raise UserError(
        f"compare={value!r} must name a published table or list them, e.g. "
        "published/yarn_paper or [published/yarn_paper, published/pi_paper]"
    )


@dataclass
class Report:
    """What ``build_report`` wrote: tables by name, the PNG of each figure, the LaTeX tables,
    and the records behind them (for ``pe-bench-report --site``)."""

    path: Path  # report.md
    options: Options
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: dict[str, Path] = field(default_factory=dict)
    comparisons: list[compare.Comparison] = field(default_factory=list)  # one per table
    skipped: pd.DataFrame = field(default_factory=pd.DataFrame)  # skipped_evaluations rows
    context: probes.ContextUse | None = None  # the context-use probes' section
    passkey: list[str] = field(default_factory=list)  # the passkey section's markdown lines
    ruler: list[str] = field(default_factory=list)  # the RULER section's markdown lines
    rope_base: list[str] = field(default_factory=list)  # a sweep over RoPE's base: its section
    tokenizers: str = ""  # what the report says when the records mix tokenizers
    frame: pd.DataFrame = field(default_factory=pd.DataFrame)  # the records the tables hold
    records: pd.DataFrame = field(default_factory=pd.DataFrame)  # every checked record
    latex: list[Path] = field(default_factory=list)  # the tables/*.tex it wrote
    tasks: list[str] = field(default_factory=list)  # a synthetic-task report's tasks
    # the truncate mode's loss by position with intervals (protocols.truncate_positions)
    positions: pd.DataFrame = field(default_factory=pd.DataFrame)

    def where(self, root: Path, site: Path | None = None) -> str:
        """Where the report's files are, absolute (a run's last lines), and the command that
        makes a site of the records under ``root`` (or the ``site`` written)."""
        folder = self.path.parent.resolve()
        names = ", ".join(self.figure_names())
        lines = [
            f"report: {self.path.resolve()}",
            f"figures: {folder / 'figures'} ({names}; PNG and PDF)",
            f"tables: {folder / 'tables'} (Markdown, CSV and LaTeX)",
            f"site: {site.resolve() / 'index.html'}"
            if site
            else f"site: pe-bench-report {shlex.quote(str(Path(root).resolve()))} --site "
            f"{shlex.quote(str(folder / 'site'))} writes it",
        ]
        return "\n".join(lines if names else [lines[0], *lines[2:]])

    def figure_names(self) -> list[str]:
        """Every figure the report drew: its own, the probes' and those its passkey, RULER and
        RoPE-base sections embed (a SmolLM2 report's passkey heatmap was left unnamed)."""
        drawn = [*self.figures.values(), *(self.context.figures.values() if self.context else [])]
        embedded = "\n".join([*self.passkey, *self.ruler, *self.rope_base])
        found = re.findall(r"\]\(figures/([^)/]+)\.png\)", embedded)
        return sorted({path.stem for path in drawn} | set(found))


def load_rows(root: Path, name: str) -> pd.DataFrame:
    """Every row of every ``name`` JSON-lines file under ``root``, in sorted file order."""
    return pd.DataFrame([row for path in sorted(root.rglob(name)) for row in read_jsonl(path)])


def training_length(df: pd.DataFrame) -> int:
    """The training length of the records (one protocol: the same in every record)."""
    return int(df["train_len"].dropna().iloc[0])


def tokenizer_names(df: pd.DataFrame) -> pd.Series:
    """Each record's tokenizer as report text, e.g. ``bpe (4,096 ids, sha 1a2b3c4d)``; records
    that name none were made with bytes."""
    if "tokenizer" not in df:
        return pd.Series(BYTE, index=df.index)
    vocab = df["tokenizer_vocab"].map(lambda v: "" if pd.isna(v) else f" ({int(v):,} ids, sha ")
    sha = df["tokenizer_sha"].map(lambda v: "" if pd.isna(v) else f"{v[:8]})")
    name = df["tokenizer"].fillna(BYTE)
    return name.where(name == BYTE, name + vocab + sha)


def mixed_tokenizers(df: pd.DataFrame, options: Options) -> str:
    """'' when the records share a tokenizer; else what the report says about mixing them.
    Perplexity and NLL are per token, so no table of them may hold two tokenizers: mixed
    records are refused unless the report is of bits per byte (each target's own bytes)."""
    names = tokenizer_names(df)
    if names.nunique() < 2:
        return ""
    labels = df.groupby(names)["label"].unique()
    found = "; ".join(f"{tok}: {', '.join(sorted(labs))}" for tok, labs in labels.items())
    if metrics.spec(options.metric).per_token or options.compare:
        raise UserError(
            f"records mix tokenizers ({found}); perplexity and NLL are per token, so one table "
            "cannot hold two tokenizers: report each tokenizer's runs separately (their "
            "folders, or --schemes), or compare bits per byte with --metric bpb"
        )
    return (
        f"The records mix tokenizers ({found}). Bits per byte compares them: each scored "
        "target counts its own UTF-8 bytes. Perplexity and NLL are per token of each "
        "tokenizer, so their tables are left out, and the extrapolation score is in nats per "
        "byte. Lengths are in tokens of each run's tokenizer."
    )


def check_one_kind(root: Path, records: pd.DataFrame) -> None:
    """Refuse a folder that holds both synthetic-task records and perplexity records: one
    report never puts accuracies beside perplexities."""
    text = records[records["mode"].isin(MODES)]
    if len(text):
        tasks = records.loc[records["mode"] == TASK_MODE, "folder"].iloc[0]
        raise UserError(
            f"{root} mixes synthetic-task records (e.g. {tasks}) with perplexity records (e.g. "
            f"{text['folder'].iloc[0]}); report each kind from its own folder"
        )


# The temporary files of a report's writes (``atomic_write``) that a killed report leaves.
STRAYS = (".report.md.*.tmp", "tables/.*.tmp", "figures/.*.tmp")


_HELD: set[Path] = set()  # report folders this process holds (``report_lock`` re-entered)


@contextlib.contextmanager
def report_lock(out: Path, wait: bool = False) -> Iterator[None]:
    """Hold ``out`` while a report writes into it: a second report at once is refused in one
    line, or with ``wait`` (a sweep's report, whose records another sweep into the same folder
    may be reporting too) waits for the first to end; the kernel releases the lock if the
    holder dies. Holding it, the temporary files a killed report left behind are removed,
    since nobody else is writing them. A holder may take it again (a sweep holds it around
    the report it builds)."""
    out.mkdir(parents=True, exist_ok=True)
    held = out.resolve()
    if held in _HELD:
        yield
        return

    def busy() -> None:
        if not wait:
            raise UserError(
                f"{out} is being written by another report; wait for it to end"
            ) from None

    with exclusive_lock(out, busy):  # a lock on the folder itself: no lock file to leave
        for pattern in STRAYS:
            for stray in out.glob(pattern):
                stray.unlink(missing_ok=True)
        _HELD.add(held)
        try:
            yield
        finally:
            _HELD.discard(held)


def commands(root: Path) -> list[str]:
    """The ``pe-bench`` command of every sweep (``commands.txt``, else multirun.yaml, which holds
    only the last sweep's) or single run (.hydra/overrides.yaml) that wrote records under
    ``root``."""
    found: list[str] = []
    for path in sorted(root.rglob(RECORDS)):
        run = path.parent
        inside = [run, *(p for p in run.parents if p == root or root in p.parents)]
        sweep = next((p for p in inside if (p / "multirun.yaml").exists()), None)
        if sweep is not None and (sweep / COMMANDS).exists():
            lines = (sweep / COMMANDS).read_text().splitlines()
        elif sweep is not None:
            given = OmegaConf.load(sweep / "multirun.yaml").hydra.overrides
            lines = [sweep_command([*searchpath(given.get("hydra", [])), *given.task])]
        elif (run / ".hydra" / "overrides.yaml").exists():
            lines = [shlex.join(["pe-bench", *OmegaConf.load(run / ".hydra" / "overrides.yaml")])]
        else:
            lines = []
        found += [line for line in lines if line not in found]
    return found


def check_output_folder(option: str, folder: str | Path) -> None:
    """Refuse a folder that ``option`` (``--out``, ``--latex``, ``--site``) names where nothing
    can be written (a file, a file on its path, a read-only folder), naming the option, before
    the report writes anything; nothing is made here."""
    path = Path(folder).expanduser()
    found = path
    while not found.exists() and found != found.parent:
        found = found.parent
    if not found.is_dir():
        where = "is a file" if found == path else f"cannot be made: {found} is a file"
        raise UserError(f"{option} {str(folder)!r} {where}; allowed: a folder, new or existing")
    if not os.access(found, os.W_OK | os.X_OK):
        raise UserError(
            f"{option} {str(folder)!r}: {found} cannot be written to; allowed: a folder you "
            "can write to"
        )
