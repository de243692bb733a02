"""The three uses of Hydra's internals (``pe_bench/cli/hydra_private.py``), each held to what
its caller relies on, so that a Hydra upgrade that changes one fails here by name."""

from __future__ import annotations

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from pe_bench.cli.hydra_private import basic_sweeper_jobs, hydra_args_parser, report_as_hydra


def test_the_args_parser_reads_hydras_flags_and_the_overrides():
    args = hydra_args_parser().parse_args(["-m", "pe=rope,alibi", "train.steps=3"])
    assert args.multirun and args.overrides == ["pe=rope,alibi", "train.steps=3"]
    assert not (args.help or args.cfg or args.config_dir)


def parsed(*lines: str):
    return OverridesParser.create().parse_overrides(list(lines))


def test_the_basic_sweepers_jobs_are_the_product_of_its_sweeps_in_order():
    jobs = basic_sweeper_jobs(parsed("pe=rope,alibi", "train.seed=0,1", "train.steps=3"))
    assert jobs == [
        ["pe=rope", "train.seed=0", "train.steps=3"],
        ["pe=rope", "train.seed=1", "train.steps=3"],
        ["pe=alibi", "train.seed=0", "train.steps=3"],
        ["pe=alibi", "train.seed=1", "train.steps=3"],
    ]


def test_a_later_override_of_a_key_replaces_the_earlier_in_its_place():
    """An experiment's ``hydra.sweeper.params`` come first, the command line's after them."""
    jobs = basic_sweeper_jobs(parsed("pe=rope,alibi", "train.steps=3", "pe=nope"))
    assert jobs == [["pe=nope", "train.steps=3"]]


def test_a_sweep_the_basic_sweeper_cannot_list_is_a_hydra_exception():
    with pytest.raises(HydraException):
        basic_sweeper_jobs(parsed("train.lr=interval(0.1,0.2)"))


def test_an_error_is_reported_as_hydra_reports_it(capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        report_as_hydra(RuntimeError("boom"))
    err = capsys.readouterr().err
    assert exit_info.value.code == 1
    assert err.rstrip().endswith("RuntimeError: boom")
