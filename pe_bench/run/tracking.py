"""Optional experiment tracking with Weights & Biases: ``pe-bench logger=wandb``.

Off by default (``logger: none``): then ``start`` returns a ``Tracker`` whose methods do
nothing, and wandb is never imported. With ``logger=wandb`` each training job is a wandb run
(config, training curve, its records as a table) and a report is one more run in the same group
(tables and figures). The mode defaults to offline, so no account and no network are needed;
``wandb sync`` uploads offline runs later. The mode is decided before ``wandb.init`` (an online
init without network waits a long time).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from pe_bench.config import from_node, to_dict
from pe_bench.errors import UserError
from pe_bench.records import PROBES

WANDB_MODES = ("offline", "online", "disabled")


@dataclass
class WandbConfig:
    name: str = "wandb"
    project: str = "pe-bench"
    entity: str | None = None  # your wandb user or team; null: your default
    mode: str | None = None  # offline, online or disabled; null: $WANDB_MODE, else offline
    tags: list[str] = field(default_factory=list)


class Tracker:
    """No tracking (``logger: none``): every method does nothing."""

    def log_point(self, point: dict[str, Any]) -> None:
        """One training-curve point from ``train.fit(on_log=...)``."""

    def log_records(self, records: list[dict[str, Any]]) -> None:
        """The records of a finished job."""

    def log_report(self, report: Any) -> None:
        """The tables and figures of a ``pe_bench.report.build.Report``."""

    def finish(self) -> None:
        """Close the run."""


class WandbTracker(Tracker):
    """A wandb run."""

    def __init__(self, run: Any, wandb: Any) -> None:
        self.run = run
        self.wandb = wandb

    def log_point(self, point: dict[str, Any]) -> None:
        keys = {"loss": "train/loss", "lr": "train/lr", "val_loss": "val/loss"}
        self.run.log({keys[k]: v for k, v in point.items() if k in keys}, step=point["step"])

    def log_records(self, records: list[dict[str, Any]]) -> None:
        df = pd.DataFrame(records)
        self.run.log({"eval/records": self.wandb.Table(dataframe=df)})
        for r in records:
            if r.get("mode") in PROBES:  # a context-use probe: no perplexity, in the table only
                continue
            variant = "" if r["variant"] == "none" else f"{r['variant']}/"
            for metric in ("ppl", "bpb"):
                self.run.summary[f"eval/{r['mode']}/{variant}{metric}@{r['eval_len']}"] = r[metric]

    def log_report(self, report: Any) -> None:
        tables = {}
        for name, table in report.tables.items():
            if table.index.name:  # the ratio table: labels are its index
                table = table.reset_index()
            tables[f"tables/{name}"] = self.wandb.Table(dataframe=table.rename(columns=str))
        images = {
            f"figures/{name}": self.wandb.Image(str(png)) for name, png in report.figures.items()
        }
        self.run.log({**tables, **images})

    def finish(self) -> None:
        self.run.finish()


def parse_logger(logger: Any) -> WandbConfig | None:
    """The wandb settings of a ``logger`` config (None for ``none``), refused if a value is
    wrong or wandb is missing: parsed once with the run's config, before any training."""
    settings = to_dict(logger) or {"name": "none"}
    if not isinstance(settings, dict):
        raise UserError(f"logger={settings!r} must be a logger config; use logger=none|wandb")
    if settings.get("name") == "none" and set(settings) == {"name"}:
        return None
    if settings.get("name") not in ("none", "wandb"):
        raise UserError(f"logger={settings.get('name')!r} is not a logger; use none or wandb")
    if settings.get("name") == "none":
        raise UserError(f"unknown key logger.{sorted(set(settings) - {'name'})[0]}; allowed: name")
    cfg = from_node(WandbConfig, settings, "logger")
    mode = cfg.mode or os.environ.get("WANDB_MODE") or "offline"
    if mode not in WANDB_MODES:
        raise UserError(f"logger.mode={mode!r} must be one of {', '.join(WANDB_MODES)}")
    if importlib.util.find_spec("wandb") is None:
        raise UserError("logger=wandb needs the wandb package: pip install 'pe-bench[wandb]'")
    return cfg


def start(
    cfg: WandbConfig | None,
    *,
    name: str,
    group: str,
    job_type: str,
    folder: Path,
    config: dict[str, Any],
) -> Tracker:
    """The tracker ``cfg`` (``parse_logger``) asks for; a no-op ``Tracker`` for none."""
    if cfg is None:
        return Tracker()
    mode = cfg.mode or os.environ.get("WANDB_MODE") or "offline"
    try:
        import wandb
    except ImportError as err:
        raise UserError(
            "logger=wandb needs the wandb package: pip install 'pe-bench[wandb]'"
        ) from err
    folder.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=cfg.project,
        entity=cfg.entity,
        mode=mode,
        dir=str(folder),
        name=name,
        group=group,
        job_type=job_type,
        tags=cfg.tags,
        config=config,
        reinit="finish_previous",  # a Hydra multirun runs its jobs in one process
        settings=wandb.Settings(console="off"),  # the run folder keeps the log already
    )
    return WandbTracker(run, wandb)
