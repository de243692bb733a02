"""RULER's tasks (pe_bench/pretrained/ruler.py, ruler_eval.py): each generator against the
rules of NVIDIA/RULER's scripts/data/synthetic/ (task settings of scripts/synthetic.yaml,
templates of constants.py), the scorer (string_match_all of scripts/eval/synthetic/constants.py)
on hand-made outputs, lengths in tokens, pairing, and prefix sharing on a tiny model."""

from __future__ import annotations

import re
from collections import Counter

import pytest

pytest.importorskip("transformers")
pytest.importorskip("wonderwords")

from pe_bench.errors import UserError
from pe_bench.pretrained import ruler, ruler_eval
from pe_bench.run.config import RulerConfig

from .hf_helpers import tiny_checkpoint, tiny_tokenizer

NEEDLE = re.compile(r"One of the special magic (numbers|uuids) for (.+?) is: (\S+)\.")
UUID4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
WORD = re.compile(r"[A-Za-z' -]+-[A-Za-z' -]+")  # "adjective-noun" (wonderwords has "ad hoc")
ASKED = r"The special magic \w+ for ([^?\n]+) mentioned in the provided text is$"
CORPUS = "\n".join(f"def function_{i}(x):\n    return x * {i}  # line {i}" for i in range(3000))


@pytest.fixture(scope="module")
def tokenize():
    tokenizer = tiny_tokenizer()
    return lambda text: tokenizer(text)["input_ids"]


def make(tokenize, name: str, length: int = 3000, trials: int = 3, **kw):
    cfg = RulerConfig(tasks=[name], trials=trials, **kw)
    return ruler_eval.trials(name, length, cfg, CORPUS, tokenize)


def text_of(trial) -> str:
    return tiny_tokenizer().decode(trial.ids)


def needles(text: str) -> list[tuple[str, str, str]]:
    return NEEDLE.findall(text)


def context_lines(text: str) -> list[str]:
    """The lines between the task's first line and its question."""
    return text.split("\n")[1:-1]


# ---- the task settings are RULER's --------------------------------------------------------------


def test_the_tasks_are_rulers_synthetic_yaml():
    niah = {name: task.args for name, task in ruler.TASKS.items() if task.kind == "niah"}
    assert niah["niah_single_1"] == dict(
        type_haystack="noise",
        type_needle_k="words",
        type_needle_v="numbers",
        num_needle_k=1,
        num_needle_v=1,
        num_needle_q=1,
    )
    assert niah["niah_single_3"]["type_needle_v"] == "uuids"
    assert niah["niah_multikey_1"]["num_needle_k"] == 4
    assert niah["niah_multikey_2"]["type_haystack"] == "needle"
    assert niah["niah_multikey_3"]["type_needle_k"] == "uuids"
    assert niah["niah_multivalue"]["num_needle_v"] == 4
    assert niah["niah_multiquery"]["num_needle_q"] == 4
    generate = {name: t.tokens_to_generate for name, t in ruler.TASKS.items()}
    assert generate == {**dict.fromkeys(niah, 128), "vt": 30, "cwe": 120, "fwe": 50}
    assert ruler.DEPTHS[:3] == [0, 3, 5] and ruler.DEPTHS[-1] == 100 and len(ruler.DEPTHS) == 40


# ---- one test per task: the generator against RULER's rules ------------------------------------


def test_niah_single_1_one_number_needle_in_rulers_noise(tokenize):
    for trial in make(tokenize, "niah_single_1"):
        text = text_of(trial)
        assert text.startswith("A special magic number is hidden within the following text.")
        assert text.endswith(
            "The special magic number for " + needles(text)[0][1] + " mentioned "
            "in the provided text is"
        )
        found = needles(text)
        assert len(found) == 1 and WORD.fullmatch(found[0][1])
        assert re.fullmatch(r"[1-9]\d{6}", found[0][2]) and trial.expected == [found[0][2]]
        lines = context_lines(text)
        assert {line for line in lines if not NEEDLE.search(line)} == {ruler.NOISE}


def test_niah_single_2_the_corpus_is_the_essay(tokenize):
    for trial in make(tokenize, "niah_single_2"):
        text = text_of(trial)
        assert len(needles(text)) == 1
        lines = [line for line in context_lines(text) if not NEEDLE.search(line)]
        assert lines == list(ruler.corpus_lines(CORPUS)[: len(lines)])


