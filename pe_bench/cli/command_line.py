"""The ``pe-bench`` command line, checked before Hydra runs anything: a misspelled group, key
or option, a value Hydra cannot parse, or an ``out_root`` that cannot hold job folders ends in
one line naming it and what is allowed, instead of Hydra's list of every option over many
lines or a traceback."""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pe_bench.cli.hydra_private import basic_sweeper_jobs, hydra_args_parser
from pe_bench.data.tokenizer import BPE
from pe_bench.errors import UserError
from pe_bench.run import weights
from pe_bench.run.config import CONF_DIR, PRETRAINED, RunConfig, check_top_keys
from pe_bench.run.estimate import sweep_estimate, worth_estimating
from pe_bench.run.plan import Plan, plan

NAME_MAX = 255  # bytes of a file or folder name on Linux and macOS file systems
# pe-bench's config groups (conf/'s folders): a list selected for one is refused
GROUPS = sorted(p.name for p in Path(CONF_DIR).iterdir() if p.is_dir() and p.name[0] != "_")


@dataclass(frozen=True)
class Command:
    """A checked command: the folder it writes into (the sweep's, or the run's), whether it
    is a sweep, the plan of each job pe-bench trains, and what to say before it starts."""

    folder: Path
    multirun: bool
    plans: list[Plan]
    notes: list[str]


def check_command(argv: list[str]) -> Command | None:
    """Compose the config as Hydra will, with Hydra's own parser, config search path
    (``hydra.searchpath`` included) and overrides, and turn a composition error into one
    ``UserError``; each value of a swept group is composed too. Commands that compose
    something else (``--help``, ``--config-dir``, ...) are left to Hydra (None)."""
    for arg in argv:
        try:
            arg.encode()
        except UnicodeEncodeError as err:  # bytes that are not UTF-8 (surrogate escapes)
            raise UserError(
                f"{arg!r} is not UTF-8 text; allowed: UTF-8 keys and values (paths too)"
            ) from err
    args = _hydra_args(argv)
    _check_one_mode(args)
    elsewhere = (args.config_path, args.config_name, args.config_dir, args.experimental_rerun)
    if args.help or args.hydra_help or args.shell_completion or args.info or any(elsewhere):
        return None
    overrides = parsed_overrides(args.overrides)
    base = [_first(o) for o in overrides]
    cfg = _composed([line for line in base if line is not None], overrides)
    check_top_keys(cfg)
    check_group_values(overrides, {*cfg.hydra.runtime.choices, *GROUPS})
    check_read(overrides, cfg)
    choices = cfg.hydra.runtime.choices
    for i, override in enumerate(overrides):
        key = override.get_key_element().lstrip("+~")
        if override.is_sweep_override() and base[i] is not None and key in choices:
            for value in list(override.sweep_string_iterator())[1:]:
                swapped = [*base[:i], f"{override.get_key_element()}={value}", *base[i + 1 :]]
                _composed([line for line in swapped if line is not None], overrides)
    if args.cfg:
        return None
    _check_writable(str(cfg.out_root))
    multirun = args.multirun or cfg.hydra.mode == RunMode.MULTIRUN
    plans = check_jobs(job_overrides(cfg, args.overrides) if multirun else None, cfg, overrides)
    folder = Path(str(OmegaConf.select(cfg, "hydra.sweep.dir" if multirun else "hydra.run.dir")))
    return Command(folder, multirun, plans, notes(plans))


def announce(command: Command) -> None:
    """Say what a checked command should hear before it starts: its notes (stderr), and a
    sweep's estimated time (``run.estimate``)."""
    for note in command.notes:
        print(f"pe-bench: {note}", file=sys.stderr)
    if command.multirun and worth_estimating(command.plans):
        print(f"pe-bench: estimate: {sweep_estimate(command.plans)}", flush=True)


