"""Passkey retrieval (pe_bench/pretrained/passkey.py): the prompt as the originals build it,
lengths in tokens, depths, parsing, greedy decoding with a KV cache and a variant, the report
section."""

from __future__ import annotations

import random

import pandas as pd
import pytest
import torch

pytest.importorskip("transformers")

from pe_bench.errors import UserError
from pe_bench.pretrained import load, passkey, rope
from pe_bench.records import PASSKEY_MODE
from pe_bench.report.passkey import section as passkey_section
from pe_bench.run.config import PasskeyConfig, PretrainedConfig
from pe_bench.run.evaluate import EvalConfig
from tests.pretrained.hf_helpers import CONTEXT, tiny_checkpoint, tiny_tokenizer


def original_prompt(n_garbage: int, n_prefix: int, key: int) -> str:
    """jquesnelle/yarn eval/passkey.py's generate_prompt (from landmark-attention), with its
    two random draws given."""
    task_description = (
        "There is an important info hidden inside a lot of irrelevant text. Find it and "
        "memorize them. I will quiz you about the important information there."
    )
    garbage = (
        "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    )
    garbage_inf = " ".join([garbage] * 2000)
    information_line = f"The pass key is {key}. Remember it. {key} is the pass key."
    final_question = "What is the pass key? The pass key is"
    lines = [
        task_description,
        garbage_inf[:n_prefix],
        information_line,
        garbage_inf[: n_garbage - n_prefix],
        final_question,
    ]
    return "\n".join(lines)


@pytest.mark.parametrize(("n_filler", "depth"), [(0, 0.5), (250, 0.0), (250, 0.4), (1000, 1.0)])
def test_the_prompt_is_the_originals(n_filler, depth):
    key = 31337
    expected = original_prompt(n_filler, round(depth * n_filler), key)
    assert passkey.prompt_text(n_filler, depth, key) == expected


def test_a_short_prompt_pinned_character_for_character():
    assert passkey.prompt_text(30, 0.5, 7) == (
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
        "them. I will quiz you about the important information there.\n"
        "The grass is gr\n"
        "The pass key is 7. Remember it. 7 is the pass key.\n"
        "The grass is gr\n"
        "What is the pass key? The pass key is"
    )


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def tokenize_with(tokenizer):
    return lambda text: tokenizer(text)["input_ids"]


@pytest.mark.parametrize("length", [160, 300, 1000])
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.9])
def test_a_prompt_fits_its_length_in_tokens_with_the_key_at_its_depth(tokenizer, length, depth):
    tokenize = tokenize_with(tokenizer)
    prompt = passkey.fit_prompt(tokenize, length, depth, 4242)
    assert len(prompt.ids) <= length
    more = tokenize(passkey.prompt_text(prompt.n_filler + 1, depth, 4242))
    assert len(more) > length  # the most filler that fits
    assert len(prompt.ids) >= length - 8  # so the prompt is within a few tokens of L
    text = passkey.prompt_text(prompt.n_filler, depth, 4242)
    assert prompt.ids == tokenize(text)
    before, after = text.split(passkey.key_sentence(4242))
    prefix = len(before) - len(passkey.TASK) - 2  # the filler before the key, in characters
    assert prefix == round(depth * prompt.n_filler)
    assert after.endswith(passkey.QUESTION)


def test_a_length_below_the_bare_prompt_is_refused(tokenizer):
    with pytest.raises(UserError, match="lengths of at least"):
        passkey.check_lengths(tokenize_with(tokenizer), [20])


def test_depths_are_stratified_keys_in_range_and_prompts_shared_by_variants():
    cfg = PasskeyConfig(trials=8, seed=3)
    draws = passkey.draws(cfg, 512)
    assert passkey.draws(cfg, 512) == draws  # every variant gets the same prompts
    assert passkey.draws(cfg, 1024) != draws
    for t, (depth, key) in enumerate(draws):
        assert t / 8 <= depth < (t + 1) / 8
        assert passkey.KEYS[0] <= key <= passkey.KEYS[1]


@pytest.mark.parametrize(
    ("text", "number"),
    [(" 12345. Remember", 12345), (" is 0042", 42), ("abc", None), ("", None), (" 12 34", 12)],
)
def test_the_answer_is_the_first_integer(text, number):
    assert passkey.first_integer(text) == number


def test_generation_stops_once_the_first_integer_is_complete():
    assert not passkey.answered(" 123")
    assert passkey.answered(" 123.")
    assert not passkey.answered(" the key")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tiny_checkpoint("llama", tmp_path_factory.mktemp("pk") / "llama")
    return load.load_model(PretrainedConfig(name=str(folder)), torch.device("cpu"))


@pytest.mark.parametrize("name", [None, "yarn", "logn"])
def test_greedy_with_a_cache_equals_recomputing_the_whole_sequence(model, tokenizer, name):
    """The KV cache keeps the variant's frequencies (set for the prompt's length) for the
    generated tokens: the tokens are those of a full forward pass at every step."""
    spec = rope.rope_spec(model.config, None, "tiny")
    variant = None
    if name:
        (variant,) = rope.build_variants(EvalConfig(variants={name: {"name": name}}), spec)
    rng = random.Random(1)
    ids = [rng.randrange(1, len(tokenizer)) for _ in range(3 * CONTEXT)]
    seen: list[list[int]] = []

    def decode(tokens: list[int]) -> str:
        seen.append(list(tokens))
        return ""  # never an integer: generation runs to max_new (or EOS)

    with rope.rope_variant(model, variant, spec, len(ids), "pe_bench"), torch.no_grad():
        passkey.greedy(model, ids, 5, decode)
        generated = seen[-1]
        sequence = list(ids)
        for _ in generated:
            logits = model(input_ids=torch.tensor([sequence])).logits
            sequence.append(int(logits[0, -1].argmax()))
    assert len(generated) >= 1
    assert sequence[len(ids) :] == generated


def test_the_report_section_has_a_table_and_a_depth_by_length_figure(tmp_path):
    def rec(variant: str, length: int, correct: list[int]) -> dict:
        n = len(correct)
        return {
            "run_id": "tiny-abc:slice-0",
            "scheme": "tiny",
            "variant": variant,
            "seed": 0,
            "train_len": 128,
            "eval_len": length,
            "mode": PASSKEY_MODE,
            "stride": length,
            "status": "ok",
            "correct": correct,
            "depth": [(t + 0.5) / n for t in range(n)],
            "prompt_tokens": [length - 1] * n,
        }

    records = pd.DataFrame(
        [
            rec("none", 128, [1, 1, 1, 1]),
            rec("none", 256, [1, 0, 0, 0]),
            rec("yarn", 128, [1, 1, 1, 1]),
            rec("yarn", 256, [1, 1, 0, 1]),
        ]
    )
    lines = passkey_section(records, tmp_path, bins=2)
    text = "\n".join(lines)
    assert "## Passkey retrieval" in text
    assert "| tiny      | 1.00 [0.51, 1.00] | 0.25 [0.05, 0.70] |" in text
    assert (tmp_path / "figures" / "passkey.png").exists()
    depths = pd.read_csv(tmp_path / "tables" / "passkey_depth.csv")
    row = depths[(depths["label"] == "tiny+yarn") & (depths["eval_len"] == 256)]
    assert row["acc"].tolist() == [1.0, 0.5] and row["trials"].tolist() == [2, 2]
    assert passkey_section(records.assign(mode="nonoverlap"), tmp_path) == []
