"""Give the committed records the key of their scheme's code (issue 24, item 5), once.

Records carry the key of the code that made their numbers (``pe_source``; a variant's records
also ``variant_source``, and their ``variant_hash`` is the variant's config alone), and a job
folder's records of another key, or of none, are recomputed (``pe_bench.run.store``). The
committed records were made before that key existed: the older ones carry no key, the newer
ones a hash of whole source files. This script gives each record today's key only where the
code that made it (its ``git_sha``) computes what today's code computes:

1. For each record, the scheme config that made it is the job folder's ``config.yaml`` (whose
   run hash is the record's, checked) and, for a variant's record, ``eval.variants.<key>``
   there, whose hash must be the record's ``variant_hash`` (of the config alone, or of the
   config and the old file hash, ``positions.source_hash`` at that commit, checked there).
2. For each commit the records name, that commit's ``pe_bench`` (``git archive``; the worker,
   ``experiments/migrate_worker.py``, runs in an interpreter that imports it) computes
   the ``numbers`` part of the key (``pe_bench.positions.fingerprint``: the scheme's hooks on a
   fixed probe, loaded from today's tree into the old one) for every scheme config its records
   used, trained schemes, variants and fine-tunes' schemes alike; and the same from today's
   tree. Equal numbers: the record gets today's key (as ``plan`` computes it for that
   folder's config). The ``source`` part (the classes' normalised syntax trees) is compared
   too and its differences printed: code that was edited without changing the numbers.
3. A pretrained model's records (``model=hf``) are kept under the key of every module-level
   definition of ``pe_bench/pretrained`` (``pe_bench.pretrained.key``): each definition the
   old commit had must have the same normalised syntax tree today. A definition added since
   cannot have computed the old numbers, since the unchanged code that did cannot name it;
   one removed since was named by none of it either. A module added since is not imported
   by the unchanged code; in a module the old commit had, an added top-level statement, a
   decorated definition (but ``migrate_worker.PURE_DECORATORS``) or an assignment that calls
   something may act on import: they are differences. Log lines are compared out, and so is
   a loop counter that only they read (``migrate_worker._proof_source``).

A fine-tuned model's record is also keyed by its fine-tune scheme's code (``finetune_source``,
which records made before it lack; ``drope``'s caveat was edited while they were keyed by the
trained scheme alone): it gets that key, and the caveat the scheme has today, wherever the
fine-tune scheme's code at its commit computes today's numbers. A migrated record also gets
the options its label shows today (``pe_options``, what differs from the defaults): bipe's
``separators`` became a default, so ``bipe(separators=[10])`` is ``bipe``.

A record whose code computed other numbers keeps what it has and is listed: the next run
recomputes it. Rerunning the script changes nothing (records already under today's key are
left as they are). ``--check`` says what it would do and writes nothing.

    OMP_NUM_THREADS=1 python experiments/migrate_keys.py [--results results] [--check]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = "examples/my_pe"  # where committed plugin runs found their plugin (commands.txt)
ARCHIVED = ("pe_bench", "conf", "examples")  # what an old commit's tree needs
WORKER = Path(__file__).with_name("migrate_worker.py")  # what a tree computes (its docstring)


def tree(sha: str, scratch: Path) -> Path:
    """The commit's files that the worker imports, extracted once under ``scratch``."""
    folder = scratch / sha[:12]
    if folder.exists():
        return folder
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", sha, *ARCHIVED],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", sha, *listed],
        capture_output=True,
        check=True,
    ).stdout
    folder.mkdir(parents=True)
    with tempfile.TemporaryFile() as handle:
        handle.write(archive)
        handle.seek(0)
        with tarfile.open(fileobj=handle) as tar:
            tar.extractall(folder, filter="data")
    return folder


def known(sha: str) -> bool:
    """Whether the repository has commit ``sha`` (a record made at an unlanded one may not)."""
    command = ["git", "-C", str(ROOT), "cat-file", "-e", f"{sha}^{{commit}}"]
    return subprocess.run(command, capture_output=True).returncode == 0


