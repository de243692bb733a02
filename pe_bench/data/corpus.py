"""Corpora, the byte tokenizer, deterministic train/valid/test splits, and batching.

Three text sources, one ``Corpus`` out, and synthetic tasks (``task``, a ``TaskData`` from
``pe_bench.data.tasks``) with the same training interface (``train_batch``, ``valid_windows``):

- ``stdlib`` (default): the ``.py`` files of the running Python's standard library, minus its
  test suites. Ships with every Python, so the suite runs with no download; its content hash
  goes into every record because it differs between Python versions.
- ``text``: a local file or folder of text files.
- ``hf``: a Hugging Face dataset by name (needs a network, or a local dataset such as
  ``name: text`` with ``data_files``).

Tokens are bytes (vocabulary 256) by default; ``data.tokenizer`` picks another
(``pe_bench.data.tokenizer``: a BPE trained on the train split, or a pretrained one), and the
corpus's splits are then that tokenizer's ids. ``Corpus.sha`` identifies the text either way;
``Corpus.tokenizer`` says how it was cut into tokens.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pe_bench.data.config import HF_SPLITS, SPLITS, TEXT_PATH, DataConfig
from pe_bench.data.tasks import TaskData, load_task
from pe_bench.data.tokenizer import BPE, BYTE, ByteTokenizer, Tokenizer, build_tokenizer
from pe_bench.errors import UserError

log = logging.getLogger(__name__)

VOCAB_SIZE = 256  # the byte tokenizer's symbols: every source's corpus has these
STDLIB_SKIP = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


@dataclass(frozen=True)
class Corpus:
    name: str
    sha: str  # sha256 of the three split byte streams: identifies the data in records
    splits: Mapping[str, Tensor]  # token stream per split (uint8 for bytes)
    tokenizer: Tokenizer = field(default_factory=ByteTokenizer)

    def describe(self) -> str:
        sizes = ", ".join(f"{k} {len(v):,}" for k, v in self.splits.items())
        described = f"corpus {self.name} ({sizes} tokens, sha {self.sha[:12]})"
        if self.tokenizer.name != BYTE:
            described += f", {self.tokenizer.describe()}"
        return described

    def train_batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """Random windows of the train split (``sample_batch``)."""
        return sample_batch(self.splits["train"], batch_size, seq_len, generator)

    def valid_windows(self, n_windows: int, seq_len: int) -> tuple[Tensor, Tensor]:
        """Up to ``n_windows`` consecutive windows from the start of the valid split."""
        stream = self.splits["valid"]
        n_windows = min(n_windows, (len(stream) - 1) // seq_len)
        if n_windows < 1:
            raise UserError(f"the valid split has {len(stream)} tokens, fewer than {seq_len + 1}")
        n = n_windows * seq_len
        inputs = stream[:n].long().view(n_windows, seq_len)
        return inputs, stream[1 : n + 1].long().view(n_windows, seq_len)


def load_corpus(cfg: DataConfig | Mapping[str, Any]) -> Corpus | TaskData:
    """Load the corpus (or task) a ``data`` config describes (typed: ``DataConfig``, as
    ``run.config.RunConfig.parse`` typed it; or a mapping, typed here); cached per config in a
    process."""
    data = cfg if isinstance(cfg, DataConfig) else DataConfig.parse(cfg)
    if data.source == "task":
        return load_task(data.task_config())
    return _load_cached(json.dumps(data.as_dict(), sort_keys=True, default=str))


def identity_keys(cfg: Mapping[str, Any]) -> list[str]:
    """The keys of a ``data`` config that say which tokens a model trains on (its run id's
    share): with the byte tokenizer neither ``tokenizer`` nor ``vocab_size`` (so byte runs keep
    the ids they had before tokenizers were a setting), with ``hf:`` no ``vocab_size`` (the
    tokenizer has its own)."""
    spec = cfg.get("tokenizer", BYTE)
    unused = (
        {"tokenizer", "vocab_size"} if spec == BYTE else set() if spec == BPE else {"vocab_size"}
    )
    return [str(key) for key in cfg if key not in unused]


@lru_cache(maxsize=4)
def _load_cached(cfg_json: str) -> Corpus:
    cfg = json.loads(cfg_json)
    source = cfg.get("source")
    if source == "stdlib":
        splits = split_documents(stdlib_documents(), cfg)
        name = "stdlib"
    elif source == "text":
        splits = split_documents(text_documents(cfg.get("path"), cfg.get("glob", "**/*.txt")), cfg)
        name = f"text:{Path(cfg['path']).name}"
    else:
        splits = hf_splits(cfg)
        name = f"hf:{cfg['name']}" + (f"/{cfg['config']}" if cfg.get("config") else "")
    for split in SPLITS:
        if not splits[split]:
            raise UserError(empty_split(name, cfg, split, sum(map(len, splits.values()))))
    digest = hashlib.sha256()
    for split in SPLITS:
        digest.update(f"{split}:{len(splits[split])}:".encode())
        digest.update(splits[split])
    spec = cfg.get("tokenizer") or BYTE
    if spec == BYTE:
        tokenizer: Tokenizer = ByteTokenizer()
        tensors = {k: torch.frombuffer(bytearray(v), dtype=torch.uint8) for k, v in splits.items()}
    else:  # trained on the train split only: no merge is learnt from valid or test text
        tokenizer = build_tokenizer(spec, splits["train"], cfg.get("vocab_size"))
        tensors = {k: torch.from_numpy(tokenizer.encode(v)) for k, v in splits.items()}
    corpus = Corpus(name=name, sha=digest.hexdigest(), splits=tensors, tokenizer=tokenizer)
    log.info("loaded %s", corpus.describe())
    return corpus


def empty_split(name: str, cfg: Mapping[str, Any], split: str, size: int) -> str:
    """Why ``split`` of a corpus of ``size`` bytes is empty, and what would fill it."""
    where = f"data.path={cfg['path']!r}" if cfg.get("path") else f"corpus {name}"
    frac = float(cfg.get(f"{split}_frac", 0.05)) if split != "train" else 0.0
    if frac and size * frac < 1:  # split by bytes: too little text for a byte of the split
        least = max(-(-1 // float(cfg.get(f"{s}_frac", 0.05))) for s in ("valid", "test"))
        return (
            f"{where} holds {size:,} byte{'' if size == 1 else 's'}: data.{split}_frac={frac:g} "
            "of them is less than one, "
            f"so the {split} split is empty; allowed: a text of at least {int(least):,} bytes "
            "(and enough for training windows of train.seq_len + 1 tokens)"
        )
    return (
        f"{where}: no document fell in the {split} split (documents are split by a hash of "
        f"their name, data.{split}_frac={frac:g}); allowed: more documents, or data.split=bytes"
    )


def tokens_bound(data: DataConfig) -> int | None:
    """The corpus's bytes, from its files' sizes without reading them: at most as many tokens
    (a token is at least a byte), what a training length is checked against before any data
    is read. None where it is not known (a dataset of the hub, a synthetic task)."""
    return _tokens_bound(data.source, str(data.path), data.glob)


@lru_cache(maxsize=8)
def _tokens_bound(source: str, path: str, pattern: str) -> int | None:
    if source == "stdlib":
        files = stdlib_paths()
    elif source == "text":
        files = text_files(path, pattern)
    else:
        return None
    return sum(path.stat().st_size for path in files) + max(len(files) - 1, 0)  # "\n"-joined


def stdlib_paths() -> list[Path]:
    """The standard library's ``.py`` files outside test folders."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in STDLIB_SKIP]  # prune the walk
        paths += [Path(folder, file) for file in files if file.endswith(".py")]
    return paths