def test_niah_single_3_uuid_values(tokenize):
    for trial in make(tokenize, "niah_single_3"):
        (kind, _, value), *rest = needles(text_of(trial))
        assert not rest and kind == "uuids" and UUID4.fullmatch(value)
        assert "A special magic uuid is hidden" in text_of(trial)
        assert trial.expected == [value]


def test_niah_multikey_1_four_keys_one_asked(tokenize):
    for trial in make(tokenize, "niah_multikey_1"):
        text = text_of(trial)
        found = needles(text)
        assert len(found) == 4 and len({key for _, key, _ in found}) == 4
        asked = re.search(ASKED, text).group(1)
        assert trial.expected == [value for _, key, value in found if key == asked]


@pytest.mark.parametrize(("name", "keys"), [("niah_multikey_2", WORD), ("niah_multikey_3", UUID4)])
def test_niah_multikey_2_3_a_haystack_of_needles(tokenize, name, keys):
    trials = make(tokenize, name)
    for trial in trials:
        text = text_of(trial)
        lines = context_lines(text)
        assert all(NEEDLE.fullmatch(line) for line in lines)
        assert all(keys.fullmatch(key) for _, key, _ in needles(text))
        asked = re.search(ASKED, text).group(1)
        values = [v for _, key, v in needles(text) if key == asked]
        assert values == trial.expected and len(values) == 1
    # the distractors are drawn once a length: trials share them (prefix sharing)
    first, second = (set(context_lines(text_of(t))) for t in trials[:2])
    assert len(first & second) >= len(first) - 2


def test_niah_multivalue_four_values_of_one_key(tokenize):
    for trial in make(tokenize, "niah_multivalue"):
        text = text_of(trial)
        found = needles(text)
        assert len(found) == 4 and len({key for _, key, _ in found}) == 1
        assert sorted(trial.expected) == sorted(value for *_, value in found)
        assert text.startswith("Some special magic numbers are hidden")
        assert text.endswith("mentioned in the provided text are")


def test_niah_multiquery_four_keys_asked_at_once(tokenize):
    for trial in make(tokenize, "niah_multiquery"):
        text = text_of(trial)
        found = dict((key, value) for _, key, value in needles(text))
        query = re.search(r"What are all the special magic numbers for (.+?) mentioned", text)
        asked = re.fullmatch(r"(.+?), (.+?), (.+?), and (.+)", query.group(1)).groups()
        assert len(found) == 4 and sorted(asked) == sorted(found)
        assert trial.expected == [found[key] for key in asked]


def test_vt_one_chain_of_five_after_a_worked_example(tokenize):
    for trial in make(tokenize, "vt", length=4000):
        text = text_of(trial)
        example, question = text.split("\n\nMemorize and track", 1)
        statements = re.findall(r"VAR ([A-Z]+) = (VAR [A-Z]+|\d+)", question)
        assert len(statements) == 5 and re.fullmatch(r"\d{5}", statements[0][1])
        names = [name for name, _ in statements]
        assert all(len(name) == 5 for name in names) and names == trial.expected
        assert [src for _, src in statements[1:]] == [f"VAR {n}" for n in names[:-1]]
        assert question.endswith(
            f"5 variables are assigned the value {statements[0][1]}, they are: "
        )
        shown = re.findall(r"VAR ([A-Z]+) = ", example)
        assert len(shown) == 5 and all(len(name) == 3 for name in shown)
        assert "12345" not in example  # its value made new, as randomize_icl does
        assert example.endswith(" ".join(shown))  # the example's answer
        assert {line for line in question.split("\n")[2:-1] if "VAR" not in line} == {ruler.NOISE}


@pytest.mark.parametrize(("length", "common", "rare"), [(9000, 30, 3), (2000, 6, 1)])
def test_cwe_ten_words_common_the_rest_rare(tokenize, length, common, rare):
    for trial in make(tokenize, "cwe", length=length, trials=2):
        text = text_of(trial)
        example, question = text.split("\nBelow is a numbered list", 1)
        listed = re.findall(r"\d+\. (\S+)", question.split("\nQuestion:")[0])
        counts = Counter(listed)
        assert sorted(w for w, c in counts.items() if c == common) == sorted(trial.expected)
        assert len(trial.expected) == 10 and set(counts.values()) == {common, rare}
        shown = Counter(re.findall(r"\d+\. (\S+)", example.split("\nQuestion:")[0]))
        assert sorted(shown.values()) == sorted(
            [10] * 10 + [3] * 30 if length >= 4096 else [3] * 10 + [1] * 10
        )


