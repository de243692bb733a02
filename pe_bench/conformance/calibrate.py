"""The conformance check of a scheme's calibration (``PositionScheme.calibrate``, the step the
evaluation runs on held-out text before scoring each length)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from pe_bench.conformance.harness import Failed, Setup, Skipped, forward, max_diff, tolerance
from pe_bench.model.gpt import GPT


def check_calibration(setup: Setup) -> str:
    """``calibrate`` returns a line for the records, changes no parameter of the model (the
    checkpoint stays the trained one), does not raise the held-out loss it is given, keeps a
    length calibrated before as it was when another is calibrated (the evaluation calibrates
    every length, then scores them), is deterministic, and leaves the model causal."""
    model = setup.model().eval()
    if not model.pe.has_calibration:
        raise Skipped("no calibrate (nothing is fitted at evaluation)")
    s, short = setup.long, setup.train_len
    vocab = setup.model_cfg.vocab_size
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (2, s + 1), generator=generator)
    text = torch.randint(0, vocab, (2, s), generator=generator)
    state = copy.deepcopy(model.state_dict())
    before = held_out(model, tokens)().item()
    note = model.pe.calibrate(held_out(model, tokens), s)
    if not isinstance(note, str) or not note:
        raise Failed(f"calibrate returned {note!r}, not a line for the records")
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, state[k])]
    if changed:
        raise Failed(
            f"calibrate changed {changed[0]!r}: fit tensors of the scheme's own (out of its "
            "state dict), so that the checkpoint stays the trained model"
        )
    after = held_out(model, tokens)().item()
    if after > before + 0.01 * max(1.0, abs(before)):
        raise Failed(f"calibrate raised the held-out loss it fits from {before:.4f} to {after:.4f}")
    calibrated = forward(model, text)
    model.pe.calibrate(held_out(model, tokens[:, : short + 1]), short)
    if max_diff(forward(model, text), calibrated) > tolerance(calibrated, 1e-5):
        raise Failed(f"calibrating length {short} after {s} changed the outputs at length {s}")
    again = setup.model().eval()
    again.pe.calibrate(held_out(again, tokens), s)
    if not torch.equal(forward(again, text), calibrated):
        raise Failed("two calibrations of the same model on the same text differ")
    changed_text = text.clone()
    changed_text[:, s // 2] = (changed_text[:, s // 2] + 1) % vocab
    first = calibrated[:, : s // 2]
    if max_diff(first, forward(model, changed_text)[:, : s // 2]) > tolerance(first, 1e-5):
        raise Failed("after calibration, changing a token changes an earlier output")
    return (
        f"held-out loss {before:.4f} -> {after:.4f} at length {s}; no parameter changed, kept "
        f"when length {short} is calibrated, deterministic, causal: {note}"
    )


def held_out(model: GPT, tokens: torch.Tensor):
    """The loss ``calibrate`` is given: the mean next-token loss on ``tokens`` ``[b, s + 1]``."""

    def loss() -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())

    return loss