def notes(plans: list[Plan]) -> list[str]:
    """What to say before the jobs start: a job that measures no extrapolation (every eval
    length within its training length), once for each such setting."""
    said = []
    for job in plans:
        train_len = job.cfg.train.seq_len
        lengths = job.cfg.eval.eval_lengths(train_len)
        if lengths and max(lengths) <= train_len:
            said.append(
                f"warning: eval lengths {', '.join(map(str, lengths))} reach no further than "
                f"train.seq_len={train_len}: no extrapolation is measured (eval.factors above "
                "1, or eval.lengths past it, do)"
            )
    return list(dict.fromkeys(said))


def _hydra_args(argv: list[str]) -> argparse.Namespace:
    """Hydra's flags and the overrides, by Hydra's own parser; a bad flag is one line (not
    argparse's usage over many)."""
    parser = hydra_args_parser()

    def refuse(message: str) -> NoReturn:
        raise UserError(
            f"{message}; allowed: Hydra's flags (-m, --cfg job, --help, ...) before the "
            "overrides, e.g. pe-bench -m pe=rope,alibi train.steps=100"
        )

    parser.error = refuse  # type: ignore[method-assign]
    return parser.parse_args(argv)  # as Hydra parses them


def _check_one_mode(args: argparse.Namespace) -> None:
    """Refuse two of Hydra's modes at once (``-m --cfg hydra``), which Hydra itself answers
    with a traceback (its ValueError, raised after the command line was parsed)."""
    modes = {
        "--run": args.run,
        "--multirun": args.multirun,
        "--cfg": args.cfg is not None,
        "--info": args.info is not None,
        "--shell-completion": args.shell_completion,
    }
    given = [flag for flag, on in modes.items() if on]
    if len(given) > 1:
        raise UserError(
            f"{' and '.join(given)} given together; allowed: one of {', '.join(modes)}, e.g. "
            "pe-bench -m pe=rope,alibi to sweep, or pe-bench --cfg job pe=rope to print a config"
        )


def parsed_overrides(lines: list[str]) -> list[Override]:
    """The command line's overrides, parsed by Hydra; one that has no key (``=3``) or gives a
    key a second time (``train.lr=1e-3 train.lr=2e-3``: Hydra keeps the last without a word)
    is refused."""
    try:
        overrides = OverridesParser.create().parse_overrides(lines)
    except OverrideParseException as err:
        raise UserError(f"bad override: {_flat(str(err))}") from err
    seen: dict[str, str] = {}
    for override in overrides:
        if not override.key_or_group:
            raise UserError(
                f"override {override.input_line!r} has no key; allowed: key=value, e.g. "
                "train.lr=3e-4"
            )
        if override.is_delete():  # ~key: no value to lose
            continue
        key = override.get_key_element().lstrip("+~")
        if key in seen:
            raise UserError(
                f"{key} is given twice ({seen[key]} and {override.input_line}); allowed: one "
                f"value, or a sweep of both: -m {key}={_values(seen[key], override.input_line)}"
            )
        seen[key] = override.input_line
    return overrides


def _values(*lines: str) -> str:
    """``a,b`` from ``key=a`` and ``key=b``."""
    return ",".join(line.split("=", 1)[1] for line in lines)


def check_group_values(overrides: list[Override], groups: set[str]) -> None:
    """Refuse a list for a config group (``pe=[rope,alibi]``): Hydra merges the configs into
    one, and the error would then name an option of the one that came second."""
    for override in overrides:
        group = override.key_or_group
        if group not in groups or override.is_delete():
            continue
        try:
            values = list(override.sweep_iterator()) if override.is_sweep_override() else []
        except Exception:  # glob, float ranges: listed by the sweeper alone
            values = []
        for value in values or [override.value()]:
            if isinstance(value, list):
                choices = ",".join(map(str, value))
                raise UserError(
                    f"{override.input_line} selects {len(value)} configs of {group} at once; "
                    f"allowed: one, e.g. {group}={value[0] if value else '<name>'}, or a sweep "
                    f"of them: -m {group}={choices}"
                )


