"""Shared fixtures: seeded randomness, tiny dimensions, the real config shrunk, the smoke
experiment. Helpers that are not fixtures live in ``tests/helpers.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from pe_bench.positions import ModelDims, base

from .helpers import ROOT, TINY, compose, pe_bench


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n 2``) each worker and the processes its tests start use one
    thread: two processes of two threads each on two cores run 3-5x slower (MKL and OpenMP
    spin), one thread each runs both at full speed."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def unrendered_figures(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast-lane tests check what a report says and which files it writes, not how its
    figures render: there each figure is built whole (its data, axes and artists) but not
    drawn, and its PNG is an empty file (drawing is 60% of a small report's time, at any
    resolution). Tests marked ``real_figures`` or ``slow`` (report/test_figures.py, the
    committed reports' regeneration) and every ``pe-bench`` process a test starts draw and save
    figures as a report does."""
    if request.node.get_closest_marker("real_figures") or request.node.get_closest_marker("slow"):
        return
    from pe_bench.files import atomic_write_text
    from pe_bench.report import figures

    def save(fig, folder: Path, name: str) -> Path:
        png = folder / f"{name}.png"
        atomic_write_text(png, "")
        return png

    monkeypatch.setattr(figures, "save", save)


@pytest.fixture
def dims() -> ModelDims:
    return ModelDims(d_model=32, num_heads=4, head_dim=8, num_layers=2, train_len=16)


@pytest.fixture(scope="session")
def smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """``pe-bench experiment=smoke`` once per session: (process, its output folder)."""
    out = tmp_path_factory.mktemp("smoke")
    return pe_bench("experiment=smoke", out=out), out / "smoke"


@pytest.fixture
def tiny_config() -> Callable[..., DictConfig]:
    """The real Hydra config shrunk to a run that takes a second (``TINY``): call it with
    more overrides, e.g. ``tiny_config("pe=alibi")``, and pass the result to ``cli.bench.run``."""
    return lambda *overrides: compose(*TINY, *overrides)


@pytest.fixture
def example_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """examples/my_pe importable as ``my_pe``, not yet imported nor registered, so that
    ``pe.plugin=my_pe`` (or its entry point) imports and registers it in this test; the
    registry and ``sys.modules`` are as they were afterwards. (A ``my_pe`` module another test
    left imported would not register again in a registry that lost it: "unknown scheme".)"""
    folder = ROOT / "examples" / "my_pe"
    monkeypatch.syspath_prepend(str(folder))
    registry = {name: cls for name, cls in base._REGISTRY.items() if name != "my_pe"}
    monkeypatch.setattr(base, "_REGISTRY", registry)
    monkeypatch.delitem(sys.modules, "my_pe", raising=False)
    yield folder
    sys.modules.pop("my_pe", None)  # then monkeypatch puts back the module there was before
