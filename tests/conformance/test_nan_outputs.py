"""A scheme whose outputs are NaN fails every check that reads them, saying so (issue 37,
item 8: pe-bench-check printed PASS for causality and relative, and 'differ by nan' for
determinism)."""

from __future__ import annotations

import pytest
import torch

from pe_bench.conformance.harness import Failed, max_diff
from pe_bench.conformance.kit import FAIL, check_scheme

from ..plugins import broken_pe


@pytest.mark.slow  # the whole kit on one scheme
def test_a_nan_scheme_fails_causality_relative_and_determinism_naming_the_nan():
    report = check_scheme(broken_pe.AllNaN)
    for name in ("causality", "relative", "determinism"):
        assert report[name].status == FAIL, (name, report[name].reason)
        assert report[name].reason.startswith("the output holds NaN"), report[name].reason


def test_a_nan_fails_a_comparison_and_equal_infinities_do_not():
    with pytest.raises(Failed, match=r"the output holds NaN \(1 of 3 values\)"):
        max_diff(torch.tensor([0.0, float("nan"), 1.0]), torch.zeros(3))
    masked = torch.tensor([0.0, -float("inf")])
    assert max_diff(masked, masked.clone()) == 0.0
    assert max_diff(masked, torch.zeros(2)) == float("inf")