def test_fwe_zipf_counts_and_the_three_after_the_noise(tokenize):
    from scipy.special import zeta

    length = 4000
    for trial in make(tokenize, "fwe", length=length, trials=2):
        text = text_of(trial)
        words = text.split("coded words. ", 1)[1].split("\nQuestion:")[0].split(" ")
        ranked = [w for w, _ in Counter(words).most_common()]
        assert ranked[0] == "..." and ranked[1:4] == trial.expected
        counts = sorted(Counter(words).values(), reverse=True)
        n_vocab = (length - 50) // 50
        size = round(counts[0] * zeta(2.0))  # ranks' counts: int(size * k^-2 / zeta(2))
        for k in range(1, 6):
            assert abs(counts[k - 1] - size * k**-2.0 / zeta(2.0)) <= 2
        assert len(set(words)) <= n_vocab
        assert all(re.fullmatch(r"[a-z]{6}", w) for w in trial.expected)


# ---- lengths, depths, pairing -----------------------------------------------------------------


@pytest.mark.parametrize("name", list(ruler.TASKS))
def test_every_prompt_leaves_the_tokens_to_generate(tokenize, name):
    length = 9000 if name == "cwe" else 4200  # the tiny tokenizer spends ~10 tokens a word
    budget = length - ruler.TASKS[name].tokens_to_generate
    prompts = make(tokenize, name, length=length, trials=2)
    assert all(0.95 * budget <= len(p.ids) <= budget for p in prompts)


def test_depths_are_stratified_and_pairing_holds(tokenize):
    prompts = make(tokenize, "niah_single_1", trials=4)
    assert [int(p.depth * 4) for p in prompts] == [0, 1, 2, 3]
    again = make(tokenize, "niah_single_1", trials=4)
    assert [p.ids for p in prompts] == [p.ids for p in again]
    seeded = RulerConfig(trials=4, seed=1)
    other = ruler_eval.trials("niah_single_1", 3000, seeded, CORPUS, tokenize)
    assert [p.ids for p in other] != [p.ids for p in prompts]


def test_a_needle_sits_at_its_depth(tokenize):
    for trial in make(tokenize, "niah_single_1", trials=4):
        lines = context_lines(text_of(trial))
        at = next(i for i, line in enumerate(lines) if NEEDLE.search(line))
        assert abs(at / (len(lines) - 1) - trial.depth) < 0.02


def test_a_length_too_short_is_one_line(tokenize):
    with pytest.raises(UserError, match=r"model\.ruler: vt has \d+ tokens .* allowed: longer"):
        make(tokenize, "vt", length=300)


def test_an_unknown_task_is_refused():
    with pytest.raises(UserError, match=r"unknown task 'niah_single_9'; allowed: niah_single_1"):
        ruler_eval.tasks(RulerConfig(tasks=["niah_single_9"]), [("none", "", None, "")], 64)


# ---- the scorer -------------------------------------------------------------------------------


def test_recall_is_rulers_string_match_all():
    expected = ["4671318", "8411109", "1064287", "7072678"]
    assert ruler.recall(" 4671318, 8411109, 1064287 and 7072678.", expected) == 1.0
    assert ruler.recall("4671318 and 1064287", expected) == 0.5
    assert ruler.recall("none of them", expected) == 0.0
    assert ruler.recall("Cheerful-Banana", ["cheerful-banana"]) == 1.0  # case-insensitive
    assert ruler.recall("the numbers\x0b467\n1318", ["4671318"]) == 0.0  # not joined across
    assert ruler.postprocess("  a\tb\x00c \n") == "a\nb\nc"
    assert ruler.complete("FJZ FOP GZK", ["fjz", "gzk"]) and not ruler.complete("FJZ", ["GZK"])


# ---- answering: prefix sharing is exact --------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    folder = tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny") / "llama", context=4096)
    return AutoModelForCausalLM.from_pretrained(folder).eval()


