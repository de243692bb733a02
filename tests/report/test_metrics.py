"""The metric registry (``pe_bench/report/metrics.py``): a metric registered once, with nothing
else edited, reaches the report's tables, figures, LaTeX tables and site, shown as its spec
says (title, number format, best by its direction); and the built-in metrics are each defined
there alone."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from pe_bench.errors import UserError
from pe_bench.report import metrics
from pe_bench.report.build import build_report
from pe_bench.report.inputs import Options
from pe_bench.report.metrics import LM, TASK, MetricSpec
from pe_bench.report.site import write_site
from tests.helpers import ROOT, record, separable_seeds, write_runs

DUMMY = MetricSpec("dummy", "Dummy score", "dummy score (units)", "{:.4f}", higher_is_better=True)
DUMMY_TASK = MetricSpec(
    "dummy_acc",
    "Dummy accuracy",
    "dummy accuracy",
    "{:.3f}",
    kind=TASK,
    bounds=(0.0, 1.0),
    higher_is_better=True,
)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry as it is, restored after the test (which registers more)."""
    monkeypatch.setattr(metrics, "REGISTRY", dict(metrics.REGISTRY))


def with_dummy(rows: list[dict]) -> list[dict]:
    """Each record with a ``dummy`` number: 10 - 3 x its NLL (higher is better)."""
    return [{**r, "dummy": 10 - 3 * r["nll"]} for r in rows]


def test_a_registered_metric_reaches_tables_figures_latex_and_site(tmp_path, registry):
    metrics.register(DUMMY)
    write_runs(tmp_path / "runs", with_dummy(separable_seeds()))
    out = tmp_path / "out"
    report = build_report(tmp_path / "runs", out, Options(metric="dummy"), echo=False)
    # its table, in CSV, markdown and LaTeX, with its spec's number format
    table = pd.read_csv(out / "tables" / "dummy.csv")
    alibi16 = table[(table["label"] == "alibi") & (table["eval_len"] == 16)]["mean"].item()
    assert alibi16 == pytest.approx(10 - 3 * 1.1)
    md = (out / "tables" / "dummy.md").read_text()
    assert re.search(r"\| alibi +\| +6\.7000 \[5\.9548, 7\.4452\] \|", md)
    tex = (out / "tables" / "dummy.tex").read_text()
    assert "Dummy score by evaluation length" in tex and r"\pebest{\num{6.7000}" in tex
    assert "Bold: the highest mean of each column" in tex
    # its figure and report.md's sections
    assert report.figures["length"] == out / "figures" / "dummy_vs_length.png"
    text = report.path.read_text()
    assert "## Dummy score by evaluation length" in text and "Dummy score relative to L" in text
    # the highest is best: alibi's 6.7 over rope's 6.6 (not separated) and nope's 0.7
    assert re.search(r"\| alibi +\| +1 \| +1 \|", (out / "tables" / "ranks.md").read_text())
    # the site's leaderboard
    write_site(report, tmp_path / "runs", tmp_path / "site")
    index = (tmp_path / "site" / "index.html").read_text()
    assert "Dummy score by evaluation length" in index and "6.7000" in index


def test_a_registered_metric_is_left_out_where_records_lack_it(tmp_path, registry):
    """Records made before a metric existed make the report they made before."""
    metrics.register(DUMMY)
    write_runs(tmp_path, separable_seeds())
    build_report(tmp_path, options=Options(), echo=False)
    assert not list(tmp_path.rglob("dummy*"))
    with pytest.raises(UserError, match="the records carry no 'dummy'"):
        build_report(tmp_path, options=Options(metric="dummy"), echo=False)


def task_records(task: str) -> list[dict]:
    """Two schemes x 3 seeds on ``task`` at lengths 16 and 32, with ``dummy_acc``."""
    rows = []
    for scheme, base in (("rope", 0.9), ("alibi", 0.5)):
        for seed in range(3):
            for length in (16, 32):
                value = base - 0.1 * seed - (0.2 if length == 32 else 0)
                numbers = {"exact_match": value, "token_acc": value, "dummy_acc": value / 2}
                rows.append(
                    record(
                        scheme,
                        seed,
                        length,
                        0.0,
                        mode="task",
                        corpus=f"task:{task}",
                        task=task,
                        **numbers,
                    )
                )
    return rows


def test_a_registered_task_metric_reaches_each_tasks_tables_figures_latex_and_site(
    tmp_path, registry
):
    metrics.register(DUMMY_TASK)
    write_runs(tmp_path / "runs", task_records("copy"))
    out = tmp_path / "out"
    report = build_report(tmp_path / "runs", out, Options(), echo=False)
    table = pd.read_csv(out / "tables" / "copy_dummy_acc.csv")
    assert table.loc[table["label"] == "rope", "mean"].iloc[0] == pytest.approx(0.4)
    assert "0.400 [" in (out / "tables" / "copy_dummy_acc.md").read_text()
    for name in ("copy_dummy_acc.tex", "copy_dummy_acc_ranks.csv", "copy_dummy_acc_pairwise.csv"):
        assert (out / "tables" / name).exists(), name
    assert (
        "copy: dummy accuracy by input length"
        in (out / "tables" / "copy_dummy_acc.tex").read_text()
    )
    assert report.figures["dummy_acc"] == out / "figures" / "dummy_acc_vs_length.png"
    assert "Dummy accuracy:" in report.path.read_text()
    write_site(report, tmp_path / "runs", tmp_path / "site")
    assert "copy: dummy accuracy" in (tmp_path / "site" / "index.html").read_text()


def test_a_metric_registered_twice_or_unknown_is_refused(registry):
    with pytest.raises(ValueError, match="'ppl' is registered already"):
        metrics.register(MetricSpec("ppl", "Perplexity again", "perplexity"))
    with pytest.raises(UserError, match="metric 'foo' is not one of ppl, bpb, nll, exact_match"):
        metrics.spec("foo")
    assert [s.name for s in metrics.of_kind(LM)] == ["ppl", "bpb", "nll"]


BUILT_IN = ("Perplexity", "Bits per byte", "Exact match", "Token accuracy")


@pytest.mark.parametrize("title", BUILT_IN)
def test_a_metrics_title_is_written_in_the_registry_alone(title):
    """The titles the report used to keep in three tables of their own (``TITLES``)."""
    written = [
        p.relative_to(ROOT).as_posix()
        for p in sorted((ROOT / "pe_bench" / "report").rglob("*.py"))
        if f'"{title}"' in p.read_text()
    ]
    assert written == ["pe_bench/report/metrics.py"]


def test_the_cli_offers_every_registered_metric_of_perplexity(registry, capsys):
    from pe_bench.cli.report import main

    metrics.register(DUMMY)
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "{ppl,bpb,nll,dummy}" in capsys.readouterr().out


def test_the_docs_say_how_to_add_a_metric():
    text = (ROOT / "docs" / "outputs.md").read_text()
    section = text[text.index("### Adding a metric") :]
    assert "pe_bench/report/metrics.py" in section and "MetricSpec(" in section
