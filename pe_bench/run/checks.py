"""The ``pe-bench`` command line, checked before Hydra runs anything: a misspelled group, key
or option, a value Hydra cannot parse, or an ``out_root`` that cannot hold job folders ends in
one line naming it and what is allowed, instead of Hydra's list of every option over many
lines or a traceback."""

from __future__ import annotations

import difflib
import os
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pe_bench.errors import UserError
from pe_bench.run import weights
from pe_bench.run.config import CONF_DIR, RunConfig, check_top_keys
from pe_bench.run.plan import plan


def os_message(err: OSError) -> str:
    """An ``OSError`` as one line naming the file and the reason."""
    where = f"{os.fsdecode(err.filename)!r}: " if err.filename else ""
    return f"cannot write or read {where}{err.strerror or err}"


def check_command(argv: list[str]) -> None:
    """Compose the config as Hydra will, with Hydra's own parser, config search path
    (``hydra.searchpath`` included) and overrides, and turn a composition error into one
    ``UserError``; each value of a swept group is composed too. Commands that compose
    something else (``--help``, ``--config-dir``, ...) are left to Hydra."""
    for arg in argv:
        try:
            arg.encode()
        except UnicodeEncodeError as err:  # bytes that are not UTF-8 (surrogate escapes)
            raise UserError(
                f"{arg!r} is not UTF-8 text; allowed: UTF-8 keys and values (paths too)"
            ) from err
    args = get_args_parser().parse_intermixed_args(argv)  # Hydra's flags, anywhere
    elsewhere = (args.config_path, args.config_name, args.config_dir, args.experimental_rerun)
    if args.help or args.hydra_help or args.shell_completion or args.info or any(elsewhere):
        return
    try:
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except OverrideParseException as err:
        raise UserError(f"bad override: {_flat(str(err))}") from err
    base = [_first(o) for o in overrides]
    cfg = _composed([line for line in base if line is not None], overrides)
    check_top_keys(cfg)
    choices = cfg.hydra.runtime.choices
    for i, override in enumerate(overrides):
        key = override.get_key_element().lstrip("+~")
        if override.is_sweep_override() and base[i] is not None and key in choices:
            for value in list(override.sweep_string_iterator())[1:]:
                swapped = [*base[:i], f"{override.get_key_element()}={value}", *base[i + 1 :]]
                _composed([line for line in swapped if line is not None], overrides)
    if not args.cfg:
        multirun = args.multirun or cfg.hydra.mode == RunMode.MULTIRUN
        check_jobs(job_overrides(cfg, args.overrides) if multirun else None, cfg, overrides)
        _check_writable(str(cfg.out_root))


def job_overrides(cfg: DictConfig, command: list[str]) -> list[list[str]] | None:
    """Each job's overrides, as Hydra's basic sweeper lists them (the experiment's
    ``hydra.sweeper.params``, then the command line's); None when a sweep cannot be listed
    without the sweeper (``glob``, a float range): Hydra checks those jobs itself."""
    params = [f"{k}={v}" for k, v in (cfg.hydra.sweeper.get("params") or {}).items()]
    try:
        parsed = OverridesParser.create().parse_overrides([*params, *command])
        batches = BasicSweeper.split_arguments(parsed, None)
    except HydraException:
        return None
    return [job for batch in batches for job in batch]


def check_jobs(jobs: list[list[str]] | None, cfg: DictConfig, overrides: list[Override]) -> None:
    """Plan every job as its run will (typed configs, scheme and variants built, lengths and
    memory checked; no model is built and no data read, well under a second a job), so that
    a bad value in any job of a sweep is refused in one line naming the job, before any job
    starts or any folder is made. ``jobs`` None: the one job ``cfg`` is."""
    for job in jobs or [None]:
        composed = cfg if job is None else _composed(job, overrides)
        try:
            run_cfg = RunConfig.parse(composed)
            if not run_cfg.pretrained:  # a pretrained model's plan reads its config.json
                plan(run_cfg)
            else:  # where its weights are: a missing GGUF file or package is one line
                weights.resolve(run_cfg.model.name, run_cfg.model.gguf_file)
        except UserError as err:
            where = (
                "" if job is None or len(jobs) == 1 else f" (in the sweep's job {' '.join(job)})"
            )
            raise UserError(f"{err}{where}") from err


def _first(override: Override) -> str | None:
    """The override as a plain one (a sweep's first value); None for a sweep that cannot be
    listed without the sweeper (``glob``, ranges of floats): Hydra checks those itself."""
    if not override.is_sweep_override():
        return override.input_line
    try:
        first = next(iter(override.sweep_string_iterator()))
    except Exception:
        return None
    return f"{override.get_key_element()}={first}"


def _composed(lines: list[str], overrides: list[Override]) -> DictConfig:
    """The config Hydra composes from ``lines``, or a ``UserError`` saying in one line which
    override is wrong and what is allowed."""
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return compose("config", overrides=lines, return_hydra_config=True)
    except MissingConfigException as err:
        raise UserError(_missing_option(err, overrides)) from err
    except HydraException as err:
        cause = err.__cause__
        key = getattr(cause, "full_key", None)
        if isinstance(cause, OmegaConfBaseException) and key and "not in struct" in str(cause):
            raise UserError(_unknown_key(str(key), lines)) from err
        raise UserError(_flat(str(err))) from err


def _missing_option(err: MissingConfigException, overrides: list[Override]) -> str:
    """``pe=roep is not an option of pe; allowed: alibi, ...``: Hydra's list, on one line."""
    group, _, option = (err.missing_cfg_file or "").rpartition("/")
    allowed = f"; allowed: {', '.join(err.options)}" if err.options else ""
    for override in overrides:
        if override.key_or_group == group:
            return f"{override.get_key_element()}={option} is not an option of {group}{allowed}"
    return f"{group}={option} (asked for by the config) is not an option of {group}{allowed}"


def _unknown_key(key: str, lines: list[str]) -> str:
    """``unknown key train.step (did you mean train.steps?); allowed: ...``: the keys of the
    node it would go in, from the config composed without it."""
    parent, _, name = key.rpartition(".")
    rest = [line for line in lines if not line.lstrip("+~").startswith(f"{key}=")]
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("config", overrides=rest)
        node = OmegaConf.select(cfg, parent) if parent else cfg
        keys = sorted(str(k) for k in node) if isinstance(node, DictConfig) else []
    except HydraException:
        keys = []
    close = difflib.get_close_matches(name, keys, n=1)
    hint = f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""
    allowed = f"; allowed: {', '.join(keys)}" if keys else ""
    return f"unknown key {key}{hint}{allowed}"


def _flat(message: str) -> str:
    """A Hydra message on one line (without its config search path)."""
    message = message.split("\nConfig search path:")[0]
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def _check_writable(out_root: str) -> None:
    """Refuse an ``out_root`` where no job folder can be made (read-only, a file, a name the
    file system cannot hold) before Hydra creates one and fails with a traceback."""
    try:
        folder = Path(out_root).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except (OSError, UnicodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise UserError(
            f"out_root={out_root!r} cannot hold the job folders ({reason}); allowed: a folder "
            "you can write to, e.g. out_root=outputs"
        ) from err
