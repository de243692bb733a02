"""The key of a scheme's code (``pe_bench.positions.fingerprint``): a refactor keeps it, an
edited formula (in the class or in a helper module it imports) changes it, and nothing about
the machine, the threads or the order of options moves it."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pe_bench.errors import UserError
from pe_bench.positions import ModelDims, registered, scheme_key
from pe_bench.positions.fingerprint import Float64, class_key, key_parts, numbers_digest

ROOT = Path(__file__).parents[2]

HELPER = '''
"""Distances for the plugin: {doc}"""

import torch


def distances(q_pos, k_pos):
    # how far back each key is
    return (q_pos[:, None] - k_pos[None, :]).clamp(min=0).to(torch.float32) * {scale}
'''

SCHEME = '''
import torch
from torch import nn

from pe_bench.positions import PositionScheme
{imports}


class Slopes(PositionScheme):
    """{doc}"""

    relative = True

    def __init__(self, dims, *, width: float = 1.0):
        super().__init__(dims)
        self.width = width
        self.slopes = nn.Parameter(torch.zeros(dims.num_heads))  # zero-initialised: perturbed

    def score_bias(self, q, k, q_pos, k_pos, layer):
        {body}
'''

INLINE = "return -self.slopes[:, None, None] * (q_pos[:, None] - k_pos[None, :]).clamp(min=0)"
HELPED = "return -self.slopes[:, None, None] * distances(q_pos, k_pos) / self.width"


def plugin(tmp_path: Path, module: str, body: str = INLINE, doc: str = "A bias.", helper=None):
    """Write ``module`` (a scheme ``Slopes``; with ``helper``, the ``doc`` and ``scale`` of a
    helper module of its own that it imports) under ``tmp_path``; the class, freshly imported."""
    imports = ""
    if helper:
        (tmp_path / f"{module}_helper.py").write_text(HELPER.format(**helper))
        imports = f"from {module}_helper import distances"
    (tmp_path / f"{module}.py").write_text(SCHEME.format(imports=imports, doc=doc, body=body))
    for name in (module, f"{module}_helper"):
        sys.modules.pop(name, None)
    importlib.invalidate_caches()
    return importlib.import_module(module).Slopes


@pytest.fixture
def path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # a rewrite is read again
    return tmp_path


def test_a_refactor_keeps_the_key(path):
    """The same class in another module (file), with its docstring edited, comments added and
    its lines laid out otherwise, has the same key."""
    first = plugin(path, "first_home")
    moved = SCHEME.format(imports="", doc="Moved, and documented at length.", body=INLINE)
    moved = moved.replace("    relative = True\n", "    relative = True  # i - j only\n\n")
    (path / "second_home.py").write_text("# a comment\n" + textwrap.dedent(moved))
    second = importlib.import_module("second_home").Slopes
    assert first.__module__ != second.__module__
    assert class_key(first) == class_key(second)


def test_an_edited_formula_changes_the_key(path):
    before = key_parts(plugin(path, "formula"), {})
    edited = plugin(path, "formula", body=INLINE.replace("clamp(min=0)", "clamp(min=0) * 0.5"))
    after = key_parts(edited, {})
    assert after["source"] != before["source"] and after["numbers"] != before["numbers"]
    assert class_key(edited) != class_key(plugin(path, "formula"))


def test_an_edited_helper_module_changes_the_key_and_its_docstring_does_not(path):
    """A plugin whose formula lives in a helper module (issue 29, item 4): the class's own
    source is the same, its numbers are not."""
    key = key_parts(plugin(path, "helped", HELPED, helper={"doc": "distances.", "scale": 1.0}), {})
    reworded = plugin(path, "helped", HELPED, helper={"doc": "how far back.", "scale": 1.0})
    assert key_parts(reworded, {}) == key
    edited = plugin(path, "helped", HELPED, helper={"doc": "distances.", "scale": 2.25})
    assert key_parts(edited, {})["source"] == key["source"]
    assert key_parts(edited, {})["numbers"] != key["numbers"]
    assert class_key(edited) != class_key(reworded)


@pytest.mark.slow
def test_an_option_that_changes_the_numbers_changes_the_key_and_their_order_does_not():
    yarn = {"name": "yarn", "base": 10000.0, "factor": 2.0, "beta_fast": 32.0, "beta_slow": 1.0}
    reordered = dict(reversed(list(yarn.items())))
    assert list(reordered) != list(yarn)
    assert scheme_key(yarn) == scheme_key(reordered)
    cls = registered()["yarn"]
    options = {k: v for k, v in yarn.items() if k != "name"}
    reversed_options = dict(reversed(list(options.items())))
    assert numbers_digest(cls, options) == numbers_digest(cls, reversed_options)
    assert scheme_key({**yarn, "factor": 4.0}) != scheme_key(yarn)


def test_computing_a_key_leaves_torch_as_it_was():
    """The random stream, the default dtype and grad mode are those of before; the key does not
    depend on them."""
    cls = registered()["fire"]
    key = key_parts(cls, {})
    torch.manual_seed(3)
    state = torch.get_rng_state()
    assert key_parts(cls, {}) == key
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()
    assert torch.ones(2).float().dtype == torch.float32


def test_the_probe_computes_in_float64():
    with Float64():
        assert torch.ones(2).float().dtype == torch.float64
        assert torch.zeros(2, dtype=torch.float32).dtype == torch.float64
        assert torch.ones(2).to("cpu", torch.float32).dtype == torch.float64


@pytest.mark.slow
def test_every_built_in_scheme_has_a_key():
    built_in = {n: c for n, c in registered().items() if c.__module__.startswith("pe_bench.")}
    keys = {name: class_key(cls) for name, cls in built_in.items()}
    assert all(len(key) == 12 for key in keys.values())
    assert keys["rope"] != keys["xpos"] != keys["pi"]


def test_options_that_need_the_models_dims_build_the_probe_there():
    """LongRoPE with its head_dim / 2 factors cannot be built for the probe's head_dim: the
    model's dims are used (and are needed)."""
    dims = ModelDims(d_model=64, num_heads=2, head_dim=32, num_layers=2, train_len=32)
    cfg = {"name": "longrope", "short_factor": [1.0] * 16, "long_factor": [2.0] * 16}
    assert len(scheme_key(cfg, dims)) == 12
    with pytest.raises(UserError):
        scheme_key(cfg)


KEYS = """
import json, torch
torch.set_num_threads({threads})
from pe_bench.positions import registered
from pe_bench.positions.fingerprint import class_key
print(json.dumps({{n: class_key(registered()[n]) for n in {names}}}))
"""


@pytest.mark.slow
def test_the_key_is_the_same_with_other_cpu_kernels_and_thread_counts():
    """Another vector unit (ATen's scalar kernels instead of AVX2/AVX512) and two threads give
    the keys of this process (CoPE's and DAPE's float32 matmuls included)."""
    names = ["cope", "dape_alibi", "fox", "rope", "yarn", "t5"]
    here = {name: class_key(registered()[name]) for name in names}
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    code = KEYS.format(threads=2, names=names)
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert json.loads(there.stdout) == here
