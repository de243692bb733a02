"""The conformance kit: every built-in scheme passes it, and it fails deliberately broken
plugins (tests/plugins/broken_pe.py) with a message that says what is wrong."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pe_bench.cli.check import main
from pe_bench.conformance.kit import FAIL, PASS, SKIP, assert_conforms, check_scheme
from pe_bench.errors import UserError
from pe_bench.positions import PositionScheme, registered
from tests.helpers import ROOT, TRAINABLE, VARIANTS, fast_lane
from tests.plugins import broken_pe


@pytest.mark.parametrize("name", fast_lane(TRAINABLE + VARIANTS))
def test_every_built_in_scheme_conforms(name):
    report = assert_conforms(name)
    cls = registered()[name]
    assert report["causality"].status == PASS
    assert report["relative"].status == (PASS if cls.relative else SKIP)
    has_reference = hasattr(cls, "score_bias_reference")
    assert report["reference"].status == (PASS if has_reference else SKIP)
    assert report["shared_bias"].status == (PASS if cls.shared_bias else SKIP)
    flex = cls.relative and not cls.content_bias and report["content_bias"].status == PASS
    assert report["score_mod"].status == (PASS if flex else SKIP)
    key_bias = cls.key_bias is not PositionScheme.key_bias  # fox's gates, bipe_alibi's m_h c_j
    assert report["key_bias"].status == (PASS if key_bias else SKIP)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scheme", "check", "message"),
    [
        (broken_pe.LeaksFuture, "causality", "changed the output at earlier position"),
        (broken_pe.FakeRelative, "relative", "declares relative = True, but its logits change"),
        (broken_pe.UndeclaredContent, "content_bias", "changes by .* with the contents of q"),
        (broken_pe.LayerBiasShared, "shared_bias", "differs by .* between layers 0 and 1"),
        (broken_pe.WrongScoreMod, "score_mod", "score_mod and score_bias differ by"),
        (broken_pe.WrongReference, "reference", "score_bias and score_bias_reference differ"),
        (broken_pe.FirstQueries, "query_chunks", "the queries are the last s_q keys"),
        (broken_pe.UnguardedTable, "lengths", "length 64 .* raised IndexError"),
        (broken_pe.LowPrecisionAngles, "devices_dtypes", "bfloat16: logits at positions 1000"),
        (broken_pe.UnusedParameter, "gradients", "parameter 'slope' gets no gradient"),
        (broken_pe.UnseededInit, "determinism", "two builds under the same seed differ"),
        (broken_pe.IndexScaledRoPE, "relative", "inherits relative = True from RoPE, .* index"),
        (broken_pe.WrongScaleShape, "logit_hooks", r"logit_scale gave shape \(1, 49\)"),
        (broken_pe.ScalesNoBias, "logit_hooks", "needs a logit_scale and a content-free"),
        (broken_pe.FutureWeights, "logit_hooks", "puts weight on future keys"),
        (broken_pe.HidesItself, "attention_mask", "hides query 0 from its own key"),
        (broken_pe.FirstRowsMask, "attention_mask", "the queries are the last s_q keys"),
        (broken_pe.WrongKeyBias, "key_bias", "minus key_bias varies by .* along a query's row"),
        (broken_pe.LateLeak, "attend", "first 65 of 195 tokens attended alone differ"),
        (broken_pe.CalibratesItsParameter, "calibration", "calibrate changed 'pe.scale'"),
    ],
    ids=lambda x: x.__name__ if isinstance(x, type) else None,
)
def test_kit_fails_a_broken_plugin_saying_what_is_wrong(scheme, check, message):
    report = check_scheme(scheme)
    assert report[check].status == FAIL
    assert re.search(message, report[check].reason), report[check].reason


def test_leaky_plugin_fails_only_causality():
    """The leak is the one thing wrong with it: every other check passes or does not apply."""
    with pytest.raises(AssertionError, match="FAIL causality: .* leaks future tokens") as err:
        assert_conforms(broken_pe.LeaksFuture)
    assert str(err.value).count("FAIL") == 1


def test_a_scheme_that_attends_itself_conforms_and_is_checked_past_four_blocks():
    """The attend check runs where a scheme overrides attend, at 3x training and past 4x; the
    late leak passes the model's causality check (48 tokens) and fails it."""
    report = assert_conforms("input_gate", plugin="tests.plugins.input_gate")
    assert report["attend"].status == PASS and "lengths 48, 195" in report["attend"].reason
    assert report["query_chunks"].status == SKIP
    leaky = check_scheme(broken_pe.LateLeak)
    assert leaky["causality"].status == PASS and leaky["attend"].status == FAIL
    assert check_scheme("rope")["attend"].status == SKIP


def test_options_and_limits_are_checked():
    report = check_scheme("learned", options={"max_positions": 40})
    assert report.passed
    assert "length 41: UserError" in report["lengths"].reason
    with pytest.raises(UserError, match="unknown scheme 'ropee'"):
        check_scheme("ropee")


def pe_bench_check(*args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("pe-bench-check")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )


@pytest.mark.slow
def test_console_script_fails_a_broken_plugin():
    proc = pe_bench_check("broken_fake_relative", "--plugin", "tests.plugins.broken_pe")
    assert proc.returncode == 1, proc.stderr
    assert "FAIL relative: declares relative = True" in proc.stdout
    assert "PASS causality" in proc.stdout
    assert "FAIL score_mod: score_mod and score_bias differ" in proc.stdout  # its consequence
    assert "broken_fake_relative: 2 of 17 checks failed" in proc.stdout


