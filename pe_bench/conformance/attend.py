"""The conformance check of a scheme's own attention (``PositionScheme.attend``, which reads the
layer's input): kept apart from ``checks.py``, which holds the checks of the logit hooks."""

from __future__ import annotations

import torch

from pe_bench.conformance.harness import (
    Failed,
    Setup,
    Skipped,
    max_diff,
    qk,
    scheme_under_test,
    tolerance,
)


def check_attend(setup: Setup) -> str:
    """A scheme's own attention (``attend``) gives ``[b, n_h, s, h_d]`` in v's dtype (float32
    and bfloat16), finite, and the first t rows of a window are those of its first t tokens
    alone (no query sees a later token), at 3x training and at an odd length past 4x (several
    blocks of a blockwise form, the last one ragged)."""
    scheme, s, _ = scheme_under_test(setup)
    if not scheme.has_own_attention:
        raise Skipped("no attend (the model attends on its own paths)")
    d = setup.dims
    limit = scheme.max_positions
    lengths = sorted({s, 4 * s + 3 if limit is None else min(4 * s + 3, limit)})
    generator = torch.Generator().manual_seed(0)
    for n in lengths:
        x = torch.randn(2, n, d.d_model, generator=generator)
        q, k = qk(setup, n, n)
        v = torch.randn(2, d.num_heads, n, d.head_dim, generator=generator)
        pos = scheme.positions(n, torch.device("cpu"))
        q, k = scheme.transform_qk(q, k, pos, pos, 0)
        for layer in range(d.num_layers):
            out = _checked_output(scheme, (x, q, k, v), pos, layer)
            for t in sorted({1, n // 3, n - 1}):
                alone = scheme.attend(
                    x[:, :t], q[..., :t, :], k[..., :t, :], v[..., :t, :], pos[:t], layer
                )
                if max_diff(alone, out[..., :t, :]) > tolerance(out, 1e-5):
                    raise Failed(
                        f"the first {t} of {n} tokens attended alone differ from the same rows "
                        f"of the whole window by {max_diff(alone, out[..., :t, :]):.3g} (layer "
                        f"{layer}): a query sees a later token"
                    )
    return (
        "[b, n_h, s, h_d] in v's dtype (float32, bfloat16), finite; the first t rows are the "
        f"first t tokens' alone (lengths {', '.join(map(str, lengths))})"
    )


def _checked_output(scheme, inputs: tuple, pos: torch.Tensor, layer: int) -> torch.Tensor:
    """``attend``'s float32 output, after checking its shape, dtype and finiteness in float32
    and in bfloat16."""
    for dtype in (torch.bfloat16, torch.float32):
        x, q, k, v = (t.to(dtype) for t in inputs)
        out = scheme.attend(x, q, k, v, pos, layer)
        if out.shape != v.shape or out.dtype != dtype:
            raise Failed(
                f"attend gave {out.dtype} {tuple(out.shape)} (layer {layer}), expected "
                f"{dtype} {tuple(v.shape)}"
            )
        if not torch.isfinite(out).all():
            raise Failed(f"attend gives non-finite {dtype} outputs at length {len(pos)}")
    return out
