"""``pe-bench-place``: a scheme (a plugin's, or any) on the leaderboard of a committed
experiment, in one command.

    pe-bench-place my_pe --onto results/quick --plugin my_pe

It copies the committed folder's records (not its report, nor any checkpoint: the committed
schemes are not retrained) into ``--out``, trains and evaluates the scheme there with the
sweep command that made the committed records (``commands.txt``: the same experiment, model,
data, training and evaluation), once per committed seed, and the sweep's report then ranks
it beside the committed schemes, with CIs over the seeds. The report refuses records made
under another protocol, so the placed scheme's numbers are comparable or there is no report.
Rerunning the command resumes: finished runs are found, not retrained.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pe_bench.cli.command_line import check_command, has_option
from pe_bench.cli.console import INTERRUPTED, console
from pe_bench.errors import OneLineParser, UserError
from pe_bench.files import atomic_write_bytes, exclusive_lock
from pe_bench.positions import load_plugin, scheme_class
from pe_bench.records import COMMANDS, load_records
from pe_bench.report.inputs import report_lock
from pe_bench.run.sweep import (
    command_lines,
    plugin_pythonpath,
    with_pythonpath_prefix,
    write_command_lines,
)

# Overrides of a committed command that a placement sets itself.
OWN_KEYS = ("pe", "train.seed", "out_root", "name", "hydra.sweep.dir")
# What is not copied from the committed folder: the report (rewritten with the new scheme),
# checkpoints (never committed anyway) and loggers' folders.
NOT_COPIED = ("report.md", "tables", "figures", "*.pt", "wandb", ".lock", ".done")
IGNORED = shutil.ignore_patterns(*NOT_COPIED)


def protocol_overrides(onto: Path) -> list[str]:
    """The overrides of the sweeps that made ``onto``'s records, less the scheme, the seeds
    and where outputs go (the same in every sweep of the folder, or a ``UserError``)."""
    if not (onto / COMMANDS).exists():
        raise UserError(
            f"{onto} has no {COMMANDS}: pe-bench-place needs the folder of a committed sweep "
            "(e.g. results/quick)"
        )
    found = set()
    for line in command_lines(onto):
        words = shlex.split(line, comments=True)
        if "pe-bench" not in words:  # an earlier placement's own line
            continue
        words = words[words.index("pe-bench") + 1 :]  # drop a PYTHONPATH= prefix
        kept = [w for w in words if w != "-m" and not _own(w.split("=", 1)[0].lstrip("+~"))]
        found.add(tuple(kept))
    if len(found) != 1:
        listed = "; ".join(" ".join(f) for f in sorted(found))
        raise UserError(
            f"the sweeps of {onto} differ beyond pe and train.seed ({listed}): place onto a "
            "folder of one protocol"
        )
    return list(found.pop())


def _own(key: str) -> bool:
    """Whether a placement sets override ``key`` itself (the scheme and its options too)."""
    return key in OWN_KEYS or key.startswith("pe.")


def committed_seeds(onto: Path) -> list[int]:
    """The seeds of the committed records (every one gets a run of the placed scheme)."""
    records = load_records(onto)
    return sorted({int(s) for s in records["seed"].dropna()})


def check_not_committed(scheme: str, onto: Path, planned: list[str]) -> None:
    """Refuse a placement whose runs ``onto`` already holds (``pe-bench-place alibi`` onto
    results/quick retrained alibi, then its report found the same run twice)."""
    held = set(load_records(onto)["run_id"]) & set(planned)
    if held:
        raise UserError(
            f"{scheme} with these options is already in {onto} (run {min(held)}): its numbers "
            f"are in {onto / 'report.md'}; place a scheme or --option that {onto} lacks"
        )


def scheme_overrides(
    scheme: str, options: list[str], plugin: str | None, searchpath: str | None = None
) -> list[str]:
    """The ``pe`` overrides that select ``scheme`` with ``options``: its YAML where there is one
    (in pe-bench, or in the folder ``searchpath`` names: the plugin's own), else (a plugin's
    scheme without a YAML) the empty NoPE config renamed."""
    pe = [f"pe={scheme}"] if has_option("pe", scheme, searchpath) else ["pe=nope"]
    if pe[0] == "pe=nope" and scheme != "nope":
        pe.append(f"pe.name={scheme}")
    if plugin:
        pe.append(f"++pe.plugin={plugin}")
    return [*pe, *(f"++pe.{option}" for option in options)]


def copy_records(onto: Path, out: Path) -> None:
    """The committed folder's records and commands, into ``out`` (once: a rerun resumes).
    The copy is made whole in a temporary folder beside ``out`` and renamed to it, so a kill
    leaves no copy or a whole one (the next run removes a cut-short temporary folder); two
    placements at once copy once, the second waiting for the first. A copy that lacks files
    of ``onto`` (cut short by a version of pe-bench that copied in place) gets them back."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out.parent):  # waits for another placement's copy
        for stray in out.parent.glob(f".{out.name}.copy-*"):
            shutil.rmtree(stray, ignore_errors=True)
        if not out.exists():
            print(f"pe-bench-place: copying {onto}'s records into {out}", flush=True)
            copy = Path(tempfile.mkdtemp(prefix=f".{out.name}.copy-", dir=out.parent))
            shutil.copytree(onto, copy, ignore=IGNORED, dirs_exist_ok=True)
            copy.chmod(0o755)  # mkdtemp makes 0700; a folder of results is meant to be shared
            os.rename(copy, out)
            return
    restored = restore_missing(onto, out)
    if restored:
        print(f"pe-bench-place: {out} lacked {restored} files of {onto}: copied", flush=True)


