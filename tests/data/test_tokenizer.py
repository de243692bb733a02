"""Tokenizers (``data.tokenizer``): bytes unchanged, a BPE trained on the train split only and
cached, a pretrained tokenizer from a local folder, bits per byte from the scored targets' own
bytes, the model's vocabulary, and reports that refuse to mix tokenizers per token."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pe_bench.cli import bench
from pe_bench.data import tokenizer
from pe_bench.data.corpus import load_corpus
from pe_bench.data.tokenizer import ByteTokenizer, build_tokenizer
from pe_bench.errors import UserError
from pe_bench.files import write_jsonl
from pe_bench.records import load_records, make_record
from pe_bench.report.build import build_report
from pe_bench.report.inputs import Options
from pe_bench.run.plan import plan
from tests.helpers import pe_bench, record

tokenizers = pytest.importorskip("tokenizers")

TRAIN_WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "längst", "naïve"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """Trained tokenizers go to a folder of this test's own."""
    monkeypatch.setenv("PE_BENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tokenizers"


def corpus_file(folder: Path) -> Path:
    """One text file split by bytes: train words in the first 90%, then valid and test text
    of ``zq`` pairs that the train split never has."""
    rng = np.random.default_rng(0)
    train = " ".join(rng.choice(TRAIN_WORDS, 6000)) + "\n"
    tail = "zq" * (len(train.encode()) // 18) + "\n"  # about 5% each for valid and test
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "corpus.txt"
    path.write_text(train + tail)
    return path


def text_data(path: Path, **settings) -> dict:
    return {"source": "text", "path": str(path), "split": "bytes", **settings}


def test_byte_tokenizer_is_the_bytes():
    tok = build_tokenizer("byte")
    ids = tok.encode("naïve\n")
    assert ids.tolist() == list("naïve\n".encode())
    assert (tok.name, tok.vocab_size) == ("byte", 256)
    assert tok.decode(ids) == "naïve\n"
    assert tok.count_bytes(ids) == len(ids) == 7
    assert tok.token_bytes.tolist() == [1] * 256


def test_bpe_learns_merges_from_the_train_split_only(tmp_path):
    data = text_data(corpus_file(tmp_path / "text"), tokenizer="bpe", vocab_size=300)
    corpus = load_corpus(data)
    tok = corpus.tokenizer
    assert tok.name == "bpe" and 256 < tok.vocab_size <= 300
    assert len(tok.encode(" alpha")) == 1  # a train word is one token ...
    assert len(tok.encode("zqzqzq")) == 6  # ... test text is left in bytes: never merged
    test_text = tok.decode(corpus.splits["test"].numpy())
    assert set(test_text) <= set("zq\n") and "zqzq" in test_text
    byte_corpus = load_corpus(text_data(Path(data["path"])))
    assert corpus.sha == byte_corpus.sha  # the same text, cut into other tokens


def test_bpe_is_cached_by_text_and_settings(tmp_path, cache, monkeypatch):
    text = corpus_file(tmp_path / "text").read_bytes()
    first = build_tokenizer("bpe", text, 300)
    assert len(list(cache.glob("bpe-*.json"))) == 1

    def no_training(*args, **kwargs):
        raise AssertionError("trained again instead of loading the cache")

    monkeypatch.setattr(tokenizers.trainers, "BpeTrainer", no_training)
    again = build_tokenizer("bpe", text, 300)
    assert again.fingerprint == first.fingerprint
    with pytest.raises(AssertionError, match="trained again"):
        build_tokenizer("bpe", text, 290)  # another vocabulary size: another key
    with pytest.raises(AssertionError, match="trained again"):
        build_tokenizer("bpe", text + b"more text\n", 300)  # other text: another key
    keys = {tokenizer.bpe_cache_key(text, 300), tokenizer.bpe_cache_key(text, 290)}
    assert len(keys | {tokenizer.bpe_cache_key(text + b"x", 300)}) == 3


def test_pretrained_tokenizer_from_a_local_folder(tmp_path):
    lib = tokenizers
    backend = lib.Tokenizer(lib.models.BPE())
    backend.pre_tokenizer = lib.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = lib.decoders.ByteLevel()
    trainer = lib.trainers.BpeTrainer(
        vocab_size=280,
        initial_alphabet=lib.pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    backend.train_from_iterator(TRAIN_WORDS * 50, trainer=trainer)
    folder = tmp_path / "tiny-tokenizer"
    folder.mkdir()
    backend.save(str(folder / "tokenizer.json"))

    tok = build_tokenizer(f"hf:{folder}")
    assert tok.name == f"hf:{folder}" and tok.vocab_size == backend.get_vocab_size()
    text = "längst naïve alpha, 🙂\n"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.count_bytes(ids) == len(text.encode())  # multi-byte characters counted exactly
    assert tok.token_bytes[backend.token_to_id("<|endoftext|>")] == 0  # no text
    assert build_tokenizer(f"hf:{folder / 'tokenizer.json'}").fingerprint == tok.fingerprint
    with pytest.raises(UserError, match=r"hf:/no/such/folder: no such file or folder"):
        build_tokenizer("hf:/no/such/folder")
    with pytest.raises(UserError, match=r"the folder has no tokenizer.json"):
        build_tokenizer(f"hf:{tmp_path}")


def test_sentencepiece_tokens_count_their_bytes():
    """Byte-fallback tokens are one byte, the space mark one byte, special tokens none."""
    lib = tokenizers
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}, "▁": 257, "▁é": 258}
    backend = lib.Tokenizer(lib.models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.add_special_tokens(["<unk>"])
    sizes = tokenizer.hf_token_bytes(backend, 259)
    assert sizes[0] == 0 and sizes[1 + 0xC3] == 1 and sizes[257] == 1 and sizes[258] == 3


def test_an_unknown_tokenizer_is_one_line(tiny_config):
    with pytest.raises(UserError, match=r"unknown data.tokenizer 'wordpiece'; allowed: byte, bpe"):
        plan(tiny_config("data.tokenizer=wordpiece"))
    with pytest.raises(UserError, match=r"data.vocab_size=200 leaves no room for merges"):
        plan(tiny_config("data.tokenizer=bpe", "data.vocab_size=200"))


def test_no_network_is_one_line(monkeypatch):
    def offline(name):
        raise OSError("We couldn't connect to 'https://huggingface.co'.\nCheck your network")

    hub = SimpleNamespace(Tokenizer=SimpleNamespace(from_pretrained=offline))
    monkeypatch.setattr(tokenizer, "_tokenizers", lambda: hub)
    with pytest.raises(UserError) as caught:
        build_tokenizer("hf:some-org/some-tokenizer")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("could not load tokenizer 'some-org/some-tokenizer'")
    assert "no network? pass a local folder" in message


def test_bits_per_byte_counts_the_scored_targets_own_bytes():
    """Targets ``é a é`` (2 + 1 + 2 bytes) after an input ``hello``: 5 bytes for 3 scored
    targets, where the stream's average (10 bytes over 4 tokens) would say 7.5."""
    lib = tokenizers
    vocab = {"hello": 0, "a": 1, "é": 2}
    backend = lib.Tokenizer(lib.models.WordLevel(vocab, unk_token="a"))
    backend.pre_tokenizer = lib.pre_tokenizers.Whitespace()
    tok = tokenizer.HFTokenizer("hf:hand", backend)
    stream = tok.encode("hello é a é")
    assert stream.tolist() == [0, 2, 1, 2]
    target_bytes = tok.count_bytes(stream[1:])
    assert target_bytes == 5
    nll = 1.2  # nats per scored target
    bpb = make_record({}, {}, "ok", nll, target_bytes / 3)["bpb"]
    assert bpb == pytest.approx(nll * 3 / (5 * math.log(2)))
    average = tok.count_bytes(stream) / len(stream)
    assert make_record({}, {}, "ok", nll, average)["bpb"] != pytest.approx(bpb)


@pytest.mark.slow
def test_the_model_vocabulary_follows_the_tokenizer(tiny_config, tmp_path):
    path = corpus_file(tmp_path / "text")
    settings = [f"data.path={path}", "data.split=bytes", "data.tokenizer=bpe"]
    cfg = tiny_config("data=text", *settings, "data.vocab_size=300")
    job = plan(cfg)
    vocab = load_corpus(job.cfg.data).tokenizer.vocab_size
    assert job.build_model(vocab).cfg.vocab_size == vocab  # model.vocab_size 256: follows
    bigger = plan(tiny_config("data=text", *settings, "model.vocab_size=512"))
    assert bigger.build_model(vocab).cfg.vocab_size == 512
    smaller = plan(tiny_config("data=text", *settings, "model.vocab_size=260"))
    with pytest.raises(UserError, match=r"model.vocab_size=260 is smaller than the tokenizer's"):
        smaller.build_model(vocab)
    assert plan(tiny_config()).build_model().cfg.vocab_size == 256  # bytes as before


@pytest.mark.slow
def test_byte_run_ids_ignore_the_tokenizer_keys(tiny_config):
    """Byte runs keep the run ids they had before ``data.tokenizer`` existed; other
    tokenizers and BPE sizes are other runs."""
    byte = plan(tiny_config()).run_id
    assert plan(tiny_config("data.vocab_size=8192")).run_id == byte
    bpe = plan(tiny_config("data.tokenizer=bpe")).run_id
    bigger = plan(tiny_config("data.tokenizer=bpe", "data.vocab_size=8192")).run_id
    pretrained = plan(tiny_config("data.tokenizer=hf:gpt2")).run_id
    assert len({byte, bpe, bigger, pretrained}) == 4
    assert plan(tiny_config("data.tokenizer=hf:gpt2", "data.vocab_size=8192")).run_id == pretrained


def mixed_records(root: Path) -> None:
    """alibi with bytes and with a BPE (seeds 0, 1), as a sweep over data.tokenizer writes."""
    bpe = {"tokenizer": "bpe", "tokenizer_vocab": 4096, "tokenizer_sha": "ab" * 32}
    for seed in (0, 1):
        for folder, fields in (("pe=alibi", {}), ("pe=alibi,data.tokenizer=bpe", bpe)):
            run = f"alibi-{seed}" + ("-bpe" if fields else "")
            rows = [
                record("alibi", seed, n, 1.0 + n / 100 + seed / 10, run_id=run, **fields)
                for n in (16, 32)
            ]
            name = folder + (f",train.seed={seed}" if seed else "")
            write_jsonl(root / name / "records.jsonl", rows)


@pytest.mark.slow
def test_a_report_refuses_to_mix_tokenizers_per_token(tmp_path):
    mixed_records(tmp_path)
    with pytest.raises(UserError, match=r"records mix tokenizers \(bpe \(4,096 ids, sha abab"):
        build_report(tmp_path, echo=False)
    with pytest.raises(UserError, match="compare bits per byte with --metric bpb"):
        build_report(tmp_path, options=Options(metric="nll"), echo=False)
    made = build_report(tmp_path, options=Options(metric="bpb"), echo=False)
    text = made.path.read_text()
    assert "The records mix tokenizers" in text and "tables are left out" in text
    assert (tmp_path / "tables" / "bpb.csv").exists()
    assert not (tmp_path / "tables" / "ppl.csv").exists()
    assert "alibi [data.tokenizer=bpe]" in text  # its own row, never a seed of the byte run
    assert "- tokenizer: bpe (4,096 ids, sha abababab); byte" in text


@pytest.mark.slow
def test_a_tiny_bpe_run_end_to_end(tiny_config, tmp_path):
    path = tmp_path / "words.txt"  # the test split has the train split's words: merged tokens
    path.write_text(" ".join(np.random.default_rng(0).choice(TRAIN_WORDS, 8000)) + "\n")
    overrides = ["data=text", f"data.path={path}", "data.split=bytes", "data.tokenizer=bpe"]
    cfg = tiny_config(*overrides, "data.vocab_size=300", "eval.tokens=128")
    records = bench.run(cfg, tmp_path / "run")
    assert len(records) == 9  # rope, rope+pi, rope+ntk at 3 lengths
    vocab = records[0]["tokenizer_vocab"]
    assert {r["tokenizer"] for r in records} == {"bpe"} and 256 < vocab <= 300
    corpus = load_corpus(plan(cfg).cfg.data)
    targets = corpus.splits["test"][1:129].numpy()
    for r in records:
        assert r["target_bytes"] == corpus.tokenizer.count_bytes(targets) > r["tokens"] == 128
        assert r["bpb"] == pytest.approx(r["nll"] / math.log(2) * 128 / r["target_bytes"])
    assert bench.run(cfg, tmp_path / "run") == records  # cached: nothing retrained
    byte = bench.run(tiny_config(*overrides[:3], "eval.tokens=128"), tmp_path / "run")
    assert {r["tokenizer"] for r in byte} == {"byte"}  # the BPE's records are not reused
    assert {r["run_id"] for r in byte}.isdisjoint(r["run_id"] for r in records)
    assert len(load_records(tmp_path / "run")) == 9  # the folder now holds the byte run's


@pytest.mark.slow
def test_the_byte_path_does_not_import_tokenizers():
    code = (
        "import sys, pe_bench, pe_bench.cli.bench, pe_bench.data.corpus as d; "
        "c = d.load_corpus({'source': 'stdlib'}); "
        "assert c.tokenizer.name == 'byte' and c.splits['test'].dtype.itemsize == 1; "
        "assert 'tokenizers' not in sys.modules, 'tokenizers imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


@pytest.mark.slow
def test_no_network_ends_pe_bench_in_one_line(tmp_path):
    proc = pe_bench(
        "data.tokenizer=hf:no-such-org/no-such-tokenizer",
        "train.steps=1",
        out=tmp_path,
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pe-bench: error:")]
    assert (
        len(errors) == 1
        and "could not load tokenizer 'no-such-org/no-such-tokenizer'" in (errors[0])
    )


def test_byte_tokenizer_needs_no_library():
    assert ByteTokenizer().encode(b"\xff\x00").tolist() == [255, 0]  # any bytes, not only UTF-8
