"""The conformance checks of the model's contract, one function per contract (``kit``'s
docstring says what each verifies; ``kit.CHECKS`` runs them in order; ``hooks.py`` holds the
checks of the logit hooks, ``attend.py`` that of a scheme's own attention). A check returns a
one-line summary when the scheme passes, raises ``Failed`` saying what is wrong, or ``Skipped``
when it does not apply."""

from __future__ import annotations

import copy

import torch

from pe_bench.conformance.harness import (
    Failed,
    Setup,
    Skipped,
    allowed_entries,
    forward,
    max_diff,
    perturbed,
    qk,
    scheme_under_test,
    tolerance,
    with_perturbed_scheme,
)
from pe_bench.errors import UserError
from pe_bench.model.attention import attention_logits


def check_build(setup: Setup) -> str:
    scheme = setup.scheme()
    n = sum(p.numel() for p in scheme.parameters())
    return f"{type(scheme).__module__}.{type(scheme).__qualname__}, {n:,} parameters"


def check_causality(setup: Setup) -> str:
    model = with_perturbed_scheme(setup.model())
    s = setup.long
    x = torch.randint(0, setup.model_cfg.vocab_size, (2, s), generator=torch.Generator())
    for mode in ("train", "eval"):
        model.train(mode == "train")
        for t in sorted({s // 3, s - 1}):
            changed = x.clone()
            changed[:, t] = (changed[:, t] + 1) % setup.model_cfg.vocab_size
            before, after = forward(model, x), forward(model, changed)
            if t and max_diff(before[:, :t], after[:, :t]) > tolerance(before, 1e-5):
                diff = (before[:, :t] - after[:, :t]).abs().amax(dim=(0, 2))
                raise Failed(
                    f"changing token {t} of {s} changed the output at earlier position "
                    f"{int(diff.argmax())} by {diff.max().item():.3g} ({mode} mode): the scheme "
                    "leaks future tokens (look for sums, means or flips over the sequence in "
                    "embed, transform_qk or score_bias)"
                )
            if max_diff(before[:, t], after[:, t]) == 0:
                raise Failed(f"changing token {t} did not change its own output ({mode} mode)")
    return f"no token changes an earlier output (length {s}, train and eval mode)"


def devices() -> list[torch.device]:
    found = [torch.device("cpu")]
    if torch.cuda.is_available():
        found.append(torch.device("cuda"))
    return found


def check_hook_outputs(setup: Setup, device: torch.device, dtype: torch.dtype) -> None:
    """Every hook returns what the model expects, on ``device`` in ``dtype``; the logits from
    ``dtype`` inputs agree with float32 ones at positions past 1000 (where bfloat16 cannot
    even represent every integer position)."""
    scheme = perturbed(setup.scheme()).to(device).eval()
    d, s = setup.dims, setup.long
    where = f"{device.type}/{str(dtype).removeprefix('torch.')}"
    pos = scheme.positions(s, device)
    if pos.shape != (s,) or pos.dtype.is_floating_point or pos.device.type != device.type:
        raise Failed(
            f"positions({s}) gave {pos.dtype} {tuple(pos.shape)} on {pos.device}, "
            f"expected integers ({s},) on {device.type}"
        )
    x = torch.randn(2, s, d.d_model, device=device, dtype=dtype)
    q, k = qk(setup, s, s, device=device, dtype=dtype)
    tq, tk = scheme.transform_qk(q, k, pos, pos, 0)
    width = tq.shape[-1]  # transform_qk may widen q and k alike (PoPE: real, imaginary parts)
    outputs = (
        ("embed", scheme.embed(x, pos), x.shape),
        ("transform_qk", tq, (*q.shape[:-1], width)),
        ("transform_qk", tk, (*k.shape[:-1], width)),
    )
    for hook, out, shape in outputs:
        if out.shape != shape or out.dtype != dtype or out.device.type != device.type:
            raise Failed(
                f"{where}: {hook} gave {out.dtype} {tuple(out.shape)} on {out.device}, "
                f"expected {dtype} {tuple(shape)} on {device.type}"
            )
    bias = scheme.score_bias(tq, tk, pos, pos, 0)
    if bias is not None:
        try:
            torch.broadcast_shapes(bias.shape, (2, d.num_heads, s, s))
        except RuntimeError:
            raise Failed(
                f"{where}: score_bias gave shape {tuple(bias.shape)}, not broadcastable to "
                f"[b, n_h, s_q, s_k] = {(2, d.num_heads, s, s)}"
            ) from None
        if not bias.dtype.is_floating_point or bias.device.type != device.type:
            raise Failed(f"{where}: score_bias gave {bias.dtype} on {bias.device}")
        if not torch.isfinite(allowed_entries(bias.expand(2, d.num_heads, s, s), s, s)).all():
            raise Failed(f"{where}: score_bias is not finite on unmasked entries")
    limit = scheme.max_positions
    far = pos + (1000 if limit is None or s + 1000 <= limit else 0)
    got = allowed_entries(attention_logits(scheme, q, k, far, far), s, s)
    expected = allowed_entries(attention_logits(scheme, q.float(), k.float(), far, far), s, s)
    if max_diff(got, expected) > tolerance(expected, 0.03):
        raise Failed(
            f"{where}: logits at positions {int(far[0])}..{int(far[-1])} differ from float32 "
            f"ones by {max_diff(got, expected):.3g}: compute positions and angles in float32 "
            "whatever the input dtype"
        )


def check_devices_dtypes(setup: Setup) -> str:
    s = setup.long
    x = torch.randint(0, setup.model_cfg.vocab_size, (2, s), generator=torch.Generator())
    reference = with_perturbed_scheme(setup.model()).eval()
    expected = forward(reference, x).float().log_softmax(-1)
    seen = []
    for device in devices():
        for dtype in (torch.float32, torch.bfloat16):
            check_hook_outputs(setup, device, dtype)
            model = copy.deepcopy(reference).to(device, dtype)
            logits = forward(model, x.to(device))
            gap = max_diff(logits.float().log_softmax(-1).cpu(), expected)
            where = f"{device.type}/{str(dtype).removeprefix('torch.')}"
            if logits.dtype != dtype or not torch.isfinite(logits).all() or gap > 0.1:
                raise Failed(
                    f"{where}: the model cast to {dtype} gives {logits.dtype} logits whose "
                    f"log-probabilities differ from float32 ones by {gap:.3g}"
                )
            seen.append(where)
    cuda = "" if torch.cuda.is_available() else " (no cuda device here)"
    return f"hooks keep shape, dtype and device, and agree with float32: {', '.join(seen)}{cuda}"


def check_query_chunks(setup: Setup) -> str:
    scheme, s, pos = scheme_under_test(setup)
    if scheme.has_own_attention:
        raise Skipped("attends itself (attend): the model never passes queries alone")
    s_q = max(1, s // 3)
    q, k = qk(setup, s, s)
    for layer in range(setup.dims.num_layers):
        full = attention_logits(scheme, q, k, pos, pos, layer)[..., -s_q:, :]
        chunk = attention_logits(scheme, q[..., -s_q:, :], k, pos[-s_q:], pos, layer)
        full, chunk = allowed_entries(full, s_q, s), allowed_entries(chunk, s_q, s)
        if max_diff(full, chunk) > tolerance(full, 1e-5):
            raise Failed(
                f"the last {s_q} of {s} queries passed alone get logits that differ from the "
                f"same rows of the full matrix by {max_diff(full, chunk):.3g} (layer {layer}): "
                "with s_q < s_k the queries are the last s_q keys"
            )
    return f"the last {s_q} of {s} queries alone get the same logits as in the full matrix"


def check_lengths(setup: Setup) -> str:
    model = setup.model().eval()
    limit = model.pe.max_positions
    longest = 4 * setup.train_len if limit is None else min(4 * setup.train_len, limit)
    for s in sorted({1, longest}):
        try:
            model.pe.check_length(s)
            logits = forward(model, torch.zeros(1, s, dtype=torch.long))
        except Exception as err:
            raise Failed(
                f"length {s} (max_positions={limit}) raised {type(err).__name__}: {err}; declare "
                "max_positions to refuse longer sequences with a clear error"
            ) from None
        if not torch.isfinite(logits).all():
            raise Failed(f"length {s} gives non-finite outputs")
    if limit is None:
        return f"lengths 1 and {longest} (4 x L_train) give finite outputs; no declared limit"
    try:
        model.pe.check_length(limit + 1)
    except UserError as err:
        message = str(err)
    except Exception as err:
        raise Failed(
            f"check_length({limit + 1}) (past max_positions={limit}) raised "
            f"{type(err).__name__}, not a UserError: {err}"
        ) from None
    else:
        raise Failed(f"max_positions={limit} but check_length({limit + 1}) does not raise")
    return f"lengths 1 and {longest} give finite outputs; length {limit + 1}: UserError {message!r}"


def check_determinism(setup: Setup) -> str:
    a, b = setup.scheme().state_dict(), setup.scheme().state_dict()
    for key in a:
        if not torch.equal(a[key], b[key]):
            raise Failed(
                f"two builds under the same seed differ in {key!r}: initialise parameters in "
                "__init__ from torch's generator"
            )
    model = with_perturbed_scheme(setup.model())
    x = torch.randint(0, setup.model_cfg.vocab_size, (2, setup.long), generator=torch.Generator())
    for mode in ("eval", "train"):
        model.train(mode == "train")
        first, second = forward(model, x), forward(model, x)
        if not torch.equal(first, second):
            raise Failed(
                f"two forward passes on the same input differ by {max_diff(first, second):.3g} "
                f"({mode} mode, same seed)"
            )
    return "the same seed builds the same parameters; repeated passes are identical"


def check_gradients(setup: Setup) -> str:
    model = setup.model().train()
    params = {n: p for n, p in model.pe.named_parameters() if p.requires_grad}
    if not params:
        raise Skipped("no trainable parameters")
    x = torch.randint(0, setup.model_cfg.vocab_size, (4, setup.train_len + 1))
    torch.manual_seed(0)
    model(x[:, :-1], x[:, 1:]).backward()
    for name, p in params.items():
        if p.grad is None:
            raise Failed(f"parameter {name!r} gets no gradient: no hook uses it")
        if not torch.isfinite(p.grad).all():
            raise Failed(f"parameter {name!r} gets a non-finite gradient")
        if not p.grad.any():
            raise Failed(f"parameter {name!r} gets an all-zero gradient")
    n = sum(p.numel() for p in params.values())
    return f"all {len(params)} parameter tensors ({n:,} values) get finite, non-zero gradients"
