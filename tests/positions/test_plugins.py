"""A user's scheme outside the package: the example plugin in examples/my_pe runs through the
CLI and appears in the report next to the built-ins (the commands of
docs/add_your_encoding.md, run as written), and installed plugins are found by entry point."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pe_bench.conformance import assert_conforms
from pe_bench.errors import UserError
from pe_bench.files import read_jsonl
from pe_bench.positions import scheme_class
from pe_bench.records import RECORDS, load_records
from pe_bench.report.build import build_report
from tests.helpers import ROOT, TINY, pe_bench

EXAMPLE = ROOT / "examples" / "my_pe"
DOC = ROOT / "docs" / "add_your_encoding.md"


def doc_commands() -> list[str]:
    """The shell lines of the doc's ``bash`` blocks, in order, with $PWD expanded."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines() if line.strip()]
    return [line.replace("$PWD", str(ROOT)) for line in lines]


@pytest.mark.slow
def test_doc_commands_run_and_the_report_shows_the_plugin_next_to_built_ins(tmp_path):
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    bin_dir = Path(sys.executable).parent
    commands = doc_commands()
    assert [c.split()[0] for c in commands] == [
        "export",
        "pe-bench-check",
        "pe-bench",
        "pe-bench-place",
        "pe-bench-report",
    ]
    outputs = {}
    for command in commands:
        if command.startswith("export "):
            key, value = command.removeprefix("export ").split("=", 1)
            env[key] = value
            continue
        program, *args = shlex.split(command)
        if program == "pe-bench-place":  # trains on the quick protocol: tests/cli/test_place.py
            assert args == ["my_pe", "--onto", "results/quick", "--plugin", "my_pe"]
            continue
        if program == "pe-bench":
            args += [*TINY, f"out_root={tmp_path}"]  # toy sizes, outputs in tmp_path
        if program == "pe-bench-report":
            args = [arg.replace("outputs", str(tmp_path)) for arg in args]
        proc = subprocess.run(
            [str(bin_dir / program), *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=600,
        )
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        outputs[program] = proc.stdout
    assert "my_pe: conforms" in outputs["pe-bench-check"]
    reproduce = (tmp_path / "smoke" / "report.md").read_text().split("## Reproduce")[1]
    assert "hydra.searchpath=[file://" in reproduce  # the plugin's YAML is found through it
    assert "PYTHONPATH=examples/my_pe pe-bench -m" in reproduce  # and its module through this
    assert re.search(r"\| my_pe +\|", outputs["pe-bench-report"])
    folder = tmp_path / "smoke"
    assert set(load_records(folder)["scheme"]) == {"my_pe", "alibi", "rope"}
    report = build_report(folder, out=tmp_path / "report", echo=False)
    for name in ("ppl", "bpb", "score"):
        assert {"my_pe", "alibi", "rope", "rope+ntk"} <= set(report.tables[name]["label"])


@pytest.fixture
def installed_example(tmp_path, monkeypatch, example_plugin):
    """The example as if pip-installed: its module importable and a distribution whose
    entry points are those of examples/my_pe/pyproject.toml; ``my_pe`` not yet registered."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    entry_points = project["project"]["entry-points"]["pe_bench.positions"]
    dist = tmp_path / "pe_bench_my_pe-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pe-bench-my-pe\nVersion: 0.1.0\n")
    lines = [f"{name} = {target}" for name, target in entry_points.items()]
    (dist / "entry_points.txt").write_text("[pe_bench.positions]\n" + "\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return entry_points


def test_installed_plugin_is_found_by_entry_point(installed_example):
    assert installed_example == {"my_pe": "my_pe:LearnedSlopes"}
    cls = scheme_class("my_pe")  # no pe.plugin: loaded lazily from the entry point
    assert cls.__name__ == "LearnedSlopes" and cls.name == "my_pe"
    assert_conforms("my_pe")


def test_unknown_scheme_lists_installed_plugins(installed_example):
    with pytest.raises(
        UserError, match=r"unknown scheme 'my_pee'; registered: .*; installed plugins: my_pe"
    ):
        scheme_class("my_pee")


def test_entry_point_that_does_not_load(tmp_path, monkeypatch):
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[pe_bench.positions]\nbad_pe = no_such_module:X\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    with pytest.raises(UserError, match=r"entry point 'bad_pe' = 'no_such_module:X' does not load"):
        scheme_class("bad_pe")


@pytest.mark.slow
def test_yaml_free_plugin_run(tmp_path):
    """``+pe.plugin`` with an option-free YAML's name replaced: no config file of one's own."""
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE), "HYDRA_FULL_ERROR": "0"}
    args = ["pe=nope", "pe.name=my_pe", "+pe.plugin=my_pe", *TINY, f"out_root={tmp_path}"]
    proc = subprocess.run(
        [sys.executable, "-m", "pe_bench.cli", *args], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert set(load_records(tmp_path)["scheme"]) == {"my_pe"}


PLUGIN = """
from pe_bench.positions import register
from pe_bench.positions.rotary import RoPE


@register("scaled_rope")
class ScaledRoPE(RoPE):
    def inv_freq(self, seq_len):
        return super().inv_freq(seq_len) * {scale}
"""


@pytest.mark.slow
def test_editing_a_plugin_recomputes_its_records(tmp_path):
    """Records carry the key of the scheme's code: after a plugin's formula changes, a rerun
    retrains and recomputes instead of saying its records are all there (issue 17: p_rope
    turned into plain rope was 'skipped')."""
    (tmp_path / "scaled_rope.py").write_text(PLUGIN.format(scale=0.5))
    args = ["pe=rope", "pe.name=scaled_rope", "+pe.plugin=scaled_rope", *TINY]
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    first = pe_bench(*args, out=tmp_path / "out", env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    before = load_records(tmp_path / "out")
    again = pe_bench(*args, out=tmp_path / "out", env=env)
    assert "records are there" in again.stderr + again.stdout  # unchanged code: cached
    (tmp_path / "scaled_rope.py").write_text(PLUGIN.format(scale=0.25))
    edited = pe_bench(*args, out=tmp_path / "out", env=env)
    assert edited.returncode == 0, edited.stderr[-2000:]
    assert "records are there" not in edited.stderr + edited.stdout
    after = load_records(tmp_path / "out")
    assert len(after) == len(before) and set(after["pe_source"]) != set(before["pe_source"])
    assert not after["nll"].equals(before["nll"])  # new code, new numbers


VARIANT_PLUGIN = """
from pe_bench.positions import register
from pe_bench.positions.rotary import PositionInterpolation


@register("edited_pi")
class EditedPI(PositionInterpolation):
    def inv_freq(self, seq_len):
        return super().inv_freq(seq_len) * {scale}
"""


@pytest.mark.slow
def test_editing_a_variant_plugin_recomputes_its_records(tmp_path):
    """An eval-time variant's code is part of its records' identity too: after an edit its
    records are recomputed (the trained model's are kept)."""
    (tmp_path / "edited_pi.py").write_text(VARIANT_PLUGIN.format(scale=1.0))
    args = ["pe=rope", "+eval.variants.edited={name:edited_pi,plugin:edited_pi}", *TINY]
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    first = pe_bench(*args, out=tmp_path / "out", env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    before = load_records(tmp_path / "out").set_index(["variant", "eval_len"])["nll"]
    (tmp_path / "edited_pi.py").write_text(VARIANT_PLUGIN.format(scale=0.5))
    edited = pe_bench(*args, out=tmp_path / "out", env=env)
    assert edited.returncode == 0, edited.stderr[-2000:]
    after = load_records(tmp_path / "out").set_index(["variant", "eval_len"])["nll"]
    assert after.index.equals(before.index)
    assert after.drop("edited").equals(before.drop("edited"))  # the others: found, not redone
    assert not after["edited"].equals(before["edited"])  # new code, new numbers


HELPED_PLUGIN = """
from pe_bench.positions import register
from pe_bench.positions.rotary import RoPE
from helped_scale import scale


@register("helped_rope")
class HelpedRoPE(RoPE):
    def inv_freq(self, seq_len):
        return super().inv_freq(seq_len) * scale()
"""

HELPER = """
def scale():
    \"\"\"{doc}\"\"\"
    return {scale}
"""


@pytest.mark.slow
def test_a_plugins_helper_module_is_part_of_its_key(tmp_path):
    """A plugin whose formula lives in a helper module (issue 29, item 4): rewording the helper
    keeps the records; editing its formula recomputes them, though the plugin's class is the
    same."""
    (tmp_path / "helped_rope.py").write_text(HELPED_PLUGIN)
    (tmp_path / "helped_scale.py").write_text(HELPER.format(doc="The scale.", scale=0.5))
    args = ["pe=rope", "pe.name=helped_rope", "+pe.plugin=helped_rope", *TINY]
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    first = pe_bench(*args, out=tmp_path / "out", env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    before = load_records(tmp_path / "out")
    (tmp_path / "helped_scale.py").write_text(HELPER.format(doc="Reworded.", scale=0.5))
    reworded = pe_bench(*args, out=tmp_path / "out", env=env)
    assert "records are there" in reworded.stderr + reworded.stdout
    (tmp_path / "helped_scale.py").write_text(HELPER.format(doc="The scale.", scale=0.25))
    edited = pe_bench(*args, out=tmp_path / "out", env=env)
    assert edited.returncode == 0, edited.stderr[-2000:]
    assert "records stale, recomputed: pe_source" in edited.stderr + edited.stdout
    after = load_records(tmp_path / "out")
    assert len(after) == len(before) and set(after["pe_source"]) != set(before["pe_source"])
    assert not after["nll"].equals(before["nll"])


@pytest.mark.slow
def test_editing_a_fine_tune_scheme_retrains_the_fine_tune_and_nothing_else(tmp_path):
    """A fine-tune's scheme's code keys its records and checkpoint (``finetune_source``), as a
    variant's does its records: after an edit the fine-tune is trained afresh and its records
    recomputed, while the trained model's records and checkpoint are found, not redone (its
    records were keyed by the trained scheme alone, so the edited fine-tune's were kept)."""
    (tmp_path / "edited_pi.py").write_text(VARIANT_PLUGIN.format(scale=1.0))
    tuned = ["+finetune@finetunes.pi=pi", "finetunes.pi.pe.name=edited_pi"]
    tuned += ["+finetunes.pi.pe.plugin=edited_pi", "finetunes.pi.steps=2"]
    args = ["pe=rope", *tuned, "finetunes.pi.warmup_steps=1", "eval.variants=null", *TINY]
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    first = pe_bench(*args, out=tmp_path / "out", env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    (records,) = (tmp_path / "out").rglob(RECORDS)
    before = read_jsonl(records)
    (tmp_path / "edited_pi.py").write_text(VARIANT_PLUGIN.format(scale=0.5))
    edited = pe_bench(*args, out=tmp_path / "out", env=env)
    assert edited.returncode == 0, edited.stderr[-2000:]
    log = edited.stderr + edited.stdout
    assert "3 records stale, recomputed: finetune_source" in log
    assert "train rope: resumed at step 3 of 3" in log  # the trained model's checkpoint
    assert "checkpoint-pi.pt belongs to another config; training from scratch" in log
    after = read_jsonl(records)
    assert [r for r in after if "finetune" not in r] == [r for r in before if "finetune" not in r]
    old, new = ([r for r in rows if "finetune" in r] for rows in (before, after))
    assert [r["eval_len"] for r in new] == [r["eval_len"] for r in old] == [16, 32, 64]
    assert {r["finetune_source"] for r in new}.isdisjoint(r["finetune_source"] for r in old)
    assert all(a["nll"] != b["nll"] for a, b in zip(old, new, strict=True))  # new code, numbers
