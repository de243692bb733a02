"""The data config (``pe_bench/data/config.py``): typed once, a task's options typed by its
task's constructor, bad values refused in one line before any data is read."""

from __future__ import annotations

import re

import pytest

from pe_bench.data.config import DataConfig
from pe_bench.errors import UserError
from pe_bench.run.config import RunConfig
from tests.helpers import compose


def test_a_bad_data_config_is_refused_before_loading():
    with pytest.raises(UserError, match="data=hf needs data.name=<dataset>"):
        DataConfig.parse({"source": "hf", "name": None})
    with pytest.raises(UserError, match="data.splits lacks test"):
        DataConfig.parse({"source": "hf", "name": "x", "splits": {"train": "a", "valid": "b"}})
    with pytest.raises(UserError, match="unknown data.source 'ftp'; allowed: stdlib, text, hf"):
        DataConfig.parse({"source": "ftp"})


def test_a_runs_data_config_is_typed_with_its_tasks_options():
    cfg = compose("data=task", "data.task=flip_flop", "data.ignore_prob=0.5", "data.alphabet=8")
    data = RunConfig.parse(cfg).data
    assert isinstance(data, DataConfig) and (data.source, data.task) == ("task", "flip_flop")
    assert data.eval_instances == 128  # conf/data/task.yaml's
    assert data.task_options == {
        "alphabet": 8,
        "num_kv_pairs": 4,
        "power_a": 0.01,
        "ignore_prob": 0.5,
    }


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("alphabet", 1, "data.alphabet must be >= 2 and <= 240, got 1"),
        ("alphabet", "abc", "data.alphabet='abc' must be an integer"),
        ("ignore_prob", 1.0, "data.ignore_prob must be >= 0 and < 1, got 1.0"),
        ("num_kv_pairs", 0, "data.num_kv_pairs must be >= 1 and <= 64, got 0"),
        ("power_a", 0, "data.power_a must be > 0 and <= 1, got 0.0"),
    ],
)
def test_a_task_option_is_checked_by_its_tasks_constructor_hints(option, value, message):
    with pytest.raises(UserError, match=re.escape(message)):
        DataConfig.parse({"source": "task", "task": "copy", option: value})


def test_a_task_option_of_another_source_is_an_unknown_key():
    with pytest.raises(UserError, match="unknown key data.alphabet; allowed: config, data_files"):
        DataConfig.parse({"source": "stdlib", "alphabet": 8})
    with pytest.raises(UserError, match="unknown key data.alphabett; allowed with data=task: "):
        DataConfig.parse({"source": "task", "task": "copy", "alphabett": 8})
    with pytest.raises(UserError, match=r"allowed with data=task: alphabet, config, .*power_a"):
        DataConfig.parse({"source": "task", "task": "copy", "alphabett": 8})