def restore_missing(onto: Path, out: Path) -> int:
    """Copy each file of ``onto`` (as ``copy_records`` copies them) that ``out`` lacks, each
    written whole (``atomic_write_bytes``); how many."""
    restored = 0
    for folder, dirs, files in os.walk(onto):
        skip = IGNORED(folder, [*dirs, *files])
        dirs[:] = [d for d in dirs if d not in skip]
        for name in files:
            source = Path(folder) / name
            target = out / source.relative_to(onto)
            if name not in skip and not target.exists():
                atomic_write_bytes(target, source.read_bytes())
                restored += 1
    return restored


def place(
    scheme: str,
    onto: Path,
    out: Path,
    options: list[str],
    plugin: str | None = None,
    searchpath: str | None = None,
) -> int:
    """Train and evaluate ``scheme`` under ``onto``'s protocol into ``out`` beside a copy of
    ``onto``'s records; the exit status of the sweep (whose report ranks it). The sweep's
    command is checked (``cli.command_line``: every job planned, a bad ``--option`` refused in one
    line) before anything is copied or written."""
    if plugin:
        load_plugin(plugin, "--plugin")
    cls = scheme_class(scheme)
    if cls.variant_of:
        raise UserError(
            f"{scheme} is an eval-time variant of {cls.variant_of}: it needs the trained "
            f"{cls.variant_of} model, which is not committed; evaluate it with the committed "
            "sweep's command and +pe@eval.variants.<key>=<variant>"
        )
    overrides = protocol_overrides(onto)
    seeds = ",".join(map(str, committed_seeds(onto)))
    command = [
        *overrides,
        *scheme_overrides(scheme, options, plugin, searchpath),
        f"train.seed={seeds}",
        f"hydra.sweep.dir={out}",
        *([f"hydra.searchpath=[{searchpath}]"] if searchpath else []),
    ]
    checked = check_command(["-m", *command])
    check_not_committed(scheme, onto, [i for job in checked.plans for i in job.run_ids])
    copy_records(onto, out)
    log_placement(out, scheme, onto, options, plugin, searchpath)
    print(f"pe-bench-place: pe-bench -m {shlex.join(command)}", flush=True)
    status = run_sweep([sys.executable, "-m", "pe_bench.cli", "-m", *command])
    if status == 0 and not (out / "report.md").exists():  # never exit 0 without the report
        print(f"pe-bench-place: error: no report at {out / 'report.md'}", file=sys.stderr)
        return 1
    return status


def run_sweep(args: list[str]) -> int:
    """Run the sweep and return its exit status. Ctrl-C reaches it too (one process group):
    it says so in one line and ends, and this command ends with its status, silently."""
    proc = subprocess.Popen(args)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        status = proc.wait()
        if status != INTERRUPTED:  # it had not started to handle it: say it here
            raise
        sys.exit(INTERRUPTED)


def log_placement(
    out: Path,
    scheme: str,
    onto: Path,
    options: list[str],
    plugin: str | None,
    searchpath: str | None,
) -> None:
    """This command in ``out``'s ``COMMANDS``, before the sweep's own line, so that the
    report's Reproduce section starts from the copy of the committed records."""
    args = [scheme, "--onto", str(onto), *(a for o in options for a in ("--option", o))]
    args += [*(["--plugin", plugin] if plugin else []), "--out", str(out)]
    args += ["--searchpath", searchpath] if searchpath else []
    pythonpath = plugin_pythonpath({"pe": {"plugin": plugin}}) if plugin else ""
    command = with_pythonpath_prefix(shlex.join(["pe-bench-place", *args]), pythonpath)
    line = f"{command}  # copies {onto}'s records, then:"
    with report_lock(out, wait=True):  # the lock every writer of COMMANDS takes
        lines = command_lines(out)
        if line not in lines:
            write_command_lines(out, [*lines, line])


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(
        prog="pe-bench-place",
        description="Train a scheme under a committed experiment's protocol and report it "
        "beside the committed schemes.",
    )
    parser.add_argument("scheme", help="registered scheme name (your plugin's, or a built-in)")
    parser.add_argument(
        "--onto",
        type=Path,
        default=Path("results/quick"),
        help="a committed sweep's folder (default results/quick)",
    )
    parser.add_argument("--plugin", help="module to import first, e.g. my_pe")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a scheme option, as pe.KEY=VALUE (repeatable)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="where the copy and the new runs go (default outputs/place/<onto>/<scheme>)",
    )
    parser.add_argument(
        "--searchpath",
        help="a folder of the plugin's YAML, e.g. file://$PWD/conf (as hydra.searchpath)",
    )
    args = parser.parse_args(argv)
    for option in args.option:
        if "=" not in option or option.startswith("="):
            parser.error(f"--option {option!r} is not key=value")
    label = ",".join([args.scheme, *args.option])
    out = args.out or Path("outputs") / "place" / args.onto.name / label
    with console("pe-bench-place"):
        try:
            status = place(args.scheme, args.onto, out, args.option, args.plugin, args.searchpath)
        except UserError as err:
            parser.error(str(err))
    if status == 0:
        report = (out / "report.md").resolve()
        print(f"pe-bench-place: {args.scheme} beside {args.onto}'s schemes: {report}")
    sys.exit(status)