def run_worker(root: Path, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``migrate_worker.worker(items)`` in a fresh interpreter that imports ``root``'s
    pe_bench."""
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / PLUGINS}"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(WORKER)],
        input=json.dumps(items),
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),  # not ROOT: its pe_bench must not shadow the old one
    )
    if proc.returncode != 0:
        raise SystemExit(f"worker in {root} failed:\n{proc.stderr[-3000:]}")
    where, *computed = json.loads(proc.stdout.splitlines()[-1])
    if Path(where["tree"]).resolve() != root.resolve():
        raise SystemExit(f"the worker for {root} imported the pe_bench of {where['tree']}")
    return computed


class Folder:
    """One job folder: its config, its records and position rows, and today's keys for its
    config (what ``plan`` or ``hf.run`` computes)."""

    def __init__(self, path: Path) -> None:
        from omegaconf import OmegaConf

        from pe_bench.files import read_jsonl
        from pe_bench.records import POSITIONS, RECORDS
        from pe_bench.run.plan import RunConfig

        self.path = path
        self.yaml = OmegaConf.load(path / "config.yaml")
        self.cfg = OmegaConf.to_container(self.yaml, resolve=True)
        self.records = read_jsonl(path / RECORDS)
        self.positions = read_jsonl(path / POSITIONS) if (path / POSITIONS).exists() else []
        self.hf = self.cfg["model"].get("source") == "hf"
        self.variant_cfgs = (self.cfg["eval"].get("variants") or {}) if "eval" in self.cfg else {}
        if self.hf:
            self._hf_keys()
            return
        run_cfg = RunConfig.parse(self.yaml)
        run_hashes = {r["run_id"].split(":")[0].rsplit("-", 1)[1] for r in self.records}
        if run_hashes != {run_cfg.run_hash}:
            raise SystemExit(f"{path}: config.yaml is not the records' config ({run_hashes})")
        self.dims = run_cfg.model.dims(run_cfg.train.seq_len)
        self.finetunes = {k: ft.pe for k, ft in run_cfg.finetunes.items()}
        self._plan_keys(run_cfg)

    def _plan_keys(self, run_cfg: Any) -> None:
        """Today's keys as ``plan`` gives them for this config."""
        from pe_bench.positions import load_plugin, options_label
        from pe_bench.run.plan import plan

        if self.cfg["pe"].get("plugin"):
            load_plugin(self.cfg["pe"]["plugin"])
        # no key reads the device: a GPU run's records are checked on a machine without one
        job = plan(replace(run_cfg, train=replace(run_cfg.train, device="cpu")))
        self.pe_source = job.pe_source
        self.caveat = job.scheme.caveat  # what the trained scheme's records say of it today
        self.finetune_caveats = {ft.key: ft.scheme.caveat for ft in job.finetunes}
        self.finetune_sources = {ft.run_id: ft.source for ft in job.finetunes}
        self.pe_options: str | None = options_label(run_cfg.pe)  # the label's, as records have
        self.variants = {t.variant: (t.variant_hash, t.variant_source) for t in job.tasks}

    def _hf_keys(self) -> None:
        """Today's keys as ``hf.run`` gives them, the model's rotary spec from its records."""
        from pe_bench.config import config_hash, from_node
        from pe_bench.positions import ModelDims
        from pe_bench.pretrained.key import pretrained_key, variant_key
        from pe_bench.pretrained.rope import RopeSpec, build_variants
        from pe_bench.run.evaluate import EvalConfig

        first = self.records[0]
        self.dims = ModelDims(
            first["d_model"],
            first["num_heads"],
            first["rotary_dim"],
            first["num_layers"],
            first["train_len"],
        )
        spec = RopeSpec(self.dims, float(first["rope_theta"]), {})
        built = build_variants(from_node(EvalConfig, self.cfg["eval"], "eval"), spec)
        self.hf_variants = {v.key: v for v in built}
        self.pe_source = pretrained_key()
        self.caveat = None  # a pretrained model's caveats are its variants'
        self.finetune_caveats: dict[str, str] = {}
        self.finetune_sources: dict[str, str] = {}
        self.pe_options = None
        self.variants = {"none": ("", "")} | {
            v.key: (config_hash(self.variant_cfgs[v.key]), variant_key(v, self.dims)) for v in built
        }
        self.finetunes = {}

    def items(self, record: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """(role, worker item) of each piece of code the record's numbers depend on."""
        dims = {k: getattr(self.dims, k) for k in self.dims.__dataclass_fields__}
        found = []
        if self.hf:
            found.append(("hf code", {"kind": "hf_code"}))
        else:
            found.append(("scheme", _scheme_item(self.cfg["pe"], dims)))
            ft_pe = self.finetunes.get(record.get("finetune"))
            if ft_pe:
                found.append(("fine-tune scheme", _scheme_item(ft_pe, dims)))
        if record["variant"] != "none":
            cfg = self.variant_cfgs.get(record["variant"])
            if cfg is None:
                found.append(("variant", {"kind": "missing"}))
            elif self.hf:
                variant = self.hf_variants[record["variant"]]
                item = {"kind": "scheme", "name": variant.scheme.name, "options": variant.options}
                found.append(("variant", {**item, "dims": dims}))
            else:
                found.append(("variant", _scheme_item(cfg, dims)))
        return found


def _scheme_item(cfg: dict[str, Any], dims: dict[str, int]) -> dict[str, Any]:
    options = {k: v for k, v in cfg.items() if k not in ("name", "plugin")}
    return {
        "kind": "scheme",
        "name": cfg["name"],
        "plugin": cfg.get("plugin"),
        "options": options,
        "dims": dims,
    }


def _item_id(item: dict[str, Any]) -> str:
    return json.dumps(item, sort_keys=True, default=repr)


def _label(item: dict[str, Any]) -> str:
    if item["kind"] == "hf_code":
        return "pretrained code"
    if item["kind"] == "missing":
        return "a variant missing from config.yaml"
    options = ",".join(f"{k}={v}" for k, v in sorted(item["options"].items()) if v is not None)
    dims = item["dims"]
    at = f"d_model {dims['d_model']}, head_dim {dims['head_dim']}, L {dims['train_len']}"
    return f"{item['name']}({options}) [{at}]"


def compare(old: dict[str, Any], new: dict[str, Any]) -> tuple[bool, str]:
    """Whether the old commit's code computes today's numbers, and what differs."""
    if "error" in old or "error" in new:
        return False, f"cannot compare: {old.get('error') or new.get('error')}"
    if "each" in old:  # the pretrained code: normalised syntax trees (module docstring, 3.)
        edited = sorted(
            n for n in old["each"] if n in new["each"] and old["each"][n] != new["each"][n]
        )
        added = sorted(set(new["each"]) - set(old["each"]))
        in_old_modules = [n for n in added if n.split(".")[0] in old["modules"]]
        acting = [n for n in in_old_modules if n not in new["inert"]]
        removed = sorted(set(old["each"]) - set(new["each"]))
        notes = [
            f"{what}: {', '.join(names)}"
            for what, names in (
                ("edited", edited),
                ("added, acting on import", acting),
                ("added", added),
                ("removed", removed),
            )
            if names
        ]
        return not edited and not acting, "; ".join(notes)
    same = old["numbers"] == new["numbers"]
    edited = sorted(
        name
        for name in set(old["classes"]) | set(new["classes"])
        if old["classes"].get(name) != new["classes"].get(name)
    )
    note = "" if same else "numbers differ"
    if edited:
        note += ("; " if note else "") + f"source edited: {', '.join(edited)}"
    return same, note


def migrate(results: Path, check: bool) -> int:
    """Migrate every job folder under ``results``; returns how many records were not."""
    from pe_bench.files import write_jsonl
    from pe_bench.records import POSITIONS, RECORDS

    folders = [Folder(p.parent) for p in sorted(results.glob("**/records.jsonl"))]
    verdicts, then = judge(folders)
    not_migrated = 0
    for folder in folders:
        counts = migrate_folder(folder, verdicts, then)
        not_migrated += sum(n for what, n in counts.items() if what.startswith("not migrated"))
        print(f"{folder.path}: " + "; ".join(f"{n} {what}" for what, n in sorted(counts.items())))
        if (counts["migrated"] or counts["fine-tune caveat refreshed"]) and not check:
            if folder.positions:
                write_jsonl(folder.path / POSITIONS, folder.positions)
            write_jsonl(folder.path / RECORDS, folder.records)
    return not_migrated


Verdicts = dict[tuple[str, str], tuple[bool, str]]  # (commit, item id) -> (same, what differs)
Computed = dict[tuple[str, str], dict[str, Any]]  # (commit, item id) -> what its tree computes


def judge(folders: list[Folder]) -> tuple[Verdicts, Computed]:
    """Whether each commit's code computes today's numbers for each piece of code its records
    depend on (printed as a table), and what each commit's tree computed."""
    needed: dict[str, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
    for folder in folders:
        for record in folder.records:
            for _, item in folder.items(record):
                if item["kind"] != "missing":
                    needed[record["git_sha"]][_item_id(item)] = item
    with tempfile.TemporaryDirectory(prefix="pe-bench-keys-") as scratch:
        every = {k: v for items in needed.values() for k, v in items.items()}
        today = dict(zip(every, run_worker(ROOT, list(every.values())), strict=True))
        then: Computed = {}
        for sha, items in sorted(needed.items()):
            if known(sha):
                computed = run_worker(tree(sha, Path(scratch)), list(items.values()))
            else:  # an unlanded commit's records: kept if already current, else left stale
                computed = [{"error": f"commit {sha[:8]} is not in this repository"}] * len(items)
            then |= {(sha, k): v for k, v in zip(items, computed, strict=True)}

    verdicts: Verdicts = {}
    for (sha, item_id), old in then.items():
        verdicts[(sha, item_id)] = compare(old, today[item_id])
    print("Code that made the committed records, against today's (per commit):")
    for (sha, item_id), (same, note) in sorted(verdicts.items()):
        label = _label(json.loads(item_id))
        print(f"  {sha[:8]} {label:45s} {'same numbers' if same else 'DIFFERENT'} {note}")
    return verdicts, then


def migrate_folder(folder: Folder, verdicts: Verdicts, then: Computed) -> collections.Counter[str]:
    """Give ``folder``'s records (and its position rows) today's key where their code computes
    today's numbers, in memory; returns how many records fared how."""
    from pe_bench.config import config_hash
    from pe_bench.records import RECORD_KEY, record_key

    counts: collections.Counter[str] = collections.Counter()
    renamed: dict[tuple, str] = {}  # old record key -> today's variant_hash
    for record in folder.records:
        today_hash, today_variant = folder.variants.get(record["variant"], (None, None))
        today_tuned = folder.finetune_sources.get(record["run_id"])
        current = (
            record.get("pe_source") == folder.pe_source
            and record.get("finetune_source") == today_tuned
            and (
                record["variant"] == "none"
                or (
                    record.get("variant_source") == today_variant
                    and record["variant_hash"] == today_hash
                )
            )
        )
        if current:
            counts["already under today's key"] += 1
            if _finetune_caveat(folder, record, verdicts):
                counts["fine-tune caveat refreshed"] += 1
            continue
        why = _why_not(folder, record, verdicts, then, config_hash)
        if why:
            counts[f"not migrated: {why}"] += 1
            continue
        old_key = record_key(record)
        _set_after(record, "pe_source", folder.pe_source, "config_hash")
        _todays_words(folder, record, verdicts)
        if record["variant"] != "none":
            record["variant_hash"] = today_hash
            _set_after(record, "variant_source", today_variant, "tokens")
            renamed[old_key] = today_hash
        if today_tuned:
            _set_after(record, "finetune_source", today_tuned, "finetune_lr")
        counts["migrated"] += 1
    for row in folder.positions:
        old_key = (row.get("run_id"), *(row.get(f) for f in RECORD_KEY))
        if old_key in renamed:
            row["variant_hash"] = renamed[old_key]
    return counts


def _why_not(
    folder: Folder,
    record: dict[str, Any],
    verdicts: Verdicts,
    then: Computed,
    config_hash: Any,
) -> str:
    """Why the record cannot get today's key ("" if it can)."""
    sha = record["git_sha"]
    for role, item in folder.items(record):
        if item["kind"] == "missing":
            return f"its variant {record['variant']!r} is not in config.yaml"
        same, note = verdicts[(sha, _item_id(item))]
        if not same:
            return f"its {role} {_label(item)} at {sha[:8]}: {note}"
        if role == "variant":
            cfg = folder.variant_cfgs[record["variant"]]
            old_source = then[(sha, _item_id(item))].get("source_hash")
            made_by = {config_hash(cfg)}
            if old_source:
                made_by.add(config_hash({**cfg, "source": old_source}))
            if record["variant_hash"] not in made_by:
                return f"config.yaml's {record['variant']} did not make it (variant_hash)"
    return ""


def _todays_words(folder: Folder, record: dict[str, Any], verdicts: Verdicts) -> None:
    """What a migrated record says of its code today: the options its label shows and its
    scheme's caveat (the trained scheme's, or its fine-tune scheme's)."""
    if folder.pe_options is not None:  # a default edited: the label follows it
        record.pop("pe_options", None)
        if folder.pe_options:
            _set_after(record, "pe_options", folder.pe_options, "pe_source")
    if folder.caveat is not None and record["variant"] == "none" and "finetune" not in record:
        record.pop("caveat", None)
        if folder.caveat:
            record["caveat"] = folder.caveat
    _finetune_caveat(folder, record, verdicts)


def _finetune_caveat(folder: Folder, record: dict[str, Any], verdicts: Verdicts) -> bool:
    """Give a fine-tuned model's record the caveat its fine-tune scheme has today, where that
    scheme computes today what it computed at the record's commit (the record's key is the
    trained scheme's, so an edited caveat leaves it current); whether the record changed."""
    key = record.get("finetune")
    if key not in folder.finetune_caveats:
        return False
    for role, item in folder.items(record):
        if role == "fine-tune scheme" and not verdicts[(record["git_sha"], _item_id(item))][0]:
            return False
    caveat = folder.finetune_caveats[key]
    if record.get("caveat") == (caveat or None):
        return False
    if caveat:
        _set_after(record, "caveat", caveat, "final_val_loss")
    else:
        record.pop("caveat", None)
    return True


def _set_after(record: dict[str, Any], field: str, value: Any, after: str) -> None:
    """Set ``record[field]``; a new field goes right after ``after``, where runs put it."""
    if field in record or after not in record:
        record[field] = value
        return
    items = list(record.items())
    at = [k for k, _ in items].index(after) + 1
    record.clear()
    record.update([*items[:at], (field, value), *items[at:]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("--check", action="store_true", help="say what would change; write nothing")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / PLUGINS))  # the committed plugin runs' my_pe
    left = migrate(args.results, args.check)
    print(f"{left} records left without today's key (the next run recomputes them)")


if __name__ == "__main__":
    main()
