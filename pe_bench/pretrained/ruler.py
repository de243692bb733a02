"""RULER's synthetic tasks (Hsieh et al. 2024): what each prompt holds and how an answer scores.

Every task is one generator, as NVIDIA/RULER ``scripts/data/synthetic/`` writes it (and
lm-evaluation-harness ``lm_eval/tasks/ruler/`` repeats it), with the task settings of RULER's
``scripts/synthetic.yaml`` and the templates, answer prefixes and tokens to generate of its
``constants.py``:

- ``niah_*`` (needle in a haystack, ``niah.py``): needles "One of the special magic {numbers}
  for {key} is: {value}." in a haystack; ``single_1-3`` one needle (noise, essay; a number or a
  UUID), ``multikey_1`` 4 keys of which one is asked, ``multikey_2-3`` a haystack made of
  needles (words or UUIDs as keys), ``multivalue`` 4 values of one key, ``multiquery`` 4 keys
  asked at once. Keys are "adjective-noun" words, numbers have 7 digits, UUIDs are version 4.
- ``vt`` (variable tracking, ``variable_tracking.py``): a chain of 5 assignments "VAR X = 12345",
  "VAR Y = VAR X" in the noise, with one worked example before it (3-letter names); the answer
  is every name of the chain.
- ``cwe`` (common words, ``common_words_extraction.py``): a numbered list where 10 words appear
  30 times and the others 3 times (at prompt lengths below 4096: 6 and 1), after one worked
  example; the answer is the 10 common words.
- ``fwe`` (frequent words, ``freq_words_extraction.py``): coded 6-letter words drawn from a
  Zipf law (alpha 2) over (L - 50) / 50 words, the most frequent being "..." (noise); the answer
  is the three next.

A trial scores as RULER's ``string_match_all``: the fraction of the expected strings found,
case-insensitively, in the greedy output (stripped, control characters made newlines).

What pe-bench changes, and why:

- **No download.** RULER's "essay" haystack is Paul Graham's essays; here it is the run's own
  corpus (the test split's text, cut into lines; needles go between lines where RULER puts them
  between sentences). The noise haystack is RULER's sentence, repeated. Keys and common words
  come from the ``wonderwords`` package (RULER's source of them), version 3.
- **Depth.** The needle of the first expected answer sits at depth d = (t + u) / T for trial t
  of T (u uniform), so every length covers every depth with few trials (RULER draws depths at
  random; the other needles still are). The record keeps each trial's d; it is null for vt,
  cwe and fwe, whose answers are spread over the context.
- **One haystack a length.** A length's trials share its haystack (RULER's essay haystack is
  the same text for every sample already; multikey_2-3's distractor needles are drawn once a
  length here): so their prompts share a prefix up to their first needle, whose keys and values
  a model computes once (``ruler_eval``).
"""

from __future__ import annotations

import random
import re
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

NIAH = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are "
    "all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
NIAH_ANSWER = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
VT = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
    "{context}\nQuestion: Find all variables that are assigned the value {query} in the text "
    "above."
)
VT_ANSWER = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
    "variables are assigned the value {query}, they are: "
)
CWE = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common "
    "words in the above list?"
)
CWE_ANSWER = " Answer: The top 10 words that appear most often in the list are:"
FWE = (
    "Read the following coded text and track the frequency of each coded word. Find the three "
    "most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. "
    "Please ignore the dots '....'. What are the three most frequently appeared words in the "
    "above coded text?"
)
FWE_ANSWER = (
    " Answer: According to the coded text above, the three most frequently appeared words are:"
)
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
DEPTHS = [round(x) for x in np.linspace(0, 100, num=40)]  # RULER's needle depths (percent)


@dataclass(frozen=True)
class Task:
    """One of RULER's tasks: its generator, settings (``scripts/synthetic.yaml``), tokens to
    generate and the unit its haystack grows by (``incremental``)."""

    kind: str  # niah, vt, cwe or fwe
    tokens_to_generate: int
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def has_depth(self) -> bool:
        return self.kind == "niah"