def stdlib_documents() -> dict[str, bytes]:
    """The standard library's ``.py`` files outside test folders, keyed by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = {path.relative_to(root).as_posix(): path.read_bytes() for path in stdlib_paths()}
    if not docs:
        raise UserError(f"no standard-library sources found under {root}; use data=text")
    return docs


def text_documents(path: str, pattern: str) -> dict[str, bytes]:
    """A file (one document) or every file under a folder matching ``pattern``.

    Files are read as bytes: the byte tokenizer needs no decoding, so non-UTF-8 text is fine.
    """
    root = Path(path).expanduser()
    files = text_files(path, pattern)
    docs = {}
    for file in files:
        try:
            docs[file.relative_to(root).as_posix() if file != root else file.name] = (
                file.read_bytes()
            )
        except OSError as err:
            raise UserError(f"cannot read {file}: {err.strerror}") from err
    if not any(docs.values()):
        raise UserError(
            f"data.path={path!r}: every file is empty; allowed: text, enough for windows of "
            "train.seq_len + 1 tokens in each split"
        )
    return docs


def text_files(path: str, pattern: str) -> list[Path]:
    """The file ``path`` or the files under the folder ``path`` matching ``pattern``: at least
    one, or a ``UserError`` naming the path and what is allowed."""
    root = Path(path).expanduser()
    if not root.exists():
        raise UserError(f"data.path={path!r} does not exist; allowed: {TEXT_PATH}")
    files = [root] if root.is_file() else sorted(p for p in root.glob(pattern) if p.is_file())
    if not files:
        raise UserError(
            f"data.path={path!r} has no files matching data.glob={pattern!r}; allowed: a "
            "folder with at least one, a text file, or a data.glob that matches its files"
        )
    return files


def split_documents(docs: dict[str, bytes], cfg: Mapping[str, Any]) -> dict[str, bytes]:
    """Deterministic split: by document (hash of its key) or, for few documents, by bytes.

    ``cfg.valid_frac`` and ``cfg.test_frac`` give the fractions; ``cfg.split`` is ``document``,
    ``bytes``, or ``auto`` (documents when there are at least ``min_documents`` of them).
    """
    valid_frac, test_frac = float(cfg.get("valid_frac", 0.05)), float(cfg.get("test_frac", 0.05))
    mode = cfg.get("split", "auto")
    if mode == "auto":
        mode = "document" if len(docs) >= int(cfg.get("min_documents", 20)) else "bytes"
    if mode == "bytes":
        stream = b"\n".join(docs[key] for key in sorted(docs))
        n_valid, n_test = int(len(stream) * valid_frac), int(len(stream) * test_frac)
        n_train = len(stream) - n_valid - n_test
        return {
            "train": stream[:n_train],
            "valid": stream[n_train : n_train + n_valid],
            "test": stream[n_train + n_valid :],
        }
    if mode != "document":
        raise UserError(f"data.split={mode!r} is not one of auto, document, bytes")
    parts: dict[str, list[bytes]] = {split: [] for split in SPLITS}
    for key in sorted(docs):
        # A stable hash of the key, not of the content: editing a file never moves it.
        u = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
        split = "test" if u < test_frac else "valid" if u < test_frac + valid_frac else "train"
        parts[split].append(docs[key])
    return {split: b"\n".join(chunks) for split, chunks in parts.items()}


def hf_splits(cfg: Mapping[str, Any]) -> dict[str, bytes]:
    """Load a Hugging Face dataset by name and join each split's text rows into one stream."""
    try:
        import datasets
    except ImportError as err:
        raise UserError("data=hf needs the 'datasets' package: pip install -e '.[hf]'") from err
    try:
        loaded = datasets.load_dataset(
            cfg["name"],
            cfg.get("config"),
            data_files=cfg.get("data_files"),
            **(cfg.get("kwargs") or {}),
        )
    except Exception as err:  # datasets raises many types: offline, missing, bad config
        raise UserError(
            f"could not load HF dataset {cfg['name']!r} (config {cfg.get('config')!r}): "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''} "
            "(no network? use data=text data.path=<folder>)"
        ) from err
    names = cfg.get("splits") or HF_SPLITS
    field = cfg.get("text_field", "text")
    out = {}
    for split in SPLITS:
        hf_name = names.get(split)
        if hf_name not in loaded:
            raise UserError(
                f"HF dataset {cfg['name']!r} has no split {hf_name!r} for {split}; "
                f"it has {', '.join(loaded)} (set data.splits.{split}=...)"
            )
        rows = loaded[hf_name][field]
        out[split] = "".join(r if r.endswith("\n") else r + "\n" for r in rows).encode()
    return out


def sample_batch(
    stream: Tensor, batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Random windows of ``seq_len + 1`` tokens -> inputs and next-token targets ``[b, s]``.

    The offsets come from ``generator`` alone, so every scheme sees the same data order.
    """
    if len(stream) <= seq_len + 1:
        raise UserError(
            f"the train split has {len(stream)} tokens, too few for windows of {seq_len + 1}"
        )
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=generator)
    windows = torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()]).long()
    return windows[:, :-1], windows[:, 1:]


def eval_stream(corpus: Corpus, n_tokens: int, split: str = "test") -> Tensor:
    """The first ``n_tokens + 1`` tokens of a split: ``n_tokens`` targets, each with its input."""
    stream = corpus.splits[split]
    if len(stream) < n_tokens + 1:
        raise UserError(
            f"{corpus.name}: the {split} split has {len(stream):,} tokens but evaluation needs "
            f"{n_tokens + 1:,} to score {n_tokens:,} targets; lower eval.tokens or use more data"
        )
    return stream[: n_tokens + 1].long()
