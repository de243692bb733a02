"""Conformance kit: does a position scheme keep the contract the benchmark relies on?

From a shell (PASS/FAIL per check with a one-line reason; exit status 1 on any failure; then
what the scheme costs against rope, unless ``--no-cost``: ``scheme_cost_report``)::

    pe-bench-check my_pe --plugin my_pkg.my_pe --option max_len=512

From a user's tests::

    from pe_bench.conformance import assert_conforms

    def test_my_pe_conforms():
        assert_conforms("my_pe", plugin="my_pkg.my_pe")

The checks build a tiny model around the scheme (its parameters perturbed where a check needs
every term to count, e.g. zero-initialised tables) and verify:

- ``build``: the scheme builds from its config;
- ``causality``: changing a token never changes an earlier output, through the real model, in
  train and eval mode, at 3x the training length;
- ``devices_dtypes``: every hook keeps shapes, dtype and device (cpu, cuda when present;
  float32 and bfloat16), and a bfloat16 model agrees with the float32 one;
- ``query_chunks``: queries passed alone (s_q < s_k) get the same logits as the last s_q rows
  of the full matrix (they are the *last* s_q keys);
- ``lengths``: lengths up to 4x training (or ``max_positions``) give finite outputs;
  ``check_length`` refuses lengths past ``max_positions`` with a clear ``UserError`` (the run
  calls it for every length before training; the forward pass itself never checks);
- ``determinism``: the same seed builds the same parameters; repeated passes are identical;
- ``gradients``: every trainable parameter of the scheme gets a finite, non-zero gradient;
- ``relative``: when the scheme declares ``relative = True`` (itself or by inheritance), the
  logits do not change when every position shifts by a constant, nor when the same tokens sit
  later in a window of the same length (catches a term that reads a token's index in the
  window rather than its position, as SSMax's ln n does);
- ``logit_hooks``: ``logit_scale`` gives ``[s_q]`` or ``[n_h, s_q]``, finite; a scheme that
  declares ``scales_bias`` has a content-free bias and a scale to put on it; and
  ``attention_weights`` (where overridden) is finite, non-negative, sums to at most 1 per
  query and puts no weight on a future key;
- ``attention_mask``: where a scheme hides keys the causal rule allows (chunked or
  sliding-window attention), the mask is bool ``[s_q, s_k]``, keeps every query's own key
  (else its row has nothing to attend), gives the same rows for query chunks, and does not
  move with the positions where the scheme declares ``relative``;
- ``attend``: where a scheme computes the attention itself from the layer's input, it gives
  ``[b, n_h, s, h_d]`` in v's dtype, finite, and the first t rows of a window are those of its
  first t tokens attended alone (at 3x training and at an odd length past 4x);
- ``calibration``: where a scheme fits something on held-out text before evaluation
  (``calibrate``), it returns a line for the records, changes no parameter of the model, does
  not raise the held-out loss it fits, keeps a length calibrated before when another is, is
  deterministic and leaves the model causal;
- ``content_bias``: a bias declared content-free does not change with q and k (a fast path may
  cache it), and has no batch dimension;
- ``shared_bias``: a bias declared shared (``shared_bias = True``) is the same in every layer,
  since the model builds it once per forward pass;
- ``score_mod``: the FlexAttention form of the bias (``model.attention=flex``), where there is
  one, adds the same term as ``score_bias``;
- ``key_bias``: where the scheme gives its bias as a term of the key alone (the fused path
  without a mask), the bias minus that term is the same along every query's row;
- ``reference``: when the scheme has ``score_bias_reference``, it equals ``score_bias``.

Each check is a function in ``pe_bench.conformance.checks`` (the model's contract),
``hooks`` (what the logit hooks declare) or ``attend`` (a scheme's own attention), run in this
order (``CHECKS``); ``pe_bench.conformance.harness`` builds the tiny model they share.
"""

from __future__ import annotations

import textwrap
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pe_bench.conformance.attend import check_attend
from pe_bench.conformance.calibrate import check_calibration
from pe_bench.conformance.checks import (
    check_build,
    check_causality,
    check_determinism,
    check_devices_dtypes,
    check_gradients,
    check_lengths,
    check_query_chunks,
)
from pe_bench.conformance.cost import Cost, scheme_cost
from pe_bench.conformance.harness import Failed, Setup, Skipped, build_setup
from pe_bench.conformance.hooks import (
    check_attention_mask,
    check_content_bias,
    check_key_bias,
    check_logit_hooks,
    check_reference,
    check_relative,
    check_score_mod,
    check_shared_bias,
)
from pe_bench.errors import UserError
from pe_bench.model.gpt import ModelConfig
from pe_bench.positions import PositionScheme

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # PASS, FAIL or SKIP
    reason: str
    trace: str = ""  # a crash's traceback (``pe-bench-check --verbose`` prints it)

    def __str__(self) -> str:
        return f"{self.status} {self.name}: {self.reason}"


