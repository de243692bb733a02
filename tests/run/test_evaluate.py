"""The evaluation protocol: each target once, sliding(S=L) == nonoverlap, stride-1 sliding ==
per-token brute force, the same tokens at every length."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pe_bench.errors import UserError
from pe_bench.run.evaluate import EvalConfig, Window, score, windows
from tests.helpers import tiny_model


def scored_targets(n: int, length: int, mode: str, stride: int | None = None) -> list[int]:
    """Target indices each window scores (target t is token t + 1 predicted from tokens <= t)."""
    out = []
    for w in windows(n, length, mode, stride):
        out += range(w.start + w.score_from, w.start + length)
    return out


@pytest.mark.parametrize("length", [1, 4, 10, 16, 63, 64])
def test_nonoverlap_scores_every_target_once(length):
    assert sorted(scored_targets(64, length, "nonoverlap")) == list(range(64))


def test_nonoverlap_tail_is_a_full_window_at_the_end():
    """100 targets in windows of 16: six windows back to back, then one more window of 16
    ending at target 99 that scores only the 4 targets the others left (96..99)."""
    spans = windows(100, 16, "nonoverlap")
    assert spans[:6] == [Window(16 * i, 0) for i in range(6)]
    assert spans[6:] == [Window(84, 12)]
    assert spans == windows(100, 16, "sliding", 16)  # nonoverlap is sliding with S = L


@pytest.mark.parametrize(("length", "stride"), [(16, 1), (16, 5), (16, 16), (10, 3), (64, 7)])
def test_sliding_scores_every_target_once(length, stride):
    assert sorted(scored_targets(100, length, "sliding", stride)) == list(range(100))


def test_sliding_gives_full_context_after_the_first_window():
    for w in windows(100, 16, "sliding", 4)[1:]:
        assert w.score_from >= 16 - 4  # every scored token has >= 12 tokens of context


def test_bad_protocol_inputs():
    with pytest.raises(UserError, match="eval length 101 must be >= 1 and <= the 100 eval tokens"):
        windows(100, 101, "nonoverlap")
    with pytest.raises(UserError, match="stride 20 must be between 1 and the window length 16"):
        windows(64, 16, "sliding", 20)
    with pytest.raises(UserError, match="unknown eval mode 'overlap'"):
        windows(64, 16, "overlap")
    with pytest.raises(UserError, match="eval length 0 must be >= 1"):
        EvalConfig(lengths=[0, 16])


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tiny_model("alibi")


@pytest.fixture(scope="module")
def stream():
    return torch.randint(0, 256, (97,), generator=torch.Generator().manual_seed(1))


def test_sliding_with_stride_equal_to_length_is_nonoverlap(model, stream):
    for length in (8, 10, 16, 32, 40):  # 10 and 40 do not divide the 96 targets: a tail
        a = score(model, stream, length, "nonoverlap")
        b = score(model, stream, length, "sliding", stride=length)
        assert a.tokens == b.tokens == 96
        assert a.nll == pytest.approx(b.nll, rel=1e-6)


def test_stride_one_sliding_equals_brute_force(model, stream):
    """Every target t scored with the previous (up to) L tokens as its context, one at a time."""
    length = 12
    total = 0.0
    with torch.no_grad():
        for t in range(96):
            context = stream[max(0, t + 1 - length) : t + 1].unsqueeze(0)
            logits = model(context)[0, -1]
            total += F.cross_entropy(logits.unsqueeze(0), stream[t + 1].unsqueeze(0)).item()
    result = score(model, stream, length, "sliding", stride=1, batch_tokens=64)
    assert result.nll == pytest.approx(total / 96, rel=1e-5)


class Unigram(nn.Module):
    """Logits that depend on nothing but a fixed table: each target's loss is its own."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(256))

    def forward(self, x):
        return self.table.expand(*x.shape, 256)


def test_every_length_and_mode_scores_the_same_tokens(stream):
    """With context-free logits, the summed loss is a function of *which* targets are scored."""
    model = Unigram()
    sums = {
        (length, mode): score(model, stream, length, mode, stride=max(1, length // 4)).nll_sum
        for length in (4, 8, 10, 16, 32, 40, 96)  # 10, 40: nonoverlap with a tail
        for mode in ("nonoverlap", "sliding")
    }
    first = next(iter(sums.values()))
    assert all(v == pytest.approx(first, rel=1e-12) for v in sums.values())
    reference = F.cross_entropy(model.table.expand(96, 256), stream[1:], reduction="sum").item()
    assert first == pytest.approx(reference, rel=1e-6)  # float32 reference sum
    # and a different set of targets would give a different sum
    assert score(model, stream[:89], 8, "nonoverlap").nll_sum != pytest.approx(first, rel=1e-3)


def test_per_position_loss_is_a_mean_per_offset(model, stream):
    result = score(model, stream, 8, "nonoverlap")
    assert result.position_count.tolist() == [12] * 8
    losses = result.position_loss()
    assert sum(losses) / 8 == pytest.approx(result.nll, rel=1e-9)


def test_eval_config_lengths_and_tokens():
    cfg = EvalConfig(factors=[1, 2, 4], tokens=1000)
    assert cfg.eval_lengths(16) == [16, 32, 64]
    assert cfg.n_targets([16, 32, 64]) == 960  # rounded down to a multiple of 64
    with pytest.raises(UserError, match="eval.stride=32 is longer than the eval window 16"):
        EvalConfig(stride=32).stride_for("sliding", 16, 16)


def test_random_positions_are_evaluated_as_the_mean_of_seeded_draws(stream):
    """A randomized scheme is scored once per draw of its positions (each draw seeded by its
    index): the result pools the draws, whose NLLs differ and are reported one by one."""
    from pe_bench.run.evaluate import EvalTask, evaluate_tasks, lm_scorer

    model = tiny_model("randomized_rope")
    scorer = lm_scorer(stream, 64, torch.device("cpu"))
    task = EvalTask("none", "", None, 16, "nonoverlap", 16, 64)
    (scored,) = evaluate_tasks(model, [task], scorer, torch.device("cpu"), "randomized_rope")
    assert len(scored.draw_nll) == model.pe.eval_draws == 4
    assert len(set(scored.draw_nll)) == 4  # each draw placed the windows elsewhere
    assert scored.result.nll == pytest.approx(sum(scored.draw_nll) / 4, rel=1e-12)
    (again,) = evaluate_tasks(model, [task], scorer, torch.device("cpu"), "randomized_rope")
    assert again.draw_nll == scored.draw_nll  # seeded: the same draws every time


def test_deterministic_positions_are_scored_once(stream):
    from pe_bench.run.evaluate import EvalTask, evaluate_tasks, lm_scorer

    task = EvalTask("none", "", None, 16, "nonoverlap", 16, 64)
    scorer = lm_scorer(stream, 64, torch.device("cpu"))
    (scored,) = evaluate_tasks(tiny_model("rope"), [task], scorer, torch.device("cpu"), "rope")
    assert len(scored.draw_nll) == 1 and scored.draw_nll[0] == scored.result.nll
