"""Every config composes and builds; bad values are refused with the key and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException

from pe_bench.cli import plan
from pe_bench.config import from_node
from pe_bench.data import check_config, load_corpus
from pe_bench.errors import UserError
from pe_bench.evaluate import EvalConfig
from pe_bench.positions import scheme_class
from pe_bench.train import TrainConfig

from .helpers import TRAINABLE, VARIANTS

CONF = Path(__file__).parents[1] / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
SCHEMES = sorted(p.stem for p in (CONF / "pe").glob("*.yaml"))


@pytest.fixture
def hydra_compose():
    GlobalHydra.instance().clear()
    with initialize_config_module(version_base="1.3", config_module="pe_bench.conf"):
        yield lambda *overrides: compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()


def test_default_config_has_the_card_groups(hydra_compose):
    cfg = hydra_compose()
    assert {"pe", "model", "data", "train", "eval"} <= set(cfg)
    assert set(cfg.eval.variants) == {"pi", "ntk"}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_pe_yaml_names_its_registered_scheme(hydra_compose, scheme):
    cfg = hydra_compose(f"pe={scheme}")
    assert cfg.pe.name == scheme
    scheme_class(cfg.pe.name)


@pytest.fixture
def hydra_sweep():
    """Compose with the hydra node too: an experiment's sweep lives in hydra.sweeper.params."""
    GlobalHydra.instance().clear()
    with initialize_config_module(version_base="1.3", config_module="pe_bench.conf"):
        yield lambda *overrides: compose(
            config_name="config", overrides=list(overrides), return_hydra_config=True
        )
    GlobalHydra.instance().clear()


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_builds(hydra_sweep, experiment):
    """Every job of the experiment's sweep passes ``plan``: model built (on the meta device:
    no memory for the GPU-sized ones), eval lengths and fine-tunes served, data config valid
    (remote datasets are not downloaded)."""
    cfg = hydra_sweep(f"experiment={experiment}")
    swept = (cfg.hydra.sweeper.get("params") or {}).get("pe")
    for scheme in swept.split(",") if swept else [cfg.pe.name]:
        job = hydra_sweep(f"experiment={experiment}", f"pe={scheme}")
        with torch.device("meta"):
            planned = plan(job)
        assert planned.model.pe.name == scheme and planned.tasks
        assert {ft.key for ft in planned.finetunes} <= set(job.get("finetunes") or {})
        check_config(job.data)
    if cfg.data.source == "stdlib":
        load_corpus(cfg.data)


def test_paper_experiments_have_the_papers_lengths_and_ratios(hydra_compose):
    alibi = hydra_compose("experiment=alibi_paper")
    assert list(alibi.eval.lengths) == [512, 1012, 2512, 4512, 7512]
    assert alibi.train.seq_len == 512 and alibi.data.name == "Salesforce/wikitext"
    mini = hydra_compose("experiment=alibi_paper_mini")
    for full, small in zip(alibi.eval.lengths, mini.eval.lengths, strict=True):
        assert small / mini.train.seq_len == pytest.approx(full / 512, rel=0.01)
    pi = hydra_compose("experiment=pi_paper_mini")
    assert pi.eval.stride / pi.train.seq_len == 256 / 2048  # the paper's sliding stride
    assert pi.finetunes.ft.steps == 10 * pi.finetunes.pi.steps  # FT 10,000 vs PI 1,000 steps
    with torch.device("meta"):
        tuned = plan(pi).finetunes
    assert [(ft.key, ft.scheme.name) for ft in tuned] == [("ft", "rope"), ("pi", "pi")]
    assert tuned[1].scheme.factor == 4.0  # PI's positions / 4 at every length


def test_a_bad_data_config_is_refused_before_loading():
    with pytest.raises(UserError, match="data=hf needs data.name=<dataset>"):
        check_config({"source": "hf", "name": None})
    with pytest.raises(UserError, match="data.splits lacks test"):
        check_config({"source": "hf", "name": "x", "splits": {"train": "a", "valid": "b"}})
    with pytest.raises(UserError, match="unknown data.source 'ftp'; allowed: stdlib, text, hf"):
        check_config({"source": "ftp"})


def test_unknown_group_option_is_hydra_error(hydra_compose):
    with pytest.raises(ConfigCompositionException, match="Could not find 'pe/ropee'"):
        hydra_compose("pe=ropee")


def test_bad_types_and_unknown_keys(hydra_compose):
    with pytest.raises(UserError, match="train.steps='abc' must be an integer"):
        from_node(TrainConfig, hydra_compose("train.steps=abc").train, "train")
    with pytest.raises(UserError, match="train.lr='fast' must be a number"):
        from_node(TrainConfig, hydra_compose("train.lr=fast").train, "train")
    with pytest.raises(UserError, match=r"unknown key train.stesp; allowed: .*steps"):
        from_node(TrainConfig, hydra_compose("+train.stesp=3").train, "train")
    with pytest.raises(UserError, match="eval.modes\\[0\\]=3 must be a string"):
        from_node(EvalConfig, hydra_compose("eval.modes=[3]").eval, "eval")


def test_zoo_sweeps_every_scheme_and_evaluates_every_rope_variant():
    GlobalHydra.instance().clear()
    with initialize_config_module(version_base="1.3", config_module="pe_bench.conf"):
        cfg = compose(config_name="config", overrides=["experiment=zoo"], return_hydra_config=True)
        quick = compose(config_name="config", overrides=["experiment=quick"])
    GlobalHydra.instance().clear()
    assert cfg.hydra.sweeper.params.pe.split(",") == TRAINABLE
    assert set(cfg.eval.variants) == set(VARIANTS)
    # The zoo's classic rows are the quick suite's: same trunk, data, training and test tokens.
    for group in ("model", "data", "train"):
        assert cfg[group] == quick[group], group
    assert cfg.eval.tokens == quick.eval.tokens and cfg.eval.factors == quick.eval.factors
