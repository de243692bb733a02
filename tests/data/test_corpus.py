"""Corpora: deterministic splits, the three sources, and clear errors for bad data."""

from __future__ import annotations

import pytest
import torch

from pe_bench.data.config import DataConfig
from pe_bench.data.corpus import (
    _load_cached,
    eval_stream,
    load_corpus,
    sample_batch,
    split_documents,
    stdlib_documents,
)
from pe_bench.errors import UserError


@pytest.fixture(autouse=True)
def fresh_cache():
    _load_cached.cache_clear()


def write_docs(folder, n, size=200):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"doc{i:03d}.txt").write_bytes(bytes([65 + i % 26]) * size)
    return folder


def test_stdlib_corpus_needs_no_download_and_skips_tests():
    docs = stdlib_documents()
    assert len(docs) > 300
    assert not any("/test/" in f"/{key}" or "/tests/" in f"/{key}" for key in docs)
    assert "os.py" in docs


def test_stdlib_split_is_deterministic_and_by_document():
    a = load_corpus({"source": "stdlib"})
    _load_cached.cache_clear()
    b = load_corpus({"source": "stdlib"})
    assert a.sha == b.sha
    assert all(torch.equal(a.splits[k], b.splits[k]) for k in ("train", "valid", "test"))
    assert len(a.splits["test"]) > 100_000


def test_document_split_moves_whole_documents():
    docs = {f"d{i}": bytes([i]) * 10 for i in range(100)}
    splits = split_documents(docs, {"split": "document"})
    owners = {split: set(data) - {ord("\n")} for split, data in splits.items()}
    assert owners["train"].isdisjoint(owners["test"]) and owners["valid"].isdisjoint(owners["test"])
    assert set().union(*owners.values()) == set(range(100)) - {ord("\n")}
    # adding a document never moves the others
    more = split_documents({**docs, "new": b"\xff" * 10}, {"split": "document"})
    assert all(owners[s] <= set(more[s]) for s in owners)


def test_text_folder_corpus(tmp_path):
    folder = write_docs(tmp_path / "texts", 40)
    corpus = load_corpus({"source": "text", "path": str(folder)})
    assert corpus.name == "text:texts"
    assert sum(len(v) for v in corpus.splits.values()) >= 40 * 200


def test_single_text_file_is_split_by_bytes(tmp_path):
    file = tmp_path / "book.txt"
    file.write_bytes(bytes(range(256)) * 100)
    corpus = load_corpus({"source": "text", "path": str(file)})
    assert [len(corpus.splits[k]) for k in ("train", "valid", "test")] == [23040, 1280, 1280]


def test_non_utf8_bytes_are_fine(tmp_path):
    file = tmp_path / "latin1.txt"
    file.write_bytes("café ".encode("latin-1") * 500)
    corpus = load_corpus({"source": "text", "path": str(file)})
    assert 0xE9 in corpus.splits["train"].tolist()


def test_missing_and_empty_paths(tmp_path):
    """A config that cannot load is refused when checked (once, as the run's config is
    parsed); a folder that turns out empty, when read."""
    with pytest.raises(UserError, match=r"data.path='/no/such/dir' does not exist"):
        DataConfig.parse({"source": "text", "path": "/no/such/dir"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="has no files matching"):
        load_corpus({"source": "text", "path": str(tmp_path / "empty")})
    (tmp_path / "blank.txt").write_bytes(b"")
    with pytest.raises(UserError, match="every file is empty"):
        load_corpus({"source": "text", "path": str(tmp_path / "blank.txt")})
    with pytest.raises(UserError, match="unknown data.source 'web'"):
        DataConfig.parse({"source": "web"})


def test_corpus_too_small_for_eval_tokens(tmp_path):
    corpus = load_corpus({"source": "text", "path": str(write_docs(tmp_path / "t", 40))})
    with pytest.raises(
        UserError,
        match=r"the test split has .* tokens but evaluation needs 1,000,001 to score 1,000,000",
    ):
        eval_stream(corpus, 1_000_000)


def test_hf_source_on_a_local_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    files = {}
    for split in ("train", "validation", "test"):
        path = tmp_path / f"{split}.txt"
        path.write_text(f"{split} line one\n{split} line two\n")
        files[split] = str(path)
    corpus = load_corpus({"source": "hf", "name": "text", "data_files": files})
    assert bytes(corpus.splits["test"].tolist()) == b"test line one\ntest line two\n"
    assert corpus.name == "hf:text"


def test_hf_source_offline_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(
        UserError, match=r"could not load HF dataset 'Salesforce/wikitext'.*no network"
    ):
        load_corpus(
            {"source": "hf", "name": "Salesforce/wikitext", "config": "wikitext-103-raw-v1"}
        )


def test_batches_depend_only_on_the_generator():
    stream = torch.arange(1000, dtype=torch.uint8)
    a = sample_batch(stream, 4, 16, torch.Generator().manual_seed(7))
    b = sample_batch(stream, 4, 16, torch.Generator().manual_seed(7))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert torch.equal(a[0][:, 1:], a[1][:, :-1])  # targets are inputs shifted by one


def test_unreadable_file_is_named(tmp_path, monkeypatch):
    file = tmp_path / "secret.txt"
    file.write_bytes(b"x" * 100)

    def refuse(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(file), "read_bytes", refuse)
    with pytest.raises(UserError, match=r"cannot read .*secret.txt: Permission denied"):
        load_corpus({"source": "text", "path": str(file)})
