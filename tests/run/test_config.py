"""Every config composes and builds; bad values are refused with the key and what is allowed."""

from __future__ import annotations

from typing import Annotated

import pytest
from hydra.errors import ConfigCompositionException

from pe_bench.config import Range, check_value, from_node
from pe_bench.data.config import DataConfig
from pe_bench.data.corpus import load_corpus
from pe_bench.errors import UserError
from pe_bench.positions import scheme_class
from pe_bench.run.config import RunConfig
from pe_bench.run.evaluate import EvalConfig
from pe_bench.run.plan import plan
from pe_bench.run.train import FinetuneConfig, TrainConfig
from tests.helpers import ROOT, TRAINABLE, VARIANTS, compose, fast_lane

CONF = ROOT / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
SCHEMES = sorted(p.stem for p in (CONF / "pe").glob("*.yaml"))


def test_default_config_has_the_card_groups():
    cfg = compose()
    assert {"pe", "model", "data", "train", "eval"} <= set(cfg)
    assert set(cfg.eval.variants) == {"pi", "ntk"}


@pytest.mark.parametrize("scheme", fast_lane(SCHEMES))
def test_every_pe_yaml_names_its_registered_scheme(scheme):
    cfg = compose(f"pe={scheme}")
    assert cfg.pe.name == scheme
    scheme_class(cfg.pe.name)


@pytest.mark.parametrize(
    "experiment",
    # 0.5 to 5 s each (the zoo plans 38 schemes): the fast lane composes smoke's only
    fast_lane(EXPERIMENTS, ["smoke"]),
)
def test_every_experiment_composes_and_builds(experiment):
    """Every job of the experiment's sweep passes ``plan``: scheme built, eval lengths and
    fine-tunes served, data config valid (remote datasets are not downloaded). The plan builds
    no model, so the GPU-sized experiments plan in no memory."""
    cfg = compose(f"experiment={experiment}", hydra=True)
    parsed = RunConfig.parse(cfg)
    if parsed.pretrained:  # a pretrained model: parsed (nothing trained, nothing loaded)
        assert parsed.model.name and parsed.eval.variants
        return
    swept = (cfg.hydra.sweeper.get("params") or {}).get("pe")
    for scheme in swept.split(",") if swept else [cfg.pe.name]:
        job = compose(f"experiment={experiment}", f"pe={scheme}", hydra=True)
        planned = plan(job)
        assert planned.scheme.name == scheme and planned.tasks
        assert {ft.key for ft in planned.finetunes} <= set(job.get("finetunes") or {})
        DataConfig.parse(job.data)
    if cfg.data.source == "stdlib":
        load_corpus(cfg.data)


@pytest.mark.slow
def test_paper_experiments_have_the_papers_lengths_and_ratios():
    alibi = compose("experiment=alibi_paper")
    assert list(alibi.eval.lengths) == [512, 1012, 2512, 4512, 7512]
    assert alibi.train.seq_len == 512 and alibi.data.name == "Salesforce/wikitext"
    mini = compose("experiment=alibi_paper_mini")
    for full, small in zip(alibi.eval.lengths, mini.eval.lengths, strict=True):
        assert small / mini.train.seq_len == pytest.approx(full / 512, rel=0.01)
    pi = compose("experiment=pi_paper_mini")
    assert pi.eval.stride / pi.train.seq_len == 256 / 2048  # the paper's sliding stride
    assert pi.finetunes.ft.steps == 10 * pi.finetunes.pi.steps  # FT 10,000 vs PI 1,000 steps
    tuned = plan(pi).finetunes
    assert [(ft.key, ft.scheme.name) for ft in tuned] == [("ft", "rope"), ("pi", "pi")]
    assert tuned[1].scheme.factor == 4.0  # PI's positions / 4 at every length


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["dynamic_ntk", "yarn", "logn"])  # pi, ntk: default
def test_variants_take_the_trained_ropes_base(variant):
    """A variant scores the trained model: at base 500000 its rope+variant rows use 500000
    too (they once used 10000 whatever the trained base), and so does a PI fine-tune."""
    job = plan(compose("pe=rope", "pe.base=500000", f"+pe@eval.variants.{variant}={variant}"))
    assert {task.variant: task.scheme.base for task in job.tasks if task.scheme} == {
        "pi": 500000.0,
        "ntk": 500000.0,
        variant: 500000.0,
    }
    tuned = plan(compose("pe=rope", "pe.base=500000", "+finetune@finetunes.pi=pi")).finetunes
    assert tuned[0].scheme.base == 500000.0


def test_a_variant_at_another_base_than_the_trained_rope_is_refused():
    cfg = compose("pe=rope", "pe.base=500000", "eval.variants.pi.base=10000")
    with pytest.raises(
        UserError,
        match=r"^eval.variants.pi.base=10000 differs from the trained "
        r"model's pe.base=500000: a variant evaluates the trained model",
    ):
        plan(cfg)


def test_unknown_group_option_is_hydra_error():
    with pytest.raises(ConfigCompositionException, match="Could not find 'pe/ropee'"):
        compose("pe=ropee")


@pytest.mark.slow
def test_bad_types_and_unknown_keys():
    with pytest.raises(UserError, match="train.steps='abc' must be an integer"):
        from_node(TrainConfig, compose("train.steps=abc").train, "train")
    with pytest.raises(UserError, match="train.lr='fast' must be a number"):
        from_node(TrainConfig, compose("train.lr=fast").train, "train")
    with pytest.raises(UserError, match=r"unknown key train.stesp; allowed: .*steps"):
        from_node(TrainConfig, compose("+train.stesp=3").train, "train")
    with pytest.raises(UserError, match="eval.modes\\[0\\]=3 must be a string"):
        from_node(EvalConfig, compose("eval.modes=[3]").eval, "eval")


def test_zoo_sweeps_every_scheme_and_evaluates_every_rope_variant():
    cfg = compose("experiment=zoo", hydra=True)
    quick = compose("experiment=quick")
    assert cfg.hydra.sweeper.params.pe.split(",") == TRAINABLE
    assert set(cfg.eval.variants) == set(VARIANTS)
    # The zoo's classic rows are the quick suite's: same trunk, data, training and test tokens.
    for group in ("model", "data", "train"):
        assert cfg[group] == quick[group], group
    assert cfg.eval.tokens == quick.eval.tokens and cfg.eval.factors == quick.eval.factors


def test_ranges_are_checked_where_the_config_enters():
    with pytest.raises(UserError, match=r"train.min_lr_ratio must be >= 0 and <= 1, got -5.0"):
        from_node(TrainConfig, compose("train.min_lr_ratio=-5").train, "train")
    with pytest.raises(UserError, match=r"finetunes.pi.steps must be >= 1, got -3"):
        from_node(FinetuneConfig, {"steps": -3}, "finetunes.pi")
    with pytest.raises(UserError, match=r"train.beta1 must be >= 0 and < 1, got 1.0"):
        TrainConfig(beta1=1.0)  # built in Python: the same checker
    assert Range(ge=0, lt=1).allows(0.5) and not Range(gt=0).allows(float("nan"))
    assert check_value(3, Annotated[float, Range(gt=0)], "x") == 3.0
