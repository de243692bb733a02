"""FoPE: logits pinned to the authors' code, the zeroed floor frequencies, the series'
initialisation, HoPE as its noise-free case, the conformance kit."""

from __future__ import annotations

import math

import pytest
import torch

from pe_bench.conformance import assert_conforms
from pe_bench.model.attention import attention_logits
from pe_bench.positions import ModelDims, build_scheme
from pe_bench.positions.fingerprint import class_key
from pe_bench.positions.fourier import FoPE

# yiju-zhao/Fourier-Position-Embedding at 3713108 (olmo/model.py): FourierEmbedding for a
# ModelConfig of 2 heads, the given head dim and max_sequence_length (= L_train) with the
# ce-fourier configs' settings (rope_clamp_floor_freq, rope_clamp_floor_to_zero, fourier,
# eye_xavier_norm 0.3, fourier_separate_basis, fourier_separate_head, fourier_ignore_zero),
# sin_coef and cos_coef set as ``set_coefficients`` sets them, q and k from ``inputs()`` at
# the last 5 of ``all_len`` positions (fe(q, all_len), fe(k, all_len)), logits = q'.k' /
# sqrt(head_dim). Case 1 and 2: 3 frequencies (1, 0.1, 0.01) in a series of 2 pairs (the
# strided identity); case 3: 3 (1, 0.316, 0.1) in 3 pairs.
CASES = {
    "h_d 8, L 4096, positions 0-4": (8, 4096, 5),
    "h_d 8, L 4096, positions 995-999": (8, 4096, 1000),
    "h_d 16, L 64, positions 0-4": (16, 64, 5),
}
LOGITS = {
    "h_d 8, L 4096, positions 0-4": [
        [
            [6.1207690, -4.8834085, 2.2810216, 0.0066889, -1.7536589],
            [2.5752299, -1.4115727, 0.5466840, 0.5819693, -2.2928276],
            [0.1723824, 0.4300904, -0.5537620, 0.9490418, -1.6574060],
            [-0.7269905, 0.9120277, -0.9859740, 0.8522947, -0.4587729],
            [-3.0673735, 2.6941721, -1.6353749, 0.3371333, 0.8530781],
        ],
        [
            [-4.0282311, 4.9426036, -4.8479471, 3.8592148, -2.1390445],
            [-3.3855381, 2.7561142, -1.7481424, 0.5427920, 0.9210415],
            [-1.1188923, -0.7013534, 2.0891099, -2.9118917, 3.4335079],
            [1.8146925, -3.9210401, 4.9652290, -5.0088272, 4.3581495],
            [3.7468023, -5.2202821, 5.5270095, -4.8063135, 3.2823939],
        ],
    ],
    "h_d 8, L 4096, positions 995-999": [
        [
            [3.6954970, -3.0889890, 1.6119570, 0.2303193, -1.8161042],
            [3.1679168, -2.2049282, 1.0391016, 0.1983264, -1.5973140],
            [1.4311224, -0.6835598, -0.0470542, 0.8862451, -1.7238803],
            [-0.2827155, 0.0015622, -0.8040039, 1.8666983, -1.6492724],
            [-2.0567210, 1.0740955, -1.1599259, 1.1194580, 0.3174877],
        ],
        [
            [-3.2360759, 3.7956059, -3.5705390, 2.6447456, -1.1824756],
            [-2.9187670, 2.8809915, -2.3637807, 1.4568002, -0.1850293],
            [-1.3835554, 0.8206805, -0.1999464, -0.3227957, 0.8151593],
            [0.7909951, -1.6486945, 2.0656881, -1.9564552, 1.4895791],
            [2.6145859, -3.3969443, 3.4142921, -2.7183559, 1.5157729],
        ],
    ],
    "h_d 16, L 64, positions 0-4": [
        [
            [2.4153299, 2.8261993, 1.4782987, 0.8375389, -1.2570399],
            [2.9543166, 0.7611185, -0.8965831, -1.7713842, -1.8970953],
            [0.3530640, -1.8652195, -2.2153420, -0.6649895, 1.1608243],
            [-1.7662702, -1.8577738, 0.0271876, 2.1428876, 2.2018237],
            [-0.1894610, 0.7664194, 2.2815161, 2.0137498, -0.4703309],
        ],
        [
            [-1.0529343, 1.4892139, 2.1248758, 2.1470194, 0.3985578],
            [2.4065888, 2.7422559, 1.2374721, -0.1542682, -2.1715364],
            [2.0186419, 0.1426492, -1.6010025, -2.3800590, -1.5078112],
            [-0.0496571, -1.4240116, -1.8771144, -0.3543276, 1.6396353],
            [-2.2611427, -1.2950064, 0.7011250, 2.1984076, 1.9546500],
        ],
    ],
}


