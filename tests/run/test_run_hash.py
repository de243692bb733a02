"""The run hash (``run.config._run_hash``) is what its docstring says: each part's config node
as text (keys in config order, interpolations as written), the parts by name, sorted."""

from __future__ import annotations

import hashlib
import json

from omegaconf import OmegaConf

from pe_bench.data.corpus import identity_keys
from pe_bench.run.config import RunConfig

from ..helpers import TINY, compose


def test_the_run_hash_is_each_part_s_text_as_its_docstring_says():
    cfg = compose(*TINY)
    model = OmegaConf.masked_copy(cfg.model, [k for k in cfg.model if k != "attention"])
    data = OmegaConf.masked_copy(cfg.data, identity_keys(cfg.data))  # byte: no tokenizer keys
    parts = {"data": str(data), "model": str(model), "pe": str(cfg.pe), "train": str(cfg.train)}
    blob = json.dumps(parts, sort_keys=True)
    assert RunConfig.parse(cfg).run_hash == hashlib.sha256(blob.encode()).hexdigest()[:12]


def test_an_interpolation_enters_as_written_and_key_order_counts():
    cfg = compose(*TINY)
    seq_len = cfg.train.seq_len
    written = OmegaConf.create(OmegaConf.to_container(cfg))
    written.train.val_batches = "${train.seq_len}"
    valued = OmegaConf.create(OmegaConf.to_container(cfg))
    valued.train.val_batches = seq_len
    assert RunConfig.parse(written).train.val_batches == RunConfig.parse(valued).train.val_batches
    assert RunConfig.parse(written).run_hash != RunConfig.parse(valued).run_hash
    reordered = OmegaConf.create(OmegaConf.to_container(cfg))
    reordered.train = dict(reversed(list(OmegaConf.to_container(cfg.train).items())))
    assert RunConfig.parse(reordered).run_hash != RunConfig.parse(cfg).run_hash