def _niah(haystack: str, k: str, v: str, n_k: int = 1, n_v: int = 1, n_q: int = 1) -> Task:
    args = dict(type_haystack=haystack, type_needle_k=k, type_needle_v=v)
    return Task("niah", 128, args | dict(num_needle_k=n_k, num_needle_v=n_v, num_needle_q=n_q))


TASKS: dict[str, Task] = {
    "niah_single_1": _niah("noise", "words", "numbers"),
    "niah_single_2": _niah("essay", "words", "numbers"),
    "niah_single_3": _niah("essay", "words", "uuids"),
    "niah_multikey_1": _niah("essay", "words", "numbers", n_k=4),
    "niah_multikey_2": _niah("needle", "words", "numbers"),
    "niah_multikey_3": _niah("needle", "uuids", "uuids"),
    "niah_multivalue": _niah("essay", "words", "numbers", n_v=4),
    "niah_multiquery": _niah("essay", "words", "numbers", n_q=4),
    "vt": Task("vt", 30, dict(num_chains=1, num_hops=4)),
    "cwe": Task("cwe", 120, dict(freq_cw=30, freq_ucw=3, num_cw=10)),
    "fwe": Task("fwe", 50, dict(alpha=2.0, coded_wordlen=6)),
}


@dataclass(frozen=True)
class Sample:
    """A prompt (the task's template with its answer prefix) and what a right answer holds."""

    text: str
    expected: list[str]
    depth: float | None  # of the first expected answer's needle; None: no single place


# ---- words -------------------------------------------------------------------------------------


@cache
def word_lists() -> tuple[list[str], list[str], list[str]]:
    """wonderwords' nouns, adjectives and verbs (RULER's lists), sorted."""
    from wonderwords import random_word

    read = random_word._get_words_from_text_file
    return tuple(sorted(set(read(f"{name}list.txt"))) for name in ("noun", "adjective", "verb"))


def random_value(rng: random.Random, kind: str) -> str:
    """A needle's key or value as RULER draws it: a 7-digit number, an "adjective-noun" word or
    a version-4 UUID."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        nouns, adjectives, _ = word_lists()
        return f"{rng.choice(adjectives)}-{rng.choice(nouns)}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown needle type {kind!r}")


# ---- generators --------------------------------------------------------------------------------


def niah(
    rng: random.Random, size: int, depth: float, args: dict[str, Any], haystack: Haystack
) -> Sample:
    """``niah.py``'s ``generate_input_output`` with ``size`` haystack units; the first
    expected answer's needle at ``depth``."""
    n_q, n_v = args["num_needle_q"], args["num_needle_v"]
    n_k = max(args["num_needle_k"], n_q)
    kind_v = args["type_needle_v"]
    keys = [random_value(rng, args["type_needle_k"]) for _ in range(n_k)]
    values = [[random_value(rng, kind_v) for _ in range(n_v)] for _ in keys]
    asked = rng.sample(range(n_k), n_q)
    answers = [v for i in asked for v in values[i]]
    needles = [
        NEEDLE.format(type_needle_v=kind_v, key=key, value=value)
        for key, vals in zip(keys, values, strict=True)
        for value in vals
    ]
    first = next(n for n in needles if n.endswith(f" {answers[0]}."))
    others = [n for n in needles if n is not first]
    rng.shuffle(others)
    context = haystack.insert(size, [(depth, first), *[(None, n) for n in others]], rng)
    query = keys[asked[0]] if n_q == 1 else ", ".join(keys[i] for i in asked[:-1])
    query += "" if n_q == 1 else f", and {keys[asked[-1]]}"
    template, type_v = NIAH + NIAH_ANSWER, kind_v
    if n_q * n_v == 1:  # RULER's singular
        template = template.replace("Some", "A").replace("are all", "is").replace("are", "is")
        type_v = kind_v[:-1]
    text = template.format(type_needle_v=type_v, context=context, query=query)
    return Sample(text, answers, depth)


