"""Whether two runs' folders hold the same outputs, as the kill trials compare them
(``kill_anywhere.py``, ``kill_together.py``): every file equal but for what measures time,
memory, date or the host (``IGNORED`` record fields, the report's and cost table's
measured cells, checkpoints' ``elapsed``), and ``NOT_COMPARED`` files left out (a job's
``.done`` marker is compared by its presence: it names sweeps by random ids)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from pe_bench.files import read_jsonl
from pe_bench.run.store import DONE

# Record fields that measure time, memory, date or the host (and the code's version, which
# other engineers' edits may change between two runs): not results, never equal twice.
IGNORED = (
    "time_s",
    "train_time_s",
    "finetune_time_s",
    "peak_mem_mb",
    "date",
    "elapsed",
    "hardware",
    "git_sha",
)
# report.md shows those fields: in these lines and table columns (the runs table's times; the
# cost table's rates, memory and hardware, ``pe_bench.report.cost``).
MASKED_LINES = ("- code: git ", "- hardware: ", "- records dated ", "Measured on ")
MASKED_COLUMNS = ("train time (s)", "fine-tune time (s)", "train tok/s", "fine-tune tok/s")
MASKED_COLUMNS += ("peak eval MB",)
MEASURED_COLUMN = re.compile(r"eval \d+$")  # the cost table's evaluation rate at a length
# tables/cost.csv's columns computed from them
MEASURED_CSV = re.compile(r"(train_tokens|finetune_tokens|eval)_per_s|peak_mem_mb")
NOT_COMPARED = ("cli.log",)  # Hydra's job log: appended by every process that ran


def masked_report(text: str) -> list[str]:
    """report.md's lines with the values of ``IGNORED`` fields replaced by ``*``."""
    lines, columns = [], []
    for line in text.splitlines():
        if line.startswith(MASKED_LINES):  # the prefix kept: a date has colons too
            line = next(p for p in MASKED_LINES if line.startswith(p)) + "*"
        elif line.startswith("|"):
            cells = line.split("|")
            names = [c.strip() for c in cells]
            if any(n in MASKED_COLUMNS or MEASURED_COLUMN.match(n) for n in names):
                columns = [
                    i
                    for i, n in enumerate(names)
                    if n in MASKED_COLUMNS or MEASURED_COLUMN.match(n)
                ]
            elif not set(line) <= set("|:- "):
                line = "|".join("*" if i in columns else c for i, c in enumerate(cells))
        else:
            columns = []
        lines.append(line)
    return lines


def same_checkpoint(a: Path, b: Path) -> bool:
    """Equal training states: everything but ``elapsed`` (the wall time spent training)."""
    x, y = (torch.load(p, map_location="cpu", weights_only=True) for p in (a, b))
    return x.keys() == y.keys() and all(
        k == "elapsed" or equal(x[k], y[k]) for k in x if k != "elapsed"
    )


def equal(x: object, y: object) -> bool:
    """Deep equality of checkpoint contents, tensors bitwise."""
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(equal(x[k], y[k]) for k in x)
    if isinstance(x, list | tuple):
        return type(x) is type(y) and len(x) == len(y) and all(map(equal, x, y))
    return x == y


def same_file(rel: Path, ref: Path, got: Path, rename: tuple[str, str]) -> bool:
    """``got`` equal to ``ref`` as ``rel``'s kind of file is compared (module docstring)."""
    if rel.name == DONE:  # names the sweeps that ended the job: random ids, there or not
        return True
    if rel.name == "records.jsonl":
        strip = [{k: v for k, v in r.items() if k not in IGNORED} for r in read_jsonl(got)]
        return strip == [{k: v for k, v in r.items() if k not in IGNORED} for r in read_jsonl(ref)]
    if rel.suffix == ".pt":
        return same_checkpoint(ref, got)
    if rel.suffix in (".png", ".pdf", ".bin"):  # .bin: kill_together.py's padding
        return ref.read_bytes() == got.read_bytes()
    text = got.read_text().replace(*rename)
    if rel.name in ("report.md", "cost.md"):
        return masked_report(text) == masked_report(ref.read_text())
    if rel.name == "cost.csv":
        return masked_csv(text) == masked_csv(ref.read_text())
    if rel.name == "cost.tex":  # every number masked: the rates and memory among them
        return re.sub(r"\\num\{[^}]*\}", "*", text) == re.sub(
            r"\\num\{[^}]*\}", "*", ref.read_text()
        )
    return text == ref.read_text()


def masked_csv(text: str) -> list[list[str]]:
    """A CSV's rows with the values of ``MEASURED_CSV`` columns replaced by ``*``."""
    rows = [line.split(",") for line in text.splitlines()]
    masked = {i for i, name in enumerate(rows[0]) if MEASURED_CSV.match(name)} if rows else set()
    return [["*" if i in masked else c for i, c in enumerate(row)] for row in rows]


def compare_folders(ref: Path, got: Path, rename: tuple[str, str]) -> list[str]:
    """What differs between folder ``got`` and ``ref``, file by file (``same_file``), after
    ``rename`` in text files; ``NOT_COMPARED`` names are left out wherever they are."""
    files = {}
    for root in (ref, got):
        found = {p.relative_to(root) for p in root.rglob("*") if p.is_file()}
        files[root] = {p for p in found if p.name not in NOT_COMPARED}
    problems = [f"missing {p}" for p in sorted(files[ref] - files[got])]
    problems += [f"extra {p}" for p in sorted(files[got] - files[ref])]
    for rel in sorted(files[ref] & files[got]):
        if not same_file(rel, ref / rel, got / rel, rename):
            problems.append(f"{rel} differs")
    return problems
