"""Refused runs (issue 37, items 2 and 7): one line naming the bad value, and nothing made,
neither a job folder nor an ``out_root``."""

from __future__ import annotations

import pytest
import torch

from pe_bench.errors import UserError
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