def inputs(head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k ``[1, 2, 5, head_dim]`` from fixed formulas (the same everywhere)."""
    n = torch.arange(10 * head_dim, dtype=torch.float32)
    shape = (1, 2, 5, head_dim)
    return (1.5 * torch.sin(0.7 * n + 0.3)).reshape(shape), (
        1.2 * torch.cos(0.45 * n - 0.2)
    ).reshape(shape)


def set_coefficients(fope: FoPE, layer: int) -> None:
    size = fope.sin_coef[layer].shape
    n = torch.arange(math.prod(size), dtype=torch.float32)
    with torch.no_grad():
        fope.sin_coef[layer].copy_((0.5 * torch.sin(0.9 * n + 0.1)).reshape(size))
        fope.cos_coef[layer].copy_((0.5 * torch.cos(0.6 * n - 0.4) + 0.5).reshape(size))


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_the_authors_code(case):
    head_dim, train_len, end = CASES[case]
    dims = ModelDims(2 * head_dim, 2, head_dim, num_layers=2, train_len=train_len)
    fope = build_scheme({"name": "fope"}, dims)
    set_coefficients(fope, 1)
    q, k = inputs(head_dim)
    pos = torch.arange(end - 5, end)
    logits = attention_logits(fope, q, k, pos, pos, layer=1)[0]
    torch.testing.assert_close(logits, torch.tensor(LOGITS[case]), rtol=0, atol=5e-6)


def test_the_floor_frequencies_are_dropped():
    """The zoo's model (h_d 32, L_train 64): theta_k = 10^(-k/4) >= 2 pi / 64 for k <= 4
    (theta_4 = 0.1 > 0.098), so 5 frequencies and a series of min(5, 32 / 4) = 5 pairs;
    at L_train 16 (floor 0.39) 2 (1, 0.56)."""
    zoo = build_scheme({"name": "fope"}, ModelDims(128, 4, 32, 4, 64))
    assert zoo.basis.tolist() == pytest.approx([10 ** (-k / 4) for k in range(5)], rel=1e-6)
    assert zoo.cos_coef.shape == zoo.sin_coef.shape == (4, 4, 5, 5)
    short = build_scheme({"name": "fope"}, ModelDims(128, 4, 32, 4, 16))
    assert len(short.basis) == 2 and short.cos_coef.shape[-1] == 2


def test_initialisation_is_identity_plus_xavier_noise():
    """A and B start at the identity plus Xavier-normal noise of gain 0.3 on ``[n_h, D,
    d_out]`` (torch's fans: D d_out in, n_h d_out out), not trained by default."""
    dims = ModelDims(512, 16, 32, 64, 64)  # 64 layers of 16 x 5 x 5: enough draws for a std
    fope = build_scheme({"name": "fope"}, dims)
    noise = fope.cos_coef - torch.eye(5)
    expected = 0.3 * math.sqrt(2 / (5 * 5 + 16 * 5))
    assert noise.std().item() == pytest.approx(expected, rel=0.05)
    assert abs(noise.mean().item()) < 0.1 * expected
    assert not fope.cos_coef.requires_grad and not fope.sin_coef.requires_grad
    learnable = build_scheme({"name": "fope", "learnable": True}, dims)
    assert learnable.cos_coef.requires_grad and learnable.sin_coef.requires_grad


def test_without_noise_and_with_the_papers_zero_frequency_it_is_hope():
    """No noise (init_gain 0) and sin 0 past the series: the series are RoPE's own rotations
    on the kept frequencies and the other pairs do not rotate, which is HoPE at this size."""
    dims = ModelDims(128, 4, 32, 2, 64)
    fope = build_scheme({"name": "fope", "init_gain": 0.0, "zero_freq_sin": 0.0}, dims)
    hope = build_scheme({"name": "hope"}, dims)
    q, k = torch.randn(2, 4, 40, 32), torch.randn(2, 4, 40, 32)
    pos = torch.arange(200, 240)
    torch.testing.assert_close(
        attention_logits(fope, q, k, pos, pos), attention_logits(hope, q, k, pos, pos)
    )
    # the paper's form: only the scale it cannot show (5 of 16 frequencies at L_train 64)
    assert "zero_freq_sin" not in fope.caveat and "only 5 of 16 frequencies" in fope.caveat


def test_the_codes_padding_doubles_the_unrotated_pairs():
    """cos = sin = 1 on a pair is x + rotate_half(x): its q . k is twice the plain one."""
    dims = ModelDims(128, 4, 32, 1, 64)
    code = build_scheme({"name": "fope", "init_gain": 0.0}, dims)
    paper = build_scheme({"name": "fope", "init_gain": 0.0, "zero_freq_sin": 0.0}, dims)
    q, k = torch.randn(1, 4, 6, 32), torch.randn(1, 4, 6, 32)
    rotated = [*range(5), *range(16, 21)]  # pairs 0-4 in both halves
    q[..., rotated], k[..., rotated] = 0.0, 0.0
    pos = torch.arange(6)
    torch.testing.assert_close(
        attention_logits(code, q, k, pos, pos), 2 * attention_logits(paper, q, k, pos, pos)
    )
    assert "zero_freq_sin" in code.caveat


def test_past_training_the_unrotated_pairs_stay_position_free():
    """At 16x L_train and far beyond, the pairs past the series see no position (their logits
    equal those at positions 0..5) and every logit stays finite."""
    fope = build_scheme({"name": "fope"}, ModelDims(128, 4, 32, 1, 64))
    q, k = torch.randn(1, 4, 6, 32), torch.randn(1, 4, 6, 32)
    rotated = [*range(5), *range(16, 21)]
    q[..., rotated], k[..., rotated] = 0.0, 0.0
    near = attention_logits(fope, q, k, torch.arange(6), torch.arange(6))
    for start in (1024, 100_000):
        far = torch.arange(start, start + 6)
        torch.testing.assert_close(attention_logits(fope, q, k, far, far), near)
    q, k = torch.randn(1, 4, 1024, 32), torch.randn(1, 4, 1024, 32)
    assert torch.isfinite(
        attention_logits(fope, q, k, torch.arange(1024), torch.arange(1024))
    ).all()


def test_not_shift_invariant():
    fope = build_scheme({"name": "fope"}, ModelDims(128, 4, 32, 1, 64))
    q, k = torch.randn(1, 4, 8, 32), torch.randn(1, 4, 8, 32)
    pos = torch.arange(8)
    near, far = (
        attention_logits(fope, q, k, pos, pos),
        attention_logits(fope, q, k, pos + 37, pos + 37),
    )
    assert (near - far).abs().max() > 1e-2


def test_fope_conforms():
    report = assert_conforms("fope")
    assert report["causality"].status == "PASS" and report["lengths"].status == "PASS"


def test_key_computes():
    assert len(class_key(FoPE)) == 12
    assert class_key(FoPE) != class_key(FoPE, {"zero_freq_sin": 0.0})