@dataclass
class CheckReport:
    """The outcome of every check on one scheme."""

    scheme: str
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def __getitem__(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def __str__(self) -> str:
        return self.text()

    def text(self, verbose: bool = False) -> str:
        """One line per check and the verdict; ``verbose`` adds each crash's traceback."""
        failed = len(self.failures)
        verdict = f"{failed} of {len(self.checks)} checks failed" if failed else "conforms"
        lines = []
        for check in self.checks:
            lines.append(str(check))
            if verbose and check.trace:
                lines.append(textwrap.indent(check.trace.rstrip(), "    "))
        return "\n".join([*lines, f"{self.scheme}: {verdict}"])


# The checks in the order of the docstring's list, which the report keeps.
CHECKS: dict[str, Callable[[Setup], str]] = {
    "build": check_build,
    "causality": check_causality,
    "devices_dtypes": check_devices_dtypes,
    "query_chunks": check_query_chunks,
    "lengths": check_lengths,
    "determinism": check_determinism,
    "gradients": check_gradients,
    "relative": check_relative,
    "logit_hooks": check_logit_hooks,
    "attention_mask": check_attention_mask,
    "attend": check_attend,
    "calibration": check_calibration,
    "content_bias": check_content_bias,
    "shared_bias": check_shared_bias,
    "score_mod": check_score_mod,
    "key_bias": check_key_bias,
    "reference": check_reference,
}


def _run(name: str, check: Callable[[Setup], str], setup: Setup) -> Check:
    try:
        return Check(name, PASS, check(setup))
    except Skipped as skip:
        return Check(name, SKIP, str(skip))
    except Failed as failure:  # one caught from a crash says where the crash was
        cause = failure.__cause__ or failure.__context__
        return crashed(name, cause, str(failure)) if cause else Check(name, FAIL, str(failure))
    except UserError as err:
        if name == "build":
            raise  # a bad config (unknown option, bad value) is the caller's error
        return crashed(name, err, f"raised UserError: {err}")
    except Exception as err:  # a crash inside a hook is a failure of the scheme, reported
        return crashed(name, err, f"raised {type(err).__name__}: {err}")


TORCH_DIR = Path(torch.__file__).parent


def crashed(name: str, err: BaseException, reason: str) -> Check:
    """A failed check whose ``reason`` comes from a crash ``err``: with where it was raised
    (the innermost frame outside torch, usually the scheme's hook), and the traceback for
    ``--verbose``."""
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if TORCH_DIR not in Path(f.filename).parents
    ]
    where = (
        f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    )
    trace = "".join(traceback.format_exception(err))
    return Check(name, FAIL, f"{reason}{where}", trace)


def check_scheme(
    scheme: str | type[PositionScheme],
    *,
    options: Mapping[str, Any] | None = None,
    plugin: str | None = None,
    model: ModelConfig | None = None,
    train_len: int = 16,
) -> CheckReport:
    """Run every check on a scheme (a registered name or a class) and report each outcome.

    Args:
        scheme (str | type[PositionScheme]): the registered name, or the class itself.
        options (Mapping[str, Any] | None): the scheme's config options. Default: None.
        plugin (str | None): a module to import first (``pe.plugin``). Default: None.
        model (ModelConfig | None): the model to check in. Default: None, meaning d_model 32,
            2 layers, 4 heads.
        train_len (int): the training length the scheme is built for. Default: 16.
    """
    setup = build_setup(scheme, options or {}, plugin, model, train_len)
    report = CheckReport(setup.label)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the models are tiny: one thread is fastest, even on a busy CPU
    try:
        for name, check in CHECKS.items():
            report.checks.append(_run(name, check, setup))
            if name == "build" and report.checks[-1].status == FAIL:
                break
    finally:
        torch.set_num_threads(threads)
    return report


def scheme_cost_report(
    scheme: str | type[PositionScheme],
    *,
    options: Mapping[str, Any] | None = None,
    plugin: str | None = None,
    repeats: int = 3,
) -> Cost:
    """What the scheme costs against rope in the quick suite's model, on one CPU thread
    (``pe_bench.conformance.cost.scheme_cost``): a training step and a 1024-token evaluation,
    and the attention path its hooks give it."""
    setup = build_setup(scheme, options or {}, plugin, None, 64)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return scheme_cost(setup.make, setup.label, repeats=repeats)
    finally:
        torch.set_num_threads(threads)


def assert_conforms(scheme: str | type[PositionScheme], **kwargs: Any) -> CheckReport:
    """``check_scheme``, raising an ``AssertionError`` with the report if any check fails."""
    report = check_scheme(scheme, **kwargs)
    if not report.passed:
        raise AssertionError(f"{report.scheme} does not conform:\n{report}")
    return report
