"""pe_bench/report/protocols.py: the truncate mode's loss by position, whatever mode the
report's tables hold (the comparisons' protocol choice is tested in test_compare.py)."""

from __future__ import annotations

import pandas as pd
import pytest

from pe_bench.records import load_records
from pe_bench.report import protocols
from pe_bench.report.inputs import load_rows, record_problem
from pe_bench.stats import log_buckets, t_interval
from tests.helpers import record, truncate_runs, write_runs


def test_truncate_positions_pool_every_runs_documents(tmp_path):
    """Each bucket's interval is the t-interval of the 4 documents' losses (2 runs x 2), the
    records of the other mode left out; --schemes keeps its labels only."""
    truncate_runs(tmp_path)
    records = load_records(tmp_path, record_problem)
    rows = load_rows(tmp_path, "positions.jsonl")
    found = protocols.truncate_positions(rows, records, ())
    assert list(dict.fromkeys(found["label"])) == ["rope", "alibi"]
    assert set(found["windows"]) == {4}
    for length in (16, 32):
        edges = log_buckets(length)
        cells = found[(found["label"] == "alibi") & (found["eval_len"] == length)]
        assert len(cells) == len(edges) - 1
        for b, cell in enumerate(cells.itertuples()):
            values = [2.5 + 0.1 * s + 0.2 * d - 0.01 * b for s in (0, 1) for d in (0, 1)]
            n, mean, low, high = t_interval(values)
            assert (cell.windows, cell.loss) == (n, pytest.approx(mean))
            assert (cell.ci_low, cell.ci_high) == (pytest.approx(low), pytest.approx(high))
            assert cell.position == pytest.approx((edges[b] + edges[b + 1] - 1) / 2)
    only = protocols.truncate_positions(rows, records, ("rope",))
    assert set(only["label"]) == {"rope"}


def test_no_truncate_records_no_positions(tmp_path):
    write_runs(tmp_path, [record("rope", 0, 16, 1.0), record("rope", 0, 32, 1.5)])
    records = load_records(tmp_path, record_problem)
    found = protocols.truncate_positions(pd.DataFrame(), records, ())
    assert found.empty and "label" in found