def chain(rng: random.Random, hops: int, letters: int, value: str) -> tuple[list[str], list[str]]:
    """``variable_tracking.py``'s ``generate_chains`` for one chain: its names and statements."""
    names: list[str] = []
    while len(names) < hops + 1:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        names += [] if name in names else [name]
    statements = [f"VAR {names[0]} = {value}"]
    statements += [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(hops)]
    return names, statements


def vt_text(rng: random.Random, size: int, hops: int, example: bool) -> tuple[str, list[str]]:
    """One variable-tracking prompt over ``size`` noise sentences, with its answer prefix; the
    worked example's (``example``) has 3-letter names and the value 12345."""
    value = "12345" if example else str(rng.randint(10000, 99998))  # np.random.randint: < 99999
    names, statements = chain(rng, hops, 3 if example else 5, value)
    sentences = [NOISE] * size
    for j, at in enumerate(sorted(rng.sample(range(len(sentences)), len(statements)))):
        sentences.insert(at + j, statements[j])
    context = "\n".join(sentences).replace(". \n", ".\n")
    return (VT + VT_ANSWER).format(context=context, query=value, num_v=hops + 1), names


def vt(rng: random.Random, size: int, depth: float, args: dict[str, Any], haystack: Haystack):
    """``variable_tracking.py`` as its ``main`` runs it: one worked example (``haystack.example``
    noise sentences, RULER's fit to 500 tokens) with its answer, its names and value then made
    new (``randomize_icl``), then the question."""
    hops = args["num_hops"]
    shown, names = vt_text(rng, haystack.example, hops, example=True)
    shown += " " + " ".join(names) + "\n"
    for name in names:
        shown = shown.replace(name, "".join(rng.choices(string.ascii_uppercase, k=len(name))))
    shown = shown.replace("12345", str(rng.randint(10000, 99998)))
    text, answer = vt_text(rng, size, hops, example=False)
    return Sample(f"{shown}\n{text}", answer, None)


def numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))


def cwe_list(rng: random.Random, n: int, common: int, rare: int, n_common: int):
    """``common_words_extraction.py``'s ``get_example``: ``n`` distinct words, the first
    ``n_common`` repeated ``common`` times, the others ``rare`` times, shuffled."""
    words = common_words()
    drawn = rng.sample(words, min(n, len(words)))
    top = drawn[:n_common]
    listed = top * common + drawn[n_common:] * rare
    rng.shuffle(listed)
    return numbered(listed), top


@cache
def common_words() -> list[str]:
    nouns, adjectives, verbs = word_lists()
    words = sorted(set(nouns + adjectives + verbs))
    random.Random(42).shuffle(words)
    return words


def cwe(rng: random.Random, size: int, depth: float, args: dict[str, Any], haystack: Haystack):
    """``common_words_extraction.py``'s ``generate_input_output`` with ``size`` distinct words:
    one worked example, then the list; below 4096 tokens the smaller counts (``haystack.length``
    is the prompt length in tokens)."""
    n_common = args["num_cw"]
    if haystack.length < 4096:
        example = cwe_list(rng, 20, 3, 1, n_common)
        context, answer = cwe_list(rng, size, 6, 1, n_common)
    else:
        example = cwe_list(rng, 40, 10, 3, n_common)
        context, answer = cwe_list(rng, size, args["freq_cw"], args["freq_ucw"], n_common)
    template = CWE + CWE_ANSWER
    shown = template.format(context=example[0]) + " " + numbered(example[1])
    return Sample(shown + "\n" + template.format(context=context), answer, None)


