"""Refused runs (issue 37, items 2 and 7): one line naming the bad value, and nothing made,
neither a job folder nor an ``out_root``."""

from __future__ import annotations

import pytest
import torch

from pe_bench.errors import UserError
from pe_bench.run.config import RunConfig
from pe_bench.run.plan import plan
from pe_bench.run.train import resolve_device


@pytest.mark.parametrize("name", ["mps", "foo", "meta", "cuda", "cuda:7"])
def test_a_device_that_is_not_here_is_one_line(name):
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("a machine with an accelerator")
    with pytest.raises(UserError, match=rf"train.device='{name}'.*(allowed|use auto or cpu)"):
        resolve_device(name)


def test_cpu_and_auto_are_devices():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda")


def test_a_scheme_whose_hooks_fail_on_the_key_s_probe_is_refused_by_the_plan(tiny_config):
    """Planned, not met while the job loads its data: the sweep is refused before any job
    starts (issue 37, item 3: the sweep ran, then lost its report to a traceback)."""
    cfg = tiny_config("pe=nope", "pe.name=probe_raises", "+pe.plugin=tests.plugins.hook_raises")
    with pytest.raises(
        UserError,
        match=r"^probe_raises: its hooks raised RuntimeError: the "
        r"plugin's bias is broken on the probe .* pe-bench-check probe_raises "
        r"--plugin tests.plugins.hook_raises shows which hook$",
    ):
        plan(RunConfig.parse(cfg))
