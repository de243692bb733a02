"""The RoPE-base section: which reports are base sweeps, the measured break by hand, the
sentences against each prediction, and the files a report of a sweep writes."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from pe_bench.files import write_jsonl
from pe_bench.report import aggregate, rope_base, rope_theory
from pe_bench.report.build import build_report
from tests.helpers import record

LENGTHS = (16, 32, 64, 128)
# NLL(L) - NLL(16) per seed at 32, 64, 128: base 10 never rises, 1e4 at once, 1e6 by seed
# (breaks 64, 32, 128; the mean over seeds 0.067, 0.15, 0.3 breaks at 64)
RISES = {
    10.0: [[0.0, 0.0, 0.05]] * 3,
    10000.0: [[0.5, 0.9, 1.2], [0.6, 1.0, 1.3], [0.4, 0.8, 1.1]],
    1e6: [[0.05, 0.2, 0.3], [0.15, 0.2, 0.3], [0.0, 0.05, 0.3]],
}


def sweep_records(bases=tuple(RISES)) -> list[tuple[str, list[dict]]]:
    """(folder, records) per base and seed, labelled as a rope_base run labels them (the
    default base 10,000 has no ``pe_options``); NLL at 16 is 2 + 0.1 x seed."""
    runs = []
    for base in bases:
        options = {} if base == 10000.0 else {"pe_options": f"base={base:g}"}
        for seed, rise in enumerate(RISES[base]):
            start = 2 + 0.1 * seed
            nll = [start, *(start + r for r in rise)]
            rows = [
                record("rope", seed, n, x, run_id=f"rope-{base:g}-{seed}", **options)
                for n, x in zip(LENGTHS, nll, strict=True)
            ]
            runs.append((f"pe.base={base},train.seed={seed}", rows))
    return runs


def write_sweep(root: Path, heads: int | None = 2, bases=tuple(RISES)) -> Path:
    for folder, rows in sweep_records(bases):
        write_jsonl(root / folder / "records.jsonl", rows)
        if heads:  # d_model 32 (the records'), so a head dimension of 32 / heads
            (root / folder / "config.yaml").write_text(
                f"model:\n  d_model: 32\n  num_heads: {heads}\n"
            )
    return root


def frame(root: Path) -> pd.DataFrame:
    from pe_bench.records import load_records

    return aggregate.prepare(load_records(root))


def test_a_sweep_is_rope_labels_of_two_bases_or_more(tmp_path):
    df = frame(write_sweep(tmp_path / "all"))
    assert rope_base.rope_bases(df).to_dict() == {
        "rope(base=10)": 10.0, "rope": 10000.0, "rope(base=1e+06)": 1e6,
    }  # fmt: skip
    assert rope_base.is_base_sweep(df)
    one = frame(write_sweep(tmp_path / "one", bases=(10000.0,)))
    assert not rope_base.is_base_sweep(one)
    other = df.assign(variant="pi")  # eval-time variants are not trained bases
    assert not rope_base.is_base_sweep(other)


def test_the_measured_break_per_base_and_per_seed(tmp_path):
    df = frame(write_sweep(tmp_path))
    table = rope_base.break_table(df, 16, dim=16).set_index("base")
    assert table.loc[10.0, "measured"] is None
    assert table.loc[10.0, "seed_breaks"] == [None, None, None]
    assert table.loc[10000.0, "measured"] == 32
    assert table.loc[1e6, "measured"] == 64
    assert table.loc[1e6, "seed_breaks"] == [64, 32, 128]
    # the rise at the break, mean and 95% t-interval of (0.2, 0.2, 0.05) by hand
    values = [0.2, 0.2, 0.05]
    mean = sum(values) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)  # t(0.975, 2)
    row = table.loc[1e6]
    assert (row["n"], row["rise"]) == (3, pytest.approx(mean))
    assert (row["rise_low"], row["rise_high"]) == pytest.approx((mean - half, mean + half))
    # where there is no break: the rise at the longest length
    assert table.loc[10.0, "rise"] == pytest.approx(0.05)


def test_predictions_are_the_theory_functions_at_the_head_dimension(tmp_path):
    df = frame(write_sweep(tmp_path))
    table = rope_base.break_table(df, 16, dim=16).set_index("base")
    for base, row in table.iterrows():
        limit = rope_theory.extrapolation_limit(16, 16, base)
        assert row["t_extra"] == limit
        assert row["d_extra"] == rope_theory.critical_dimension(16, 16, base)
        assert row["liu_break"] == next((n for n in LENGTHS[1:] if n > limit), None)
        assert row["men_length"] == rope_theory.supported_length(base, 16, rope_base.MEN_LIMIT)


def row(measured, liu_break, t_extra=100.0, d_extra=10, men_length=500) -> pd.Series:
    return pd.Series(
        {"measured": measured, "liu_break": liu_break, "t_extra": t_extra, "d_extra": d_extra,
         "men_length": men_length}, dtype=object
    )  # fmt: skip


@pytest.mark.parametrize(
    ("measured", "predicted", "says"),
    [
        (128, 128, "agrees (the break at 128)"),
        (None, None, "agrees (no break up to 1024)"),
        (64, 128, "disagrees: it breaks earlier, at 64"),
        (256, 128, "disagrees: it breaks later, at 256"),
        (None, 128, "disagrees: perplexity holds to 1024"),
        (512, None, "disagrees: it breaks earlier, at 512"),
    ],
)
def test_liu_sentence_compares_the_measured_and_predicted_break(measured, predicted, says):
    assert rope_base.liu_sentence(row(measured, predicted), 1024).endswith(says + ".")


def test_liu_sentence_says_when_no_bound_is_predicted():
    text = rope_base.liu_sentence(row(None, None, t_extra=math.inf, d_extra=34), 1024)
    assert text.startswith("Liu: d_extra = 34 >= d") and "no bound is predicted" in text


GRID = [64, 128, 256, 512, 1024]


@pytest.mark.parametrize(
    ("measured", "supported", "says"),
    [
        (128, 500, "consistent: perplexity holds to 64, within the bound"),
        (128, 122, "consistent: perplexity holds to 64, within the bound"),
        (None, 5000, "consistent: perplexity holds to 1024, within the bound"),
        (None, None, "consistent: perplexity holds to 1024, within the bound"),
        (None, 474, "perplexity holds to 1024, past the bound"),
        (512, 122, "perplexity holds to 256, past the bound"),
    ],
)
def test_men_sentence_reads_the_bound_as_a_necessary_condition(measured, supported, says):
    assert says in rope_base.men_sentence(row(measured, None, men_length=supported), 64, GRID)


def test_men_sentence_flags_a_base_below_the_bound_for_the_training_length():
    text = rope_base.men_sentence(row(None, None, men_length=5), 64, GRID)
    assert "B(m) >= 0 up to 5 tokens, fewer than L_train = 64" in text


def test_a_report_of_a_sweep_has_the_section_its_table_latex_and_figure(tmp_path):
    root = write_sweep(tmp_path / "sweep")
    build_report(root, echo=False)
    text = (root / "report.md").read_text()
    assert "## RoPE's base" in text and "head dimension d = 16" in text
    for name in ("tables/rope_base.csv", "tables/rope_base.md", "tables/rope_base.tex"):
        assert (root / name).exists(), name
    assert (root / "figures" / "rope_base.png").exists()
    csv = pd.read_csv(root / "tables" / "rope_base.csv").set_index("base")
    assert csv.loc[1e6, "seed_breaks"] == "64;32;128"
    assert csv.loc[10.0, "seed_breaks"] == "beyond 128;beyond 128;beyond 128"
    # one sentence per base, computed: at d = 16 and L_train 16, d_extra = 2 ceil(8 log_b(16 /
    # 2 pi)) is 2 for base 1e4 (T_extra = 2 pi 1e4^(1/8) = 19.9: a break at 32, as measured) and
    # 8 for base 10 (T_extra = 2 pi 10^(1/2) = 19.9 again), which never breaks
    assert rope_theory.extrapolation_limit(16, 16, 1e4) == pytest.approx(2 * math.pi * 10**0.5)
    assert rope_theory.extrapolation_limit(16, 16, 10) == pytest.approx(2 * math.pi * 10**0.5)
    lines = {x.split("**")[1]: x for x in text.splitlines() if x.startswith("- **base ")}
    assert "a break predicted at 32; agrees (the break at 32)." in lines["base 10,000"]
    assert "a break predicted at 32; disagrees: perplexity holds to 128." in lines["base 10"]


def test_without_config_the_section_omits_the_predictions(tmp_path):
    root = write_sweep(tmp_path / "sweep", heads=None)
    build_report(root, echo=False)
    text = (root / "report.md").read_text()
    assert "head dimension unknown" in text
    assert "Liu:" not in text


def test_a_report_without_a_sweep_has_no_section(tmp_path):
    root = write_sweep(tmp_path / "one", bases=(10000.0,))
    build_report(root, echo=False)
    assert "RoPE's base" not in (root / "report.md").read_text()
    assert not (root / "tables" / "rope_base.csv").exists()