def fwe(rng: random.Random, size: int, depth: float, args: dict[str, Any], haystack: Haystack):
    """``freq_words_extraction.py``'s ``generate_input_output`` over ``size`` words: a
    vocabulary of (L - 50) / 50 coded words ranked at random, counts by a Zipf law (``zeta``)."""
    from scipy.special import zeta

    alpha, letters = args["alpha"], args["coded_wordlen"]
    n_vocab = max(4, (haystack.length - 50) // 50)
    vocab: set[str] = set()
    while len(vocab) < n_vocab:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=letters)))
    ranked = sorted(vocab)
    random.Random(42).shuffle(ranked)
    ranked[0] = "..."  # the top rank is noise
    k = np.arange(1, len(ranked) + 1)
    counts = (size * k**-alpha / zeta(alpha)).astype(int)
    words = [w for w, c in zip(ranked, counts, strict=True) for _ in range(c)]
    random.Random(42).shuffle(words)
    return Sample((FWE + FWE_ANSWER).format(context=" ".join(words)), ranked[1:4], None)


Generator = Callable[..., Sample]
GENERATORS: dict[str, Generator] = {"niah": niah, "vt": vt, "cwe": cwe, "fwe": fwe}


# ---- haystacks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Haystack:
    """What a length's trials put their needles in: ``kind`` noise (RULER's sentence), essay
    (lines of the run's corpus) or needle (needles with random keys, drawn once a length), for
    prompts of ``length`` tokens."""

    kind: str
    length: int
    lines: tuple[str, ...] = ()  # essay: the corpus's lines; needle: the distractors
    example: int = 0  # vt: noise sentences of the worked example (RULER fits it to 500 tokens)

    def units(self, size: int) -> list[str]:
        if self.kind == "noise":
            return [NOISE] * size
        if len(self.lines) < size:
            raise ValueError(f"the haystack has {len(self.lines)} lines, {size} asked")
        return list(self.lines[:size])

    def insert(self, size: int, needles: list[tuple[float | None, str]], rng) -> str:
        """The haystack's first ``size`` units with each needle inserted: at its depth where it
        has one, else where RULER puts it (a random unit for noise and needle haystacks, one of
        ``DEPTHS`` for the essay)."""
        units = self.units(size)
        places = []
        for depth, needle in needles:
            if depth is None and self.kind == "essay":
                depth = rng.choice(DEPTHS) / 100
            at = round(depth * size) if depth is not None else rng.randrange(size + 1)
            places.append((at, needle))
        for at, needle in sorted(places, key=lambda p: p[0], reverse=True):
            units.insert(at, needle)
        return "\n".join(units)


def corpus_lines(text: str) -> tuple[str, ...]:
    """The essay haystack from the corpus's text: its non-blank lines, whitespace runs made one
    space (RULER: ``re.sub(r"\\s+", " ", essay)``)."""
    lines = (re.sub(r"\s+", " ", line).strip() for line in text.splitlines())
    return tuple(line for line in lines if line)


def needle_lines(rng: random.Random, n: int, args: dict[str, Any]) -> tuple[str, ...]:
    """multikey_2-3's haystack: ``n`` needles with random keys and values."""
    return tuple(
        NEEDLE.format(
            type_needle_v=args["type_needle_v"],
            key=random_value(rng, args["type_needle_k"]),
            value=random_value(rng, args["type_needle_v"]),
        )
        for _ in range(n)
    )


# ---- scoring -----------------------------------------------------------------------------------


def postprocess(prediction: str) -> str:
    """RULER's ``postprocess_pred``: stripped, control characters made newlines."""
    return re.sub(r"[\x00-\x1f]", "\n", prediction.strip()).strip()


def recall(prediction: str, expected: list[str]) -> float:
    """RULER's ``string_match_all`` for one trial: the fraction of ``expected`` found in the
    prediction, case-insensitively."""
    found = postprocess(prediction).lower()
    return sum(e.lower() in found for e in expected) / len(expected)


def complete(prediction: str, expected: list[str]) -> bool:
    """Whether generation can stop: every expected string is found already (more tokens can
    only add text, and a found string stays found)."""
    return recall(prediction, expected) == 1.0