def check_read(overrides: list[Override], cfg: DictConfig) -> None:
    """Refuse an override that the run it composes never reads, rather than ignore it: a
    scheme, fine-tune, training key or tokenizer given to a pretrained model (``model=hf``),
    and ``data.vocab_size`` without ``data.tokenizer=bpe``."""
    pretrained = OmegaConf.select(cfg, "model.source", default=None) == PRETRAINED
    swept = [o for o in overrides if o.key_or_group == "data.tokenizer" and o.is_sweep_override()]
    bpe = bool(swept) or OmegaConf.select(cfg, "data.tokenizer", default=None) == BPE
    for override in overrides:
        if override.is_delete():
            continue
        key, line = override.key_or_group, override.input_line
        why = _unread_by_pretrained(key, override.package) if pretrained else ""
        if not why and key == "data.vocab_size" and not bpe and not pretrained:
            why = (
                "only a BPE trained here reads it (byte has 256 symbols, hf:<name> its own); "
                f"allowed: data.tokenizer=bpe {line}, or leave it out"
            )
        if why:
            raise UserError(f"{line} is not read by this run: {why}")


def _unread_by_pretrained(key: str, package: str | None) -> str:
    """Why a pretrained model's run does not read override ``key`` ('' when it does)."""
    if (key == "pe" and not package) or key.startswith("pe."):
        return (
            "model=hf keeps the model's own RoPE; allowed: eval-time variants of it, "
            "+pe@eval.variants.<key>=<variant>, e.g. +pe@eval.variants.yarn=yarn"
        )
    if key in ("finetune", "finetunes") or key.startswith("finetunes."):
        return "model=hf evaluates the model as it is, without fine-tuning"
    if key.startswith("train.") and key != "train.device":
        return "model=hf trains nothing (of train it reads train.device only)"
    if key in ("data.tokenizer", "data.vocab_size"):
        return "model=hf reads the corpus with the model's own tokenizer"
    return ""


def job_overrides(cfg: DictConfig, command: list[str]) -> list[list[str]] | None:
    """Each job's overrides, as Hydra's basic sweeper lists them (the experiment's
    ``hydra.sweeper.params``, then the command line's); None when a sweep cannot be listed
    without the sweeper (``glob``, a float range): Hydra checks those jobs itself."""
    params = [f"{k}={v}" for k, v in (cfg.hydra.sweeper.get("params") or {}).items()]
    try:
        parsed = OverridesParser.create().parse_overrides([*params, *command])
        return basic_sweeper_jobs(parsed)
    except HydraException:
        return None


def check_jobs(
    jobs: list[list[str]] | None, cfg: DictConfig, overrides: list[Override]
) -> list[Plan]:
    """Plan every job as its run will (typed configs, scheme and variants built, lengths and
    memory checked; no model is built and no data read, well under a second a job), so that
    a bad value in any job of a sweep is refused in one line naming the job, before any job
    starts or any folder is made. ``jobs`` None: the one job ``cfg`` is. Returns the plans
    of the jobs pe-bench trains (a pretrained model's plan reads its config.json: none)."""
    plans = []
    for job in jobs or [None]:
        composed = cfg if job is None else _composed(job, overrides)
        try:
            run_cfg = RunConfig.parse(composed)
            if not run_cfg.pretrained:
                plans.append(plan(run_cfg))
            else:  # where its weights are: a missing GGUF file or package is one line
                weights.resolve(run_cfg.model.name, run_cfg.model.gguf_file)
            check_job_folder(composed, multirun=job is not None)
        except UserError as err:
            where = (
                "" if job is None or len(jobs) == 1 else f" (in the sweep's job {' '.join(job)})"
            )
            raise UserError(f"{err}{where}") from err
    return plans


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
    except yaml.YAMLError as err:  # a config file (a user's experiment) that is not YAML
        raise UserError(yaml_message(err)) from err
    except ValueError as err:  # Hydra's own, for an override its grammar lets through
        raise UserError(f"bad override: {_flat(str(err))} (in {' '.join(lines)})") from err
    except HydraException as err:
        cause = err.__cause__
        key = getattr(cause, "full_key", None)
        if isinstance(cause, OmegaConfBaseException) and key and "not in struct" in str(cause):
            raise UserError(_unknown_key(str(key), lines)) from err
        raise UserError(_flat(str(err))) from err