def test_main_parses_options_and_exits_by_outcome(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["t5", "--option", "num_buckets=8", "--option", "max_distance=20", "--no-cost"])
    assert exit_.value.code == 0
    assert "t5: conforms" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["t5", "--option", "num_bukets=8"])
    assert exit_.value.code == 2
    assert "scheme 't5' has no option num_bukets" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["rope", "--option", "base=abc"], "--option base='abc' must be a number"),
        (["rope", "--option", "base=-1"], "--option base must be > 1, got -1.0"),
        (["rope", "--train-len", "0"], "'0' is not an integer from 1 to 4096"),
        (["x", "--plugin", "no_such_mod"], "--plugin='no_such_mod' does not import"),
        (
            ["x", "--plugin", "tests.plugins.raises_at_import"],
            "does not import: RuntimeError: cannot reach the plugin's license server",
        ),
    ],
)
def test_bad_arguments_are_one_line_not_failed_checks(capsys, args, message):
    """A bad argument is the caller's error (status 2, one line), not the scheme's failure."""
    with pytest.raises(SystemExit) as exit_:
        main(args)
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and not captured.out
    (line,) = captured.err.splitlines()
    assert line.startswith("pe-bench-check: error: ") and message in line


@pytest.mark.slow
def test_console_script_plugin_with_a_syntax_error(tmp_path):
    (tmp_path / "bad_syntax.py").write_text("def broken(:\n")
    script = Path(sys.executable).with_name("pe-bench-check")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [str(script), "x", "--plugin", "bad_syntax"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "--plugin='bad_syntax' does not import: SyntaxError: invalid syntax" in proc.stderr


def test_a_crash_names_where_it_was_raised_and_verbose_prints_the_traceback(capsys):
    """A hook that crashes fails its check with the scheme's file and line, not one bare line;
    ``--verbose`` adds the traceback (issue 17: 'a failing check prints one line with no
    location')."""
    with pytest.raises(SystemExit):
        main(["broken_table", "--plugin", "tests.plugins.broken_pe"])
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("FAIL lengths")]
    assert "raised IndexError" in line and "broken_pe.py:" in line and "in embed)" in line
    assert "Traceback" not in out
    with pytest.raises(SystemExit):
        main(["broken_table", "--plugin", "tests.plugins.broken_pe", "--verbose"])
    out = capsys.readouterr().out
    assert "    Traceback (most recent call last):" in out and "self.table(pos)" in out


def test_an_unknown_scheme_without_plugin_hints_at_plugin(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["no_such_rope"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "unknown scheme 'no_such_rope'" in err
    assert "pe-bench-check no_such_rope --plugin <module>" in err


@pytest.mark.slow
def test_cost_is_timed_against_rope_with_the_path_and_what_is_faster(monkeypatch, capsys):
    """pe-bench-check ends with the scheme's cost against rope on the same shape (a toy one
    here) and the attention path its hooks give it; ``--no-cost`` leaves it out."""
    from functools import partial

    from pe_bench.cli import check
    from pe_bench.conformance import cost
    from pe_bench.model.gpt import ModelConfig

    toy = ModelConfig(d_model=16, num_layers=1, num_heads=2, mlp_ratio=1)
    small = partial(cost.scheme_cost, model_cfg=toy, train_shape=(2, 8), eval_shape=(1, 32))
    monkeypatch.setattr(check, "scheme_cost_report", lambda *a, **k: small_cost(small, *a, **k))
    for scheme, path in [("stickbreaking", "explicit"), ("fox", "key_bias"), ("alibi", "distance")]:
        with pytest.raises(SystemExit):
            main([scheme])
        out = capsys.readouterr().out
        assert re.search(r"training step: [\d.]+x rope \(\d+ vs \d+ ms\)", out), out
        assert re.search(r"evaluation: [\d.]+x rope", out)
        assert f"attention path: {cost.PATHS[path]}" in out
    with pytest.raises(SystemExit):
        main(["ntk"])  # an eval-time variant is not trained
    assert "training: an eval-time variant, not trained" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["rope", "--no-cost"])
    assert "cost" not in capsys.readouterr().out


def small_cost(timer, scheme, options=None, plugin=None):
    from pe_bench.conformance.harness import build_setup

    setup = build_setup(scheme, options or {}, plugin, None, 8)
    return timer(setup.make, setup.label, repeats=1)


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("rope", "causal"),
        ("fox", "key_bias"),
        ("t5", "distance"),
        ("xl", "mask"),
        ("cope", "mask"),
        ("dape_alibi", "explicit"),
        ("rerope", "windowed"),  # its branches by blocks, modify_logits's numbers
        ("streaming_llm", "windowed"),
        ("ssmax_alibi", "mask"),
        ("irope", "mask"),  # its attention_mask hides keys: float masks, no fused path
    ],
)
def test_attention_path_names_the_path_the_model_takes(name, path):
    from pe_bench.model.attention import attention_path
    from pe_bench.model.gpt import ModelConfig
    from pe_bench.positions import build_scheme

    assert attention_path(build_scheme({"name": name}, ModelConfig().dims(64))) == path