def test_prefix_sharing_gives_the_answers_of_prompts_answered_alone(tokenize, tiny_model):
    tokenizer = tiny_tokenizer()
    prompts = make(tokenize, "niah_single_1", length=1200, trials=4)

    def answers(share):
        found = ruler_eval.answer_all(tiny_model, prompts, 12, tokenizer.decode, share)
        return {i: (text, fresh) for i, text, fresh in found}

    alone, shared = answers(False), answers(True)
    assert [alone[i][0] for i in range(4)] == [shared[i][0] for i in range(4)]
    assert all(alone[i][1] == len(prompts[i].ids) for i in range(4))
    saved = sum(len(p.ids) for p in prompts) - sum(fresh for _, fresh in shared.values())
    depths = sorted(p.depth for p in prompts)[:-1]  # deepest first: all but its share
    assert saved >= 0.8 * sum(depths) * len(prompts[0].ids)  # the noise before each needle


def test_the_sharing_order_goes_deepest_first():
    base = list(range(100))
    prompts = [[*base[:d], -1, *base[d:]] for d in (30, 90, 10, 60)]
    assert ruler_eval.sharing_order(prompts) == [1, 3, 0, 2]


def test_shares_prefix_except_hf_rescaling_on_the_sequence():
    from types import SimpleNamespace

    def variant(name):
        return SimpleNamespace(scheme=SimpleNamespace(name=name), key=name)

    assert ruler_eval.shares_prefix(None, "hf")
    assert ruler_eval.shares_prefix(variant("dynamic_ntk"), "pe_bench")
    assert not ruler_eval.shares_prefix(variant("dynamic_ntk"), "hf")
    assert not ruler_eval.shares_prefix(variant("longrope"), "hf")
    assert ruler_eval.shares_prefix(variant("yarn"), "hf")


def test_a_record_scores_with_a_wilson_interval():
    from pe_bench.stats import wilson

    prompts = [ruler_eval.Trial([1], ["a", "b"], 0.1), ruler_eval.Trial([2], ["c"], 0.6)]
    record = ruler_eval.trials_record(prompts, ["A and nothing", "c"])
    assert record["recall"] == [0.5, 1.0] and record["ruler_score"] == 0.75
    assert (record["ci_low"], record["ci_high"]) == wilson(1.5, 2)


# ---- the pipeline: planned, stored, resumed, reported -----------------------------------------


@pytest.mark.slow  # about 20 s: a tiny checkpoint answers 2 tasks x 2 labels x 1 length
def test_ruler_is_planned_stored_resumed_and_reported(tmp_path):
    from pe_bench.cli import bench as cli
    from pe_bench.files import read_jsonl
    from pe_bench.records import RECORDS
    from pe_bench.report.build import build_report

    from ..helpers import compose

    folder = tiny_checkpoint("llama", tmp_path / "model", context=1024)
    cfg = compose(
        "model=hf",
        f"model.name={folder}",
        "model.test_slices=1",
        "model.passkey=null",
        "+model.ruler.tasks=[niah_single_1,niah_multivalue]",
        "+model.ruler.lengths=[1500]",
        "+model.ruler.trials=2",
        "+model.ruler.max_new_tokens=4",
        "+model.ruler.variants=[yarn]",
        "eval.factors=[1]",
        "eval.tokens=1024",
        "+pe@eval.variants.yarn=yarn",
    )
    out = tmp_path / "job"
    records = cli.run(cfg, out)
    found = [r for r in records if r["mode"].startswith("ruler:")]
    assert sorted((r["variant"], r["task"]) for r in found) == [
        ("none", "niah_multivalue"), ("none", "niah_single_1"),
        ("yarn", "niah_multivalue"), ("yarn", "niah_single_1"),
    ]  # fmt: skip
    for r in found:
        assert r["trials"] == 2 and len(r["recall"]) == 2 and r["eval_len"] == 1500
        assert r["ci_low"] <= r["ruler_score"] <= r["ci_high"]
        assert all(n <= 1500 - 128 for n in r["prompt_tokens"])
        assert r["prefill_tokens"] < sum(r["prompt_tokens"])  # the haystack shared
    lines = len(read_jsonl(out / RECORDS))
    assert cli.run(cfg, out) and len(read_jsonl(out / RECORDS)) == lines  # resumed: nothing new
    report = build_report(out, echo=False)
    text = report.path.read_text()
    assert "## RULER" in text and "niah_multivalue" in text
    assert (out / "figures" / "ruler.png").exists() and (out / "tables" / "ruler.tex").exists()
    from pe_bench.report.site import write_site

    index = write_site(report, out, tmp_path / "site").read_text()
    assert 'id="ruler"' in index and "RULER score" in index
