"""The scale-ladder report: rungs found in the records, the tables across rungs, the claims
tested at each rung, and the report a ladder folder gets."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from pe_bench.errors import UserError
from pe_bench.report import claims, ladder, rungs
from pe_bench.report.build import build_report
from pe_bench.report.inputs import Options
from tests.helpers import assert_regenerates, record, write_runs

FACTORS = (1, 2, 4, 8, 16)
RUNGS = {"small": {"d_model": 32, "train_len": 16}, "wide": {"d_model": 64, "train_len": 16}}


def rung_records(rung: str, nll: dict[str, list[float]], seeds: int = 3) -> list[dict]:
    """Records of one rung: ``nll[label]`` is the NLL at 1x..16x of seed 0; seed s adds
    0.01 * s at every length (so differences between lengths and labels are the same in every
    seed, and separated), and seed 1 adds 0.005 more at 16x (an interval of non-zero width)."""
    fields = RUNGS[rung]
    rows = []
    for lab, values in nll.items():
        scheme, _, variant = lab.partition("+")
        for seed in range(seeds):
            run_id = f"pe={scheme},rung={rung}" + (f",train.seed={seed}" if seed else "")
            for factor, value in zip(FACTORS, values, strict=True):
                bump = 0.01 * seed + (0.005 if seed == 1 and factor == 16 else 0.0)
                length = factor * fields["train_len"]
                rows.append(
                    record(scheme, seed, length, value + bump, run_id=run_id,
                           variant=variant or "none", **fields)
                )  # fmt: skip
    return rows


FLAT = [2.0, 1.98, 1.97, 1.97, 1.96]
RISING = [2.0, 2.3, 2.6, 2.9, 3.2]


def ladder_rows() -> list[dict]:
    """xl beats alibi at every length on ``small``; on ``wide`` alibi beats xl."""
    small = rung_records("small", {"xl": [x - 0.2 for x in FLAT], "alibi": FLAT, "rope": RISING})
    wide = rung_records("wide", {"xl": FLAT, "alibi": [x - 0.2 for x in FLAT], "rope": RISING})
    return small + wide


def results(rows: list[dict]) -> list[rungs.RungResult]:
    df = pd.DataFrame(rows).assign(folder=[r["run_id"] for r in rows])
    return [rungs.analyse(r, g, Options()) for r, g in rungs.split_rungs(df)]


def test_a_ladder_is_a_rung_sweep_whose_records_differ_only_in_a_rung_field():
    rows = pd.DataFrame(ladder_rows())
    rows = rows.assign(folder=rows["run_id"])
    assert rungs.is_ladder(rows)
    assert not rungs.is_ladder(rows[rows["d_model"] == 32])  # one rung: one protocol
    other_tokens = rows.assign(tokens=rows["d_model"] * 8)  # eval tokens differ too
    assert not rungs.is_ladder(other_tokens)
    undeclared = rows.assign(folder=rows["folder"].str.replace(r",rung=\w+", "", regex=True))
    assert not rungs.is_ladder(undeclared)  # L_train differing by accident: no ladder


def test_rungs_are_named_by_their_folders_and_ordered():
    res = results(ladder_rows())
    assert [r.rung.name for r in res] == ["small", "wide"]  # same length: by parameters (tie)
    unnamed = [dict(r, run_id=r["run_id"].replace(",rung=small", "")) for r in ladder_rows()]
    assert "d32-l2-L16" in [r.rung.name for r in results(unnamed)]


def test_far_table_is_the_geometric_mean_ratio_over_seeds():
    far = ladder.far_table(results(ladder_rows())).set_index(["label", "rung"])
    cell = far.loc[("rope", "small")]
    diffs = [1.2, 1.205, 1.2]  # 16x minus 1x per seed (seed 1 has 0.005 more at 16x)
    assert cell["ratio"] == pytest.approx(math.exp(sum(diffs) / 3))
    half = stats.t.ppf(0.975, 2) * pd.Series(diffs).std() / math.sqrt(3)
    assert cell["ratio_high"] == pytest.approx(math.exp(sum(diffs) / 3 + half))
    assert cell["nll"] == pytest.approx((3.2 + 3.215 + 3.22) / 3)
    assert cell["n"] == 3


def test_kendall_tau_between_rungs():
    tau = ladder.kendall_table(results(ladder_rows()))
    assert tau.loc["small", "small"] == pytest.approx(1.0)
    # small: xl < alibi < rope; wide: alibi < xl < rope: one discordant pair of three
    assert tau.loc["small", "wide"] == pytest.approx(1 / 3)


def test_separation_table_marks_the_better_label_where_seeds_separate():
    table = ladder.separation_table(results(ladder_rows()))
    assert table.loc["xl vs alibi", "small"] == "<"
    assert table.loc["xl vs alibi", "wide"] == ">"


def test_claims_hold_fail_or_cannot_be_tested_per_rung():
    table = claims.claim_table(results(ladder_rows()))
    assert table.loc["xl_beats_alibi", "small"] == "holds"
    assert table.loc["xl_beats_alibi", "wide"].startswith("no: xl worse than alibi at 1x")
    assert table.loc["rope_degrades", "small"] == "holds"
    assert table.loc["flat", "small"] == "holds"
    assert table.loc["t5_near", "small"] == "–: no t5"
    one_seed = rung_records("small", {"xl": FLAT, "alibi": FLAT}, seeds=1) + rung_records(
        "wide", {"xl": FLAT, "alibi": FLAT}, seeds=1
    )
    assert claims.claim_table(results(one_seed)).loc["flat", "small"] == "–: alibi has 1 seed"


def test_a_claim_that_is_not_separated_does_not_hold():
    rows = rung_records("small", {"xl": FLAT, "alibi": FLAT, "rope": RISING})
    rows += rung_records("wide", {"xl": FLAT, "alibi": FLAT, "rope": RISING})
    verdict = claims.verdict(claims.CLAIMS[3], results(rows)[0])  # xl_beats_alibi
    assert verdict.holds is False and "not separated" in verdict.why


def test_a_ladder_folder_gets_the_ladder_report(tmp_path):
    folder = tmp_path / "ladder"
    write_runs(folder, ladder_rows())
    report = build_report(folder, echo=False)
    text = report.path.read_text()
    assert "# Scale ladder report" in text
    assert (
        "Transformer-XL is better than ALiBi at every length**: holds at small; not at wide" in text
    )
    for name in ("scale_far", "scale_rank", "scale_kendall", "scale_separated", "scale_claims"):
        assert (folder / "tables" / f"{name}.csv").exists()
    assert (folder / "tables" / "scale_ratio.tex").exists()
    assert (folder / "figures" / "scale_params.png").exists()  # two sizes at one length
    assert not (folder / "figures" / "scale_length.png").exists()  # one length only


@pytest.mark.slow  # draws the figures
def test_a_ladder_report_regenerates_from_its_records(tmp_path):
    folder = tmp_path / "ladder"
    write_runs(folder, ladder_rows())
    build_report(folder, echo=False)
    assert_regenerates(folder, tmp_path / "again")


def test_rungs_that_differ_in_more_than_a_rung_field_are_still_refused(tmp_path):
    rows = [dict(r, tokens=512) if r["d_model"] == 64 else r for r in ladder_rows()]
    write_runs(tmp_path, rows)
    with pytest.raises(UserError, match="disagree on"):
        build_report(tmp_path, echo=False)
