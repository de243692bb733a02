"""Schemes whose only order signal is a learned gate between keys and query, with no position
encoding otherwise: the Forgetting Transformer's forget gate and CABLE's context-aware biases
(logit biases accumulated along the sequence) and stick-breaking attention (which replaces the
softmax)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.positions.base import (
    WEIGHT_FLOOR,
    ModelDims,
    PositionScheme,
    key_blocks,
    register,
)


@register("fox")
class ForgetGate(PositionScheme):
    """The Forgetting Transformer's forget gate (Lin et al. 2025, "Forgetting Transformer:
    Softmax Attention with a Forget Gate", https://arxiv.org/abs/2503.02130): per head a gate
    f_t = sigmoid(w^T x_t + b) on every token, and the logit bias
    D_ij = sum_{l=j+1..i} ln f_l = c_i - c_j with c_t = sum_{l<=t} ln f_l (a cumulative sum of
    log-sigmoids, computed in float32). No position encoding otherwise (the paper's FoX does
    not use RoPE). Reference implementation: zhixuan-lin/forgetting-transformer,
    ``ForgettingAttentionLayer`` (``fgate_type="full"``: ``fgate_proj`` = Linear(d_model,
    n_h) with bias per layer, weights N(0, 0.02) and bias 0, so f ~ 1/2 at the start;
    ``log_fgate = logsigmoid``, cumulative sum in ``forgetting_attention``).

    Departure: the hooks see the heads' queries and keys, not x_t, so the gate reads the head's
    key, f_t = sigmoid(w_h^T k_t + b_h), with w_h (``[h_d]``, N(0, 0.02)) and b_h (0) per layer
    and head. k_t = W_k x_t is a linear function of x_t, so this is the reference's gate with
    its weights restricted to the row space of the head's W_k (and trained jointly with it).

    Causal: D_ij for j <= i reads the gates of tokens j+1..i only. The bias depends on the
    keys' contents, not on i - j, so the scheme is not ``relative`` (it is translation
    invariant: it reads no position at all).
    """

    content_bias = True

    @property
    def caveat(self) -> str:
        return (
            "forget gate computed from each head's key k_t (a linear function of x_t), not "
            "from x_t with its own projection as in FoX"
        )

    def __init__(self, dims: ModelDims) -> None:
        super().__init__(dims)
        layers, heads = dims.num_layers, dims.num_heads
        self.gate_weight = nn.Parameter(0.02 * torch.randn(layers, heads, dims.head_dim))
        self.gate_bias = nn.Parameter(torch.zeros(layers, heads))

    def log_gates(self, k: Tensor, layer: int) -> Tensor:
        """ln f_t of every key, ``[b, n_h, s_k]`` in float32."""
        logit = torch.einsum("bhkd,hd->bhk", k.float(), self.gate_weight[layer].float())
        return F.logsigmoid(logit + self.gate_bias[layer].float().unsqueeze(-1))

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        c = self.log_gates(k, layer).cumsum(-1)  # [b, n_h, s_k]: sum_{l<=t} ln f_l
        c_q = c[..., -q.shape[-2] :]  # the queries are the last keys
        return c_q.unsqueeze(-1) - c.unsqueeze(-2)  # [b, n_h, s_q, s_k]; j > i masked later

    def key_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        """-c_j, ``[b, n_h, s_k]``: D_ij less the query's own c_i, which the softmax cancels
        (the model attends by fused SDPA with it, no mask)."""
        return -self.log_gates(k, layer).cumsum(-1)


@register("cable")
class Cable(PositionScheme):
    """Context-aware biases for length extrapolation (Veisi et al. 2025, "Context-aware Biases
    for Length Extrapolation", https://arxiv.org/abs/2503.08067): per layer a projection of
    the layer's normed input to one number per head, z_t = W x_t + b (W N(0, 0.02), b 0), and
    the logit bias

        B_ij = c_i - c_j,  c_t = -sum_{l<=t} softplus(z_l),

    a decay accumulated over the tokens between key and query at a rate each token sets (its
    form is FoX's with ln f_l = -softplus(z_l)). No position encoding otherwise. Reference
    implementation: axiomlab/Cable ``src/Cable.py`` (``CausalSelfAttention``: ``h_attn`` =
    Linear(n_embd, n_head) on the block's normed input, ``b = cumsum(-softplus(h_attn(x)))``,
    ``Bias = b_i - b_j``, logits ``baddbmm(Bias, q / sqrt(C / n_embd), k / sqrt(C /
    n_embd))``).

    The bias reads x_t, which no logit hook sees, so the scheme attends itself (``attend``):
    c_i cancels in the softmax and -c_j rides on the keys into fused causal SDPA, with no
    mask. The code divides q and k by sqrt(C / n_embd) = 1, so its logits are q . k unscaled;
    that is kept (``scaled: true`` gives q . k / sqrt(h_d), as the paper writes and every
    other scheme here has). Causal: B_ij for j <= i reads tokens j+1..i. Not ``relative``: it
    reads no position (translation invariant).

    Args:
        scaled (bool): divide q . k by sqrt(h_d). Default: False (the code).
    """

    def __init__(self, dims: ModelDims, *, scaled: bool = False) -> None:
        super().__init__(dims)
        self.scaled = scaled
        self.weight = nn.Parameter(
            0.02 * torch.randn(dims.num_layers, dims.num_heads, dims.d_model)
        )
        self.bias = nn.Parameter(torch.zeros(dims.num_layers, dims.num_heads))

    @property
    def caveat(self) -> str:
        scale = (
            "the authors' models are 44M-334M parameters at L_train 512 and 1,024 "
            "(WikiText-103, FineWeb-Edu): their gains were not measured at this model's size"
        )
        if self.scaled:
            return scale
        return (
            "logits q . k unscaled, as the authors' code computes them (q and k divided by "
            "sqrt(C / n_embd) = 1); scaled: true divides by sqrt(h_d) as the paper writes; " + scale
        )

    def cumulative(self, x: Tensor, layer: int) -> Tensor:
        """c_t = -sum_{l<=t} softplus(W x_l + b), ``[b, n_h, s]`` in float32."""
        z = torch.einsum("bsd,hd->bhs", x.float(), self.weight[layer].float())
        return -F.softplus(z + self.bias[layer].float().unsqueeze(-1)).cumsum(-1)

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, layer: int) -> Tensor:
        """Fused causal SDPA with -c_j as one more dimension of the keys (the queries' is 1,
        v's 0): q' . k' = q . k (/ sqrt(h_d) if ``scaled``) - c_j, as the model's
        ``key_biased_attention`` does for a ``key_bias``; in float32 (c grows with the length),
        a GPU's kernels given a width that is a multiple of 8."""
        b, h, s, d = q.shape
        pad = (-(d + 1)) % 8 if q.device.type == "cuda" else 0
        with torch.autocast(q.device.type, enabled=False):
            scale = 1 / math.sqrt(d) if self.scaled else 1.0
            q_ext = torch.cat([q.float() * scale, q.new_ones(b, h, s, 1, dtype=torch.float)], -1)
            k_ext = torch.cat([k.float(), -self.cumulative(x, layer).unsqueeze(-1)], -1)
            q_ext, k_ext = F.pad(q_ext, (0, pad)), F.pad(k_ext, (0, pad))
            v_ext = F.pad(v.float(), (0, 1 + pad))
            y = F.scaled_dot_product_attention(q_ext, k_ext, v_ext, is_causal=True, scale=1.0)
        return y[..., : v.shape[-1]].to(v.dtype)


@register("stickbreaking")
class StickBreaking(PositionScheme):
    """Stick-breaking attention (Tan et al. 2024, "Scaling Stick-Breaking Attention: An
    Efficient Implementation and In-depth Study", https://arxiv.org/abs/2410.17980) on NoPE:
    with z_ij = q_i . k_j / sqrt(h_d) and beta_ij = sigmoid(z_ij), key j < i gets

        A_ij = beta_ij prod_{j<k<i} (1 - beta_ik),

    the stick left by the keys between j and the query, nearest first; in log space
    ln A_ij = logsigmoid(z_ij) - sum_{j<k<i} softplus(z_ik) (float32, a reversed cumulative
    sum over keys). Reference implementation: shawntan/stickbreaking-attention,
    ``stickbreaking_attention/sb_ref.py`` with its tests' ``ref_fwd``: inverse temperature
    1/sqrt(h_d), the query does not stick-break over itself (``attend_current=False``: the
    mask ``triu(0)``, cumulative weights ``tril(-1)``), and the remaining stick,
    1 - sum_j A_ij = prod_{k<i} (1 - beta_ik), goes to the query's own value
    (``o + rem * v``). Here that remainder is the weight on the query's own key, so the
    weights sum to 1 (to rounding).

    No position encoding otherwise: order comes from the stick-breaking alone. Not
    ``relative`` (like NoPE, it reads no position).
    """

    def attention_weights(self, logits: Tensor, allowed: Tensor) -> Tensor:
        """In log space: with S_ij = sum_{j<=k<i} softplus(z_ik) (a reversed cumulative sum),
        ln A_ij = logsigmoid(z_ij) - S_{i,j+1} = z_ij - S_ij, and the remainder is exp(-S_i0).

        Weights at most ``WEIGHT_FLOOR`` are 0, as the softmax's (``PositionScheme``), the
        remainder's too: log weights are raised to ln(tiny) + 1 before ``exp`` and the results
        at most the floor then zeroed, so that no ``exp`` returns a subnormal and no product
        with v is one. Both take slow paths on the CPU (1 thread, Xeon AVX512, [4, 64, 8192]:
        ``exp`` of -100 123 ms against 1.5; the product with v of weights of 3e-38 122 ms
        against 2.2), and far keys' weights sit there: a query's stick is spent within a few
        hundred keys. So the sum runs over blocks of keys from the query back
        (``key_blocks``) and stops once every query's S exceeds ``SPENT``: every earlier
        key's weight is then below the floor, so 0, and the remainder too; those keys cost no
        pass at all (at 8,192 tokens the weights of a window are one block or two, not 8,192
        keys)."""
        s_q, s_k = allowed.shape
        # ``allowed`` hides keys in its last s_q columns only, unless the scheme hides more
        # (``attention_mask``): only they are masked (a ``where`` over every pair was a fifth
        # of the time at 8192 tokens)
        masked = 0 if self.has_attention_mask else s_k - s_q
        blocks, weights, carry = key_blocks(s_q, s_k), None, None
        for start, end in blocks:
            before = None
            if end > masked:  # keys strictly before each query, among the block's
                before = allowed[:, max(start, masked) : end]
                before = before.tril(s_k - s_q - 1 - max(start, masked))
            block, carry = _stick_block(logits[..., start:end], before, carry, end - start)
            if len(blocks) == 1:
                weights = block
                break
            if weights is None:
                weights = logits.new_empty(logits.shape)  # each block written into it
            weights[..., start:end] = block
            if start > 0 and bool((carry > SPENT).all()):  # the rest weigh 0
                weights[..., :start].zero_()
                carry = None  # the remainder, exp(-S_i0) < exp(-SPENT), is 0 too
                break
        # prod_{k < i} (1 - beta_ik) goes to the own key
        remainder = weights.diagonal(s_k - s_q, dim1=-2, dim2=-1)
        if carry is None:
            remainder.zero_()
        else:
            remainder.copy_(F.threshold(carry[..., 0].neg().exp(), WEIGHT_FLOOR, 0.0))
        return weights


# The stick spent past which a key's weight, exp(logsigmoid(z) - S) <= exp(-S), is below
# ``WEIGHT_FLOOR`` = exp(-69.08), with room for float32's rounding of S.
SPENT = 70.0


def _stick_block(
    logits: Tensor, before: Tensor | None, carry: Tensor | None, width: int
) -> tuple[Tensor, Tensor]:
    """One block's stick-breaking weights (below ``WEIGHT_FLOOR``: 0; masked keys and the own
    key's column 0) and S at its first key, ``[..., s_q, 1]``, from its logits, which keys are
    strictly before each query in its last ``before.shape[-1]`` columns (None: all), and S
    just after its last key (``carry``; None: 0). The sum, the log weights and the weights are
    written in place, into tensors made here."""
    spent = F.softplus(logits)  # -ln(1 - beta_ik)
    if before is not None:
        tail = spent[..., width - before.shape[-1] :]
        tail.copy_(torch.where(before, tail, 0.0))
    from_j = spent.flip(-1).cumsum_(-1).flip(-1)  # S_ij = sum_{j <= k < i}, within the block
    if carry is not None:
        from_j = from_j.add_(carry)
    floor = math.log(torch.finfo(logits.dtype).tiny) + 1
    weights = (logits - from_j).clamp_(min=floor).exp_()
    weights = F.threshold(weights, WEIGHT_FLOOR, 0.0, inplace=not weights.requires_grad)
    if before is not None:
        tail = weights[..., width - before.shape[-1] :]
        tail.copy_(torch.where(before, tail, 0.0))
    return weights, from_j[..., :1]
