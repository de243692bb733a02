"""experiments/migrate_keys.py's proof for a pretrained model's records (module docstring, 3.):
the old commit's definitions of ``pe_bench/pretrained`` unchanged today, an added definition
that does nothing on import allowed, an edited one or one that acts on import refused (what a
tree's code is: experiments/migrate_worker.py; the comparison: migrate_keys.compare)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def script(name: str):
    """experiments/<name>.py as a module (a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def migrate():
    return script("migrate_keys")


@pytest.fixture(scope="module")
def worker():
    return script("migrate_worker")


def code_of(worker, monkeypatch, tmp_path: Path, edit: str = "", module: str = "passkey") -> dict:
    """``_hf_code()`` of a copy of today's package with ``edit`` appended to ``module``."""
    package = tmp_path / "pe_bench"
    shutil.copytree(ROOT / "pe_bench" / "pretrained", package / "pretrained")
    (package / "__init__.py").write_text("")
    with open(package / "pretrained" / f"{module}.py", "a") as f:
        f.write(edit)
    fake = type("Package", (), {"__file__": str(package / "__init__.py")})
    monkeypatch.setattr(worker.importlib, "import_module", lambda name: fake)
    return worker._hf_code()


@pytest.mark.slow  # 2 s each: copies of the package
@pytest.mark.parametrize(
    ("edit", "same"),
    [
        ("", True),
        ("\n\ndef ruler(n):\n    return n\n\n\nNEEDLES = (1, 2)\n", True),  # added, inert
        ("\n\n@register\ndef ruler(n):\n    return n\n", False),  # acts on import
        ("\n\nPATCHED = patch()\n", False),  # calls something on import
        ("\n\nprint('x')\n", False),  # a top-level statement
        ("\n\nKEYS = (1, 9)\n", False),  # rebinds a definition: edited
        ("\n\n@dataclass(frozen=True)\nclass Needle:\n    depth: float\n", True),
    ],
)
def test_an_old_commit_s_code_proves_the_numbers_unless_edited(
    migrate, worker, monkeypatch, tmp_path, edit, same
):
    old = code_of(worker, monkeypatch, tmp_path / "old")
    new = code_of(worker, monkeypatch, tmp_path / "new", edit)
    assert migrate.compare(old, new)[0] is same


LOOPS = {
    "plain": (
        "def run(xs):\n    out = []\n    for x in xs:\n        out.append(x)\n    return out\n"
    ),
    "logged": (
        "def run(xs):\n    out = []\n    for n, x in enumerate(xs, 1):\n        out.append(x)\n"
        "        log.info('trial %d', n)\n    return out\n"
    ),
    "read": (
        "def run(xs):\n    out = []\n    for n, x in enumerate(xs, 1):\n        out.append(n * x)\n"
        "    return out\n"
    ),
}


def test_a_loop_counter_read_by_log_lines_alone_is_compared_out(worker):
    from pe_bench.pretrained import key

    proof = {name: worker._proof_source(source, key) for name, source in LOOPS.items()}
    assert proof["plain"] == proof["logged"] != proof["read"]


@pytest.mark.slow  # 2 s: copies of the package
def test_a_new_module_cannot_have_computed_old_numbers(migrate, worker, monkeypatch, tmp_path):
    old = code_of(worker, monkeypatch, tmp_path / "old")
    acting = "\n\n@register\ndef niah(n):\n    return n\n\n\nprint('imported')\n"
    new = code_of(worker, monkeypatch, tmp_path / "new", acting, module="dca")
    assert migrate.compare(old, new)[0] is True
    edited = code_of(worker, monkeypatch, tmp_path / "edited", "\n\nBLOCK = 1\n", "windowed")
    assert migrate.compare(old, edited)[0] is False


class FineTuned:
    """A job folder of one fine-tune, ``drope``, whose scheme today has ``caveat``."""

    def __init__(self, migrate, caveat: str) -> None:
        self.finetune_caveats = {"drope": caveat}
        self.ft_item = migrate._scheme_item({"name": "drope"}, {"train_len": 64})

    def items(self, record: dict) -> list:
        return [("fine-tune scheme", self.ft_item)] if record.get("finetune") else []


@pytest.mark.parametrize("same", [True, False])
def test_a_fine_tuned_record_gets_its_fine_tune_scheme_s_caveat_where_the_numbers_hold(
    migrate, same
):
    """A fine-tuned record's key is the trained scheme's: its fine-tune scheme's edited caveat
    reaches it only through the script, in place, and only where that scheme's code at the
    record's commit computes today's numbers."""
    folder = FineTuned(migrate, "new words")
    record = {"git_sha": "abc", "final_val_loss": 1.0, "caveat": "old", "finetune": "drope"}
    verdicts = {("abc", migrate._item_id(folder.ft_item)): (same, "")}
    assert migrate._finetune_caveat(folder, record, verdicts) is same
    assert record["caveat"] == ("new words" if same else "old")
    assert list(record) == ["git_sha", "final_val_loss", "caveat", "finetune"]
    trained = {"git_sha": "abc", "caveat": "rope's"}
    assert not migrate._finetune_caveat(folder, trained, verdicts) and trained["caveat"] == "rope's"


class KeyedBefore(FineTuned):
    """A job folder of a rope model and its ``drope`` fine-tune, whose records were written
    before they carried ``finetune_source``."""

    def __init__(self, migrate) -> None:
        super().__init__(migrate, "")
        dims = {"d_model": 32, "head_dim": 8, "train_len": 64}
        self.ft_item = migrate._scheme_item({"name": "drope"}, dims)
        made = {"git_sha": "abc", "variant": "none", "config_hash": "h", "pe_source": "k1"}
        tuned = {"finetune": "drope", "finetune_lr": 2e-4, "final_val_loss": 1.0}
        self.records = [{"run_id": "a", **made}, {"run_id": "a:drope", **made, **tuned}]
        self.positions: list = []
        self.pe_source, self.finetune_sources = "k1", {"a:drope": "f1"}
        self.variants = {"none": ("", "")}
        self.pe_options = self.caveat = None


@pytest.mark.parametrize("same", [True, False])
def test_a_fine_tuned_record_gets_the_key_of_its_fine_tune_scheme_where_the_numbers_hold(
    migrate, same
):
    """A fine-tuned record gets ``finetune_source`` (after ``finetune_lr``, where runs put it)
    only where its fine-tune scheme's code at its commit computes today's numbers; else it
    keeps what it has and the next run recomputes it. A second pass changes nothing."""
    folder = KeyedBefore(migrate)
    trained, tuned = (dict(r) for r in folder.records)
    note = "" if same else "numbers differ"
    verdicts = {("abc", migrate._item_id(folder.ft_item)): (same, note)}
    counts = migrate.migrate_folder(folder, verdicts, {})
    assert folder.records[0] == trained and counts["already under today's key"] == 1
    if same:
        assert counts["migrated"] == 1
        assert list(folder.records[1]) == [*list(tuned)[:7], "finetune_source", "final_val_loss"]
        assert folder.records[1]["finetune_source"] == "f1"
        again = migrate.migrate_folder(folder, verdicts, {})
        assert again == {"already under today's key": 2}
    else:
        assert folder.records[1] == tuned
        assert [w for w in counts if w.startswith("not migrated")] == [
            "not migrated: its fine-tune scheme drope() [d_model 32, head_dim 8, L 64] at abc: "
            "numbers differ"
        ]


def test_a_commit_missing_from_the_repository_is_known_as_missing(migrate):
    """A record made at an unlanded commit (results/zoo's pope, at 6b7ef72) cannot have its
    code compared: its items say so instead of the script stopping on git's error."""
    head = migrate.subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert migrate.known(head) and not migrate.known("6b7ef72c8ad3ba3e34769a7fe10ba853e2b75b97")
