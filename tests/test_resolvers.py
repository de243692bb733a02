"""The config resolvers (``pe_bench/resolvers.py``): registered for any process that imports
pe-bench (a launcher's worker resolves ``${run_dir:}`` before any pe-bench function runs), and
a job folder's name from its overrides."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pe_bench.resolvers import RESOLVERS, run_dir_name


@pytest.mark.slow
def test_importing_any_module_of_pe_bench_registers_every_resolver():
    """The lowest module (errors.py), imported alone in a fresh process, as a worker that
    unpickles a job imports what it needs."""
    code = (
        "import pe_bench.errors; from omegaconf import OmegaConf; "
        f"print(all(OmegaConf.has_resolver(n) for n in {sorted(RESOLVERS)}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "True"


def test_every_resolver_conf_uses_is_registered():
    """Every ``${name:...}`` of conf/'s YAML files is one of ``RESOLVERS`` (or Hydra's own)."""
    import re

    from tests.helpers import ROOT

    used = {
        name
        for path in (ROOT / "conf").rglob("*.yaml")
        for name in re.findall(r"\$\{(\w+):", path.read_text())
    }
    assert used - {"oc", "hydra"} <= set(RESOLVERS) and "run_dir" in used


def test_a_job_folder_is_named_after_its_overrides_without_slashes():
    assert run_dir_name("") == "default"
    assert run_dir_name("pe=rope,train.seed=1") == "pe=rope,train.seed=1"
    assert run_dir_name("data.path=/a/b") == "data.path=_a_b"


def test_a_long_job_folder_name_is_cut_with_a_hash_of_the_whole():
    long_a, long_b = "pe.x=" + "a" * 200, "pe.x=" + "a" * 199 + "b"
    a, b = run_dir_name(long_a), run_dir_name(long_b)
    assert len(a.encode()) == 111 and a[:100] == long_a[:100] and a != b
    assert len(run_dir_name("é" * 70).encode()) <= 111  # cut on a character, not inside one
