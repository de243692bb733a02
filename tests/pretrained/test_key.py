"""The pretrained key (``pe_bench.pretrained.key``) is derived from the code: every module-level
definition of the modules of ``pe_bench.pretrained`` that compute numbers keys a pretrained
model's records, so a function added there (a RULER generator, a DCA patch) changes the key
without anyone adding it to a list; docstrings, comments, log lines and the order of
definitions do not, nor do the pipeline's modules (``key.PIPELINE``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pe_bench.pretrained import key

PACKAGE = Path(key.__file__).parent


@pytest.fixture
def package(tmp_path) -> Path:
    """A copy of ``pe_bench/pretrained`` to edit."""
    copy = tmp_path / "pretrained"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_the_key_is_that_of_the_package_s_source(package):
    assert key.pretrained_key(package) == key.pretrained_key()


def test_a_function_added_to_a_pretrained_module_is_in_the_key(package):
    before = key.pretrained_key(package)
    with open(package / "passkey.py", "a") as f:
        f.write('\n\ndef ruler_needles(n: int) -> list[int]:\n    """RULER."""\n    return [n]\n')
    assert "passkey.ruler_needles" in key.definitions(package)
    assert key.pretrained_key(package) != before


def test_a_new_pretrained_module_is_in_the_key(package):
    before = key.pretrained_key(package)
    (package / "dca.py").write_text("CHUNK = 256\n\n\ndef chunk(n):\n    return n // CHUNK\n")
    assert {"dca.CHUNK", "dca.chunk"} <= set(key.definitions(package))
    assert key.pretrained_key(package) != before


def test_an_edited_constant_or_function_changes_the_key(package):
    before = key.pretrained_key(package)
    source = (package / "windowed.py").read_text()
    (package / "windowed.py").write_text(source.replace("BLOCK = 256", "BLOCK = 128"))
    edited = key.pretrained_key(package)
    assert edited != before
    (package / "windowed.py").write_text(source.replace("return", "return  ", 1))  # formatting
    assert key.pretrained_key(package) == before


def test_docstrings_comments_log_lines_and_order_do_not_count(package):
    before = key.pretrained_key(package)
    path = package / "passkey.py"
    source = path.read_text()
    assert "\ndef first_integer(" in source and "\ndef answered(" in source
    head, first = source.split("\ndef first_integer(", 1)
    first, rest = first.split("\ndef answered(", 1)
    moved = head + "\ndef answered(" + rest + "\n\ndef first_integer(" + first  # reordered
    moved = moved.replace('    """', '    """Reworded. ', 1)  # a docstring
    moved += "\n# a comment\nlog.info('loaded')\n"
    path.write_text(moved)
    assert key.pretrained_key(package) == before


@pytest.mark.parametrize("module", key.PIPELINE)
def test_the_pipeline_s_modules_are_not_in_the_key(package, module):
    before = key.pretrained_key(package)
    with open(package / module, "a") as f:
        f.write("\n\nEXTRA = 1\n")
    assert key.pretrained_key(package) == before


def test_every_method_module_is_in_the_key():
    modules = {name.split(".")[0] for name in key.definitions()}
    assert {"rope", "windowed", "passkey", "tail"} <= modules
    assert not modules & {m.removesuffix(".py") for m in key.PIPELINE}


def test_pretrained_records_carry_the_key():
    from pe_bench.pretrained.evaluate import code_hash

    assert code_hash() == key.pretrained_key()
