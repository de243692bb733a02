"""Tokenizers: bytes (the default), a byte-level BPE trained on the train split, or a
pretrained Hugging Face tokenizer.

``build_tokenizer(spec)`` takes ``data.tokenizer``:

- ``byte``: a token is a byte, vocabulary 256; needs no library, and every result so far was
  made with it.
- ``bpe``: a byte-level BPE (GPT-2's byte alphabet and pre-tokenizer, no special tokens)
  trained with the Hugging Face ``tokenizers`` library on the train split only, so that no
  merge is learnt from test text; cached on disk under ``cache_dir()`` by the hash of the
  train text and the settings, so a second run loads it.
- ``hf:<name or folder>``: a pretrained tokenizer: a local folder holding ``tokenizer.json``
  (or that file itself), else a Hugging Face hub name (needs a network; offline, one line).

Every tokenizer has ``name``, ``vocab_size``, ``fingerprint`` (a hash of what maps text to
ids, for cache keys and records), ``encode``, ``decode`` and ``token_bytes``: the UTF-8 byte
length of each token id, so that bits per byte is the scored targets' own bytes
(``count_bytes``) whatever the tokenizer, and byte and BPE runs compare. ``tokenizers`` is an
optional extra (``pip install -e '.[hf]'``): only ``bpe`` and ``hf:`` import it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pe_bench.errors import UserError
from pe_bench.files import atomic_write_text

log = logging.getLogger(__name__)

BYTE, BPE, HF_PREFIX = "byte", "bpe", "hf:"
ALLOWED = f"{BYTE}, {BPE}, {HF_PREFIX}<hub name or folder with tokenizer.json>"
BYTE_VOCAB = 256
DEFAULT_BPE_VOCAB = 4096
BPE_RECIPE = 1  # bump when the training recipe changes: cached tokenizers are retrained
CHUNK_CHARS = 1 << 20  # text is encoded (and BPE trained) in chunks of about this many chars
BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # SentencePiece's byte tokens: one byte each
SPACE_MARK = "▁"  # SentencePiece's (Metaspace's) mark for a space: one byte


class Tokenizer:
    """What pe-bench needs of a tokenizer: text to ids and back, the vocabulary size, a
    fingerprint, and each token's bytes (for bits per byte)."""

    name: str  # byte, bpe, or hf:<name>
    vocab_size: int  # ids are 0 .. vocab_size - 1
    fingerprint: str  # sha256 hex of what maps text to ids
    token_bytes: np.ndarray  # [vocab_size] int64: UTF-8 bytes of each token id's text

    def encode(self, text: str | bytes) -> np.ndarray:
        """Token ids of ``text`` (bytes are read as UTF-8)."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        raise NotImplementedError

    def count_bytes(self, ids: Sequence[int] | np.ndarray) -> int:
        """The UTF-8 bytes of the text of ``ids``: the denominator of bits per byte."""
        return int(self.token_bytes[np.asarray(ids, dtype=np.int64)].sum())

    def describe(self) -> str:
        sha = self.fingerprint[:12]
        return f"tokenizer {self.name} (vocabulary {self.vocab_size:,}, sha {sha})"


class ByteTokenizer(Tokenizer):
    """A token is a byte: ids are byte values, any byte string round-trips."""

    name = BYTE
    vocab_size = BYTE_VOCAB
    fingerprint = hashlib.sha256(b"byte:" + bytes(range(BYTE_VOCAB))).hexdigest()
    token_bytes = np.ones(BYTE_VOCAB, dtype=np.int64)

    def encode(self, text: str | bytes) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).copy()

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return bytes(np.asarray(ids, dtype=np.uint8).tobytes()).decode("utf-8", errors="replace")


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` (trained here, or pretrained) behind pe-bench's interface."""

    def __init__(self, name: str, tokenizer: Any) -> None:
        self.name, self.backend = name, tokenizer
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1
        self.fingerprint = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
        self.token_bytes = hf_token_bytes(tokenizer, self.vocab_size)

    def encode(self, text: str | bytes) -> np.ndarray:
        """Ids of ``text``, encoded in chunks cut after a newline (the same text always gives
        the same ids); no special tokens are added."""
        if isinstance(text, bytes):
            text = utf8(text)
        chunks = list(text_chunks(text))
        encoded = self.backend.encode_batch(chunks, add_special_tokens=False) if chunks else []
        ids = [np.asarray(e.ids, dtype=np.int64) for e in encoded]
        return np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)


