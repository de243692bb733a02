"""Every config composes and builds; bad values are refused with the key and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException

from pe_bench.config import from_node
from pe_bench.data import load_corpus
from pe_bench.errors import UserError
from pe_bench.evaluate import EvalConfig
from pe_bench.model import ModelConfig, build_model
from pe_bench.positions import scheme_class
from pe_bench.train import TrainConfig

from .conftest import TRAINABLE, VARIANTS

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


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_builds(hydra_compose, experiment):
    cfg = hydra_compose(f"experiment={experiment}")
    model_cfg = from_node(ModelConfig, cfg.model, "model")
    train_cfg = from_node(TrainConfig, cfg.train, "train")
    eval_cfg = from_node(EvalConfig, cfg.eval, "eval")
    assert eval_cfg.eval_lengths(train_cfg.seq_len)
    for scheme in ("rope", "alibi"):
        build_model(model_cfg, {"name": scheme}, train_cfg.seq_len, seed=0)
    if cfg.data.source == "stdlib":
        load_corpus(cfg.data)


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
    GlobalHydra.instance().clear()
    assert cfg.hydra.sweeper.params.pe.split(",") == TRAINABLE
    assert set(cfg.eval.variants) == set(VARIANTS)
    quick = (CONF / "experiment" / "quick.yaml").read_text()
    assert cfg.train.seq_len == 64 and cfg.train.steps == 800 and "override /model: tiny" in quick
    assert cfg.model.d_model == 128  # the quick suite's trunk