def has_option(group: str, option: str, searchpath: str | None = None) -> bool:
    """Whether config group ``group`` has ``option`` (a YAML in pe-bench's conf/ or, with
    ``searchpath``, in the folder it names, as ``hydra.searchpath`` would find it)."""
    lines = [f"{group}={option}", *([f"hydra.searchpath=[{searchpath}]"] if searchpath else [])]
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            compose("config", overrides=lines)
    except MissingConfigException:
        return False
    except HydraException as err:
        raise UserError(f"{' '.join(lines)} does not compose: {_flat(str(err))}") from err
    return True


def _missing_option(err: MissingConfigException, overrides: list[Override]) -> str:
    """``pe=roep is not an option of pe; allowed: alibi, ...``: Hydra's list, on one line."""
    group, _, option = (err.missing_cfg_file or "").rpartition("/")
    allowed = f"; allowed: {', '.join(err.options)}" if err.options else ""
    close = difflib.get_close_matches(option, err.options or [], n=1)
    hint = f" (did you mean {group}={close[0]}?)" if close else ""
    for override in overrides:
        if override.key_or_group == group:
            given = f"{override.get_key_element()}={option}"
            return f"{given} is not an option of {group}{hint}{allowed}"
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
    file system cannot hold) before Hydra creates one and fails with a traceback; nothing is
    made here (the nearest folder that exists is tried)."""
    try:
        folder = Path(out_root).expanduser()
        _blocker(folder)
        with tempfile.TemporaryFile(dir=_nearest(folder)):
            pass
    except (OSError, UnicodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise UserError(
            f"out_root={out_root!r} cannot hold the job folders ({reason}); allowed: a folder "
            "you can write to, e.g. out_root=outputs"
        ) from err


def check_job_folder(composed: DictConfig, multirun: bool) -> None:
    """Refuse a job folder that cannot be made because a file is in its way (``name=`` a file,
    a file named as the job's folder), which Hydra would meet as a traceback."""
    hydra = composed.hydra
    try:
        folder = Path(hydra.sweep.dir) / hydra.sweep.subdir if multirun else Path(hydra.run.dir)
    except OmegaConfBaseException:  # a value Hydra's folder name cannot hold: Hydra says so
        return
    longest = max(folder.parts, key=lambda part: len(part.encode()))
    if len(longest.encode()) > NAME_MAX:
        raise UserError(
            f"the job folder {str(folder)[:80]}... cannot be made: its name "
            f"{longest[:40]}... is {len(longest.encode())} bytes; allowed: at most {NAME_MAX} "
            "bytes a name (the file system's limit), a shorter name= or out_root="
        )
    try:
        _blocker(folder.expanduser())
    except NotADirectoryError as err:
        same = Path(err.filename) == folder.expanduser()
        blocker = "a file is in its place" if same else f"{err.filename} is a file"
        raise UserError(
            f"the job folder {folder} cannot be made: {blocker}; "
            "allowed: move that file away, or pick another name= or out_root="
        ) from err


def yaml_message(err: yaml.YAMLError) -> str:
    """A YAML error as one line: the file, the line and column, what is wrong."""
    mark = getattr(err, "problem_mark", None)
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else "a config"
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    return (
        f"{where}: not valid YAML ({f'{context}: ' if context else ''}{problem}); allowed: "
        "YAML as in conf/ (the same indent for keys of one level, spaces, no tabs)"
    )


def _nearest(path: Path) -> Path:
    """``path`` or the nearest of its parents that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _blocker(folder: Path) -> None:
    """A ``NotADirectoryError`` naming the file that is ``folder`` or one of its parents."""
    found = _nearest(folder)
    if not found.is_dir():
        raise NotADirectoryError(20, "Not a directory", str(found))