def build_tokenizer(
    spec: str, train_text: bytes | None = None, vocab_size: int | None = None
) -> Tokenizer:
    """The tokenizer ``spec`` names (``data.tokenizer``); ``bpe`` trains on ``train_text``
    (the train split only) with ``vocab_size`` symbols, or loads it from the cache."""
    if spec == BYTE:
        return ByteTokenizer()
    if spec == BPE:
        if train_text is None:
            raise UserError("data.tokenizer=bpe trains on the train split: no train text given")
        return trained_bpe(train_text, vocab_size or DEFAULT_BPE_VOCAB)
    if isinstance(spec, str) and spec.startswith(HF_PREFIX) and spec[len(HF_PREFIX) :]:
        return pretrained(spec[len(HF_PREFIX) :])
    raise UserError(f"unknown data.tokenizer {spec!r}; allowed: {ALLOWED}")


def check_spec(spec: Any, vocab_size: int | None) -> None:
    """Refuse a ``data.tokenizer`` (and ``data.vocab_size``) that cannot work, without loading
    or training anything."""
    pretrained = isinstance(spec, str) and spec.startswith(HF_PREFIX) and spec != HF_PREFIX
    if spec not in (BYTE, BPE) and not pretrained:
        raise UserError(f"unknown data.tokenizer {spec!r}; allowed: {ALLOWED}")
    if spec == BPE and vocab_size is not None and vocab_size <= BYTE_VOCAB:
        raise UserError(
            f"data.vocab_size={vocab_size} leaves no room for merges: a byte-level BPE "
            f"starts from {BYTE_VOCAB} byte symbols; allowed: > {BYTE_VOCAB}"
        )


def _tokenizers() -> Any:
    """The ``tokenizers`` library, or one line saying how to install it."""
    try:
        import tokenizers
    except ImportError as err:
        raise UserError(
            "data.tokenizer=bpe or hf:<name> needs the 'tokenizers' package: pip install -e '.[hf]'"
        ) from err
    return tokenizers


def cache_dir() -> Path:
    """Where trained tokenizers are kept: ``$PE_BENCH_CACHE/tokenizers`` (default
    ``~/.cache/pe-bench``)."""
    root = os.environ.get("PE_BENCH_CACHE") or Path.home() / ".cache" / "pe-bench"
    return Path(root).expanduser() / "tokenizers"


def bpe_cache_key(train_text: bytes, vocab_size: int) -> str:
    """What a trained BPE depends on: the train text, the vocabulary size, the recipe and the
    library's version (a new version may merge ties otherwise)."""
    settings = {
        "train_sha": hashlib.sha256(train_text).hexdigest(),
        "vocab_size": vocab_size,
        "recipe": BPE_RECIPE,
        "tokenizers": _tokenizers().__version__,
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:24]


def trained_bpe(train_text: bytes, vocab_size: int) -> HFTokenizer:
    """A byte-level BPE of ``vocab_size`` symbols (fewer if the text has no more pairs to
    merge) trained on ``train_text``, from the cache when it was trained before."""
    lib = _tokenizers()
    path = cache_dir() / f"bpe-{vocab_size}-{bpe_cache_key(train_text, vocab_size)}.json"
    if path.exists():
        log.info("BPE tokenizer from the cache: %s", path)
        return HFTokenizer(BPE, lib.Tokenizer.from_file(str(path)))
    tokenizer = lib.Tokenizer(lib.models.BPE())
    tokenizer.pre_tokenizer = lib.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = lib.decoders.ByteLevel()
    trainer = lib.trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=lib.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(text_chunks(utf8(train_text)), trainer=trainer)
    atomic_write_text(path, tokenizer.to_str())
    log.info("trained a BPE tokenizer of %d symbols, cached in %s", vocab_size, path)
    return HFTokenizer(BPE, tokenizer)


