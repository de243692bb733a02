"""The ``data`` config, typed once: ``DataConfig.parse`` checks a composed ``data`` node (the
corpus keys of every source, and every task option, each typed by its task's constructor:
``data.tasks.Task.options``) and refuses what cannot load in one line, before any data is
read; ``run.config.RunConfig.data`` is its result, and every reader takes the typed fields."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pe_bench.config import Range, from_node
from pe_bench.data.tasks import build_task, check_task_options, task_options
from pe_bench.data.tokenizer import BYTE, check_spec
from pe_bench.errors import UserError

SPLITS = ("train", "valid", "test")
SOURCES = ("stdlib", "text", "hf", "task")
HF_SPLITS = {"train": "train", "valid": "validation", "test": "test"}  # data.splits default
SPLIT_MODES = ("auto", "document", "bytes")
TEXT_PATH = "a text file, or a folder of them (data.glob picks which)"  # data=text's data.path
FRACTION = Range(gt=0, lt=1)  # of the data in the valid or the test split: neither is empty


@dataclass
class DataConfig:
    """Every key a ``data`` config may have (conf/data/*.yaml; each source reads its own), with
    its type and range; a task's options are its constructor's (``task_options``)."""

    source: str = "stdlib"
    path: str | None = None  # text: a file or folder
    glob: str = "**/*.txt"  # text: which files of a folder
    split: str = "auto"  # stdlib, text: document, bytes or auto
    min_documents: Annotated[int, Range(ge=1)] = 20  # auto: documents if at least this many
    valid_frac: Annotated[float, FRACTION] = 0.05
    test_frac: Annotated[float, FRACTION] = 0.05
    name: str | None = None  # hf: the dataset
    config: str | None = None  # hf: its configuration
    data_files: Any = None  # hf: passed to datasets.load_dataset as it is
    kwargs: dict[str, Any] | None = None  # hf: more keyword arguments for load_dataset
    text_field: str = "text"  # hf: the column with the text
    splits: dict[str, Any] | None = None  # hf: our split -> the dataset's
    task: str | None = None  # task: a name in pe_bench.data.tasks.TASKS, e.g. flip_flop
    eval_instances: Annotated[int, Range(ge=1)] = 128  # task: instances scored per length
    tokenizer: str = BYTE  # byte, bpe or hf:<name or folder> (pe_bench.data.tokenizer)
    # bpe: symbols to train, > 256 (tokenizer.check_spec says why; byte and hf: have their own)
    vocab_size: int | None = None
    # task: every task option (data.<option>, e.g. data.alphabet), typed and defaulted by the
    # constructor of the task that has it; not a key of its own
    task_options: dict[str, Any] = field(default_factory=dict, init=False)

    @classmethod
    def parse(cls, cfg: Any) -> DataConfig:
        """``cfg`` (a ``data`` node) typed and checked, or a ``UserError`` saying what is wrong
        and what is allowed; no data is read (so a sweep stops before training, and configs
        of remote datasets can be checked offline)."""
        if not isinstance(cfg, Mapping):
            raise UserError(
                f"data={cfg!r} must be a data config; pick one with data=stdlib|text|hf|task"
            )
        source = cfg.get("source")
        if source not in SOURCES:
            raise UserError(f"unknown data.source {source!r}; allowed: {', '.join(SOURCES)}")
        missing = "???"  # OmegaConf's mandatory value that nobody set
        if source == "text" and cfg.get("path") in (None, "", missing):
            raise UserError("data=text needs data.path=<file or folder>")
        if source == "hf" and cfg.get("name") in (None, "", missing):
            raise UserError("data=hf needs data.name=<dataset>, e.g. Salesforce/wikitext")
        if source != "task":  # a task option is an unknown key here
            data = from_node(cls, cfg, "data")
        else:
            options = task_options()
            keys = {f.name for f in dataclasses.fields(cls) if f.init} | set(options)
            unknown = sorted(str(k) for k in cfg if k not in keys)
            if unknown:  # named here: from_node's list of keys lacks the task options
                raise UserError(
                    f"unknown key data.{unknown[0]}; allowed with data=task: "
                    f"{', '.join(sorted(keys))}"
                )
            data = from_node(cls, {k: v for k, v in cfg.items() if k not in options}, "data")
            data.task_options = check_task_options(cfg)
        data.check()
        return data

    def check(self) -> None:
        """What the fields' types cannot check alone."""
        check_spec(self.tokenizer, self.vocab_size)
        if self.source == "task":
            if self.tokenizer != BYTE:
                raise UserError(
                    f"data.tokenizer={self.tokenizer!r}: a synthetic task has its own symbols; "
                    f"allowed with data=task: {BYTE}"
                )
            build_task(self.task_config())  # an unknown task name is refused here
        if self.source == "text" and not Path(str(self.path)).expanduser().exists():
            raise UserError(f"data.path={self.path!r} does not exist; allowed: {TEXT_PATH}")
        if self.split not in SPLIT_MODES:
            raise UserError(f"data.split={self.split!r} is not one of {', '.join(SPLIT_MODES)}")
        if self.valid_frac + self.test_frac >= 1:
            raise UserError(
                f"data.valid_frac + data.test_frac must be < 1 (the rest is the train split), "
                f"got {self.valid_frac:g} + {self.test_frac:g}"
            )
        if self.source == "hf":
            names = self.splits or HF_SPLITS
            missing_splits = [split for split in SPLITS if not names.get(split)]
            if missing_splits:
                raise UserError(
                    f"data.splits lacks {', '.join(missing_splits)}: name the dataset's split "
                    f"for each of {', '.join(SPLITS)}, e.g. data.splits.valid=validation"
                )

    def task_config(self) -> dict[str, Any]:
        """The task and its options, as ``data.tasks.build_task`` and ``load_task`` take them."""
        return {"task": self.task, **self.task_options}

    def as_dict(self) -> dict[str, Any]:
        """The config as plain values (the task options as the keys they are in the config)."""
        values = dataclasses.asdict(self)
        return {**values, **values.pop("task_options")}
