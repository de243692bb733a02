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