def pretrained(where: str) -> HFTokenizer:
    """``tokenizer.json`` from a local file or folder, else from the hub by name; a missing
    network or name is one line."""
    lib = _tokenizers()
    local = Path(where).expanduser()
    file = local / "tokenizer.json" if local.is_dir() else local
    if file.is_file():
        try:
            return HFTokenizer(f"{HF_PREFIX}{where}", lib.Tokenizer.from_file(str(file)))
        except Exception as err:  # the Rust side raises plain Exceptions
            raise UserError(f"data.tokenizer=hf:{where}: {file} is not a tokenizer: {err}") from err
    if where.startswith(("/", ".", "~")) and not local.exists():
        raise UserError(f"data.tokenizer=hf:{where}: no such file or folder")
    if local.is_dir():
        raise UserError(
            f"data.tokenizer=hf:{where}: the folder has no tokenizer.json; allowed: a folder "
            "with tokenizer.json, that file, or a hub name"
        )
    try:
        with quiet("huggingface_hub"):  # its retries would log a line each
            backend = lib.Tokenizer.from_pretrained(where)
    except Exception as err:  # offline, unknown name, no tokenizer.json: many types
        first = str(err).splitlines()[0] if str(err) else ""
        raise UserError(
            f"could not load tokenizer {where!r} from the Hugging Face hub: "
            f"{type(err).__name__}: {first} (no network? pass a local folder with "
            "tokenizer.json: data.tokenizer=hf:<folder>)"
        ) from err
    return HFTokenizer(f"{HF_PREFIX}{where}", backend)


@contextlib.contextmanager
def quiet(logger: str) -> Iterator[None]:
    """Silence ``logger`` below errors for the duration."""
    target = logging.getLogger(logger)
    level = target.level
    target.setLevel(logging.ERROR)
    try:
        yield
    finally:
        target.setLevel(level)


def hf_token_bytes(tokenizer: Any, vocab_size: int) -> np.ndarray:
    """The UTF-8 bytes of each token id's text: a byte-level token's characters are one byte
    each (GPT-2's byte alphabet), SentencePiece's ``<0xNN>`` is one byte and its ``▁`` a space;
    special tokens are no text (0); ids the vocabulary skips are 0."""
    lib = _tokenizers()
    byte_chars = set(lib.pre_tokenizers.ByteLevel.alphabet())
    config = json.loads(tokenizer.to_str())
    byte_level = has_type(config.get("decoder"), "ByteLevel")
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    sizes = np.zeros(vocab_size, dtype=np.int64)
    for token, index in tokenizer.get_vocab(with_added_tokens=True).items():
        if token in special:
            continue
        if byte_level and all(c in byte_chars for c in token):
            sizes[index] = len(token)
        elif BYTE_FALLBACK.fullmatch(token):
            sizes[index] = 1
        else:
            sizes[index] = len(token.replace(SPACE_MARK, " ").encode("utf-8"))
    return sizes


def has_type(node: Any, kind: str) -> bool:
    """Whether a ``tokenizer.json`` component, or one inside it (a ``Sequence``), is ``kind``."""
    if isinstance(node, dict):
        return node.get("type") == kind or any(has_type(v, kind) for v in node.values())
    if isinstance(node, list):
        return any(has_type(v, kind) for v in node)
    return False


def utf8(data: bytes) -> str:
    """``data`` as text; bytes that are not UTF-8 become U+FFFD (logged), since subword
    tokenizers read text."""
    text = data.decode("utf-8", errors="replace")
    if "\ufffd" in text and "\ufffd".encode() not in data:
        log.warning("the text is not all UTF-8: invalid bytes are read as U+FFFD")
    return text


def text_chunks(text: str, size: int = CHUNK_CHARS) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, each cut after a newline when there is
    one, so that encoding is the same for the same text and splits few words."""
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            newline = text.rfind("\n", start, end)
            end = newline + 1 if newline > start else end
        yield text[start:end]
        start = end
