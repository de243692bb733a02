"""Context-use probes (pe_bench/run/probes.py): hand-built models whose answers are known, the
copy probe's sequences, attention weights equal to what the model attends with, caching and
resume in the job folder, bad input, and the report's section."""

from __future__ import annotations

import dataclasses
import logging
import math

import pandas as pd
import pytest
import torch
from torch import Tensor

from pe_bench.cli import bench
from pe_bench.errors import UserError
from pe_bench.files import read_jsonl, write_jsonl
from pe_bench.model.gpt import GPT, CausalSelfAttention, ModelConfig
from pe_bench.positions import ModelDims, PositionScheme
from pe_bench.records import PROBES, RECORDS
from pe_bench.report.build import build_report
from pe_bench.run import attention_weights, probes
from pe_bench.run.evaluate import EvalConfig
from pe_bench.run.plan import plan
from tests.helpers import compose, record, tiny_model, with_variant

CPU = torch.device("cpu")
ON = "eval.probes=[context_gain,retrieval,attention]"  # tests/helpers.py's TINY switches off


@pytest.fixture
def stream() -> Tensor:
    """Random tokens, like an eval stream (256 targets and their inputs)."""
    return torch.randint(0, 256, (257,), generator=torch.Generator().manual_seed(1))


class Window(PositionScheme):
    """Test scheme: each query sees its last ``width`` keys only (a -inf bias beyond)."""

    relative = True

    def __init__(self, dims: ModelDims, width: int) -> None:
        super().__init__(dims)
        self.width = width

    def score_bias(self, q, k, q_pos: Tensor, k_pos: Tensor, layer: int) -> Tensor:
        far = (q_pos.unsqueeze(-1) - k_pos) >= self.width
        return torch.zeros(far.shape).masked_fill(far, float("-inf"))


def model_with(pe_factory, layers: int = 2) -> GPT:
    cfg = ModelConfig(d_model=32, num_layers=layers, num_heads=4, mlp_ratio=2)
    torch.manual_seed(0)
    return GPT(cfg, pe_factory(cfg.dims(16))).eval()


def gain_task(length: int, windows: int = 4, targets: int = 6) -> probes.ProbeTask:
    fields = {"count": windows, "per_window": targets, "context_len": 16}
    return probes.ProbeTask("none", "", None, length, "context_gain", length, 0, **fields)


# ---- context gain ---------------------------------------------------------------------------


def test_a_model_blind_past_its_training_length_gains_nothing_from_more_context(stream):
    """2 layers that each see 8 keys: every prediction depends on its last 15 tokens alone,
    fewer than L_train = 16, so the whole window and the last 16 tokens give the same loss;
    with 9 keys (17 tokens) or all of them the same probe finds a gain."""

    def gain(width: int) -> dict:
        with torch.no_grad():
            model = model_with(lambda dims: Window(dims, width))
            return probes.context_gain(model, stream, gain_task(64), 64, CPU)

    blind, one_more, sees_all = gain(8), gain(9), gain(64)
    assert blind["gain_bits"] == pytest.approx(0, abs=1e-7)
    assert blind["full_bits"] == pytest.approx(blind["truncated_bits"], abs=1e-7)
    assert blind["windows"] == 4 and blind["targets"] == 24 and blind["context_len"] == 16
    assert abs(one_more["gain_bits"]) > 1e-6 and abs(sees_all["gain_bits"]) > 1e-4
    assert sees_all["gain_ci_low"] < sees_all["gain_bits"] < sees_all["gain_ci_high"]


def test_context_gain_scores_the_documented_targets(stream):
    """Offsets p >= L_train, evenly spaced; the full loss is the window's own, the truncated one
    that of a forward over the tokens p - 15 .. p: recomputed here target by target."""
    model = tiny_model("rope")
    assert probes.context_offsets(64, 16, 6) == [16, 24, 32, 40, 48, 56]
    assert probes.context_offsets(20, 16, 6) == [16, 17, 18, 19]  # fewer than asked: all
    assert probes.window_starts(stream, 64, 3) == [0, 64, 192]  # 4 windows of 64: spread
    with torch.no_grad():
        found = probes.context_gain(model, stream, gain_task(64, 3, 6), 64, CPU)
        full, cut = [], []
        for start in [0, 64, 192]:
            logits = model(stream[start : start + 64].unsqueeze(0))[0]
            for p in [16, 24, 32, 40, 48, 56]:
                target = stream[start + p + 1]
                full.append(torch.nn.functional.cross_entropy(logits[p], target))
                context = stream[start + p - 15 : start + p + 1].unsqueeze(0)
                cut.append(torch.nn.functional.cross_entropy(model(context)[0, -1], target))
    ln2 = math.log(2)
    assert found["full_bits"] == pytest.approx(float(torch.stack(full).mean()) / ln2, rel=1e-5)
    assert found["truncated_bits"] == pytest.approx(float(torch.stack(cut).mean()) / ln2, rel=1e-5)


# ---- the copy probe -------------------------------------------------------------------------


def test_copy_probe_sequences_place_the_snippets_as_documented(stream):
    """filler (16), S, D filler tokens, S; the control's first S is S's tokens reordered; the
    fillers are the same in both, the scored tokens are the second S's 3rd to 16th, and every
    distance reuses the same snippets."""
    text = torch.arange(4000) % 251  # every 16-token slice has 16 distinct tokens
    near, far = probes.copy_case(text, 5, 10), probes.copy_case(text, 5, 40)
    s = probes.SNIPPET
    for case, d in ((near, 10), (far, 40)):
        assert case.copy.shape == case.control.shape == (5, probes.copy_length(d)) == (5, 48 + d)
        first, second = case.copy[:, s : 2 * s], case.copy[:, 2 * s + d :]
        assert torch.equal(first, second)
        assert torch.equal(case.control[:, 2 * s + d :], second)
        shuffled = case.control[:, s : 2 * s]
        assert torch.equal(shuffled.sort(1).values, first.sort(1).values)
        assert (shuffled != first).any(1).all()
        keep = torch.ones(48 + d, dtype=torch.bool)
        keep[s : 2 * s] = False
        assert torch.equal(case.copy[:, keep], case.control[:, keep])  # the same fillers
        assert case.scored.tolist() == list(range(2 * s + d + 2, 3 * s + d))
    assert torch.equal(near.copy[:, : 2 * s], far.copy[:, : 2 * s])
    assert torch.equal(near.copy[:, 2 * s : 2 * s + 10], far.copy[:, 2 * s : 2 * s + 10])


def test_a_model_that_ignores_context_has_no_retrieval_gain():
    """Attention output zeroed: each prediction depends on its own token only, so the copy
    and the control score the second S alike."""
    model = tiny_model("nope")
    for block in model.blocks:
        torch.nn.init.zeros_(block.attn.proj.weight)
    task = probes.ProbeTask("none", "", None, 64, "retrieval", 64, 0, count=6, distance=16)
    text = torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        found = probes.retrieval(model, text, task, 256, CPU)
    assert found["gain_bits"] == pytest.approx(0, abs=1e-6)
    assert found["copy_acc"] == found["control_acc"]
    assert found["targets"] == 6 * 14 and found["distance"] == 16


def test_distances_go_from_half_the_training_length_to_sixteen_times_capped():
    cfg = EvalConfig()
    assert probes.retrieval_distances(cfg, 64, 1024) == [32, 64, 128, 256, 512, 976]
    assert probes.retrieval_distances(cfg, 16, 64) == [8, 16]
    assert probes.retrieval_distances(EvalConfig(retrieval_distances=[5, 3]), 16, 64) == [3, 5]
    with pytest.raises(UserError, match=r"retrieval_distances: 17 .* allowed: 1 to 16"):
        probes.retrieval_distances(EvalConfig(retrieval_distances=[17]), 16, 64)


# ---- attention ------------------------------------------------------------------------------


def test_uniform_attention_has_the_textbook_distance_and_entropy(stream):
    """Queries zeroed: every logit is 0, so query i spreads 1 / (i + 1) over its keys: mean
    distance i / 2 and entropy ln(i + 1), averaged over the window's queries."""
    model = tiny_model("nope")
    for block in model.blocks:
        with torch.no_grad():
            block.attn.qkv.weight[:32] = 0
    task = probes.ProbeTask("none", "", None, 32, "attention", 32, 0, count=2)
    with torch.no_grad():
        found = probes.attention(model, stream, task, 64, CPU)
    i = torch.arange(32, dtype=torch.float64)
    assert found["mean_distance"] == pytest.approx([float(i.mean() / 2)] * 2, rel=1e-5)
    assert found["entropy"] == pytest.approx([float(torch.log(i + 1).mean())] * 2, rel=1e-5)
    assert found["windows"] == 2 and found["targets"] == 64


@pytest.mark.parametrize(
    "scheme",
    [
        *("rope", "alibi", "t5", "xl", "cope", "yarn"),
        *("dape_kerple", "ssmax_alibi", "fox", "stickbreaking", "rerope", "self_extend"),
    ],
)
def test_the_weights_are_what_the_model_attends_with(scheme, stream):
    """Each layer's output recomputed from the probe's weights (softmax over the scheme's
    logits) and its values equals the layer's own output; chunks of queries give the same
    rows as the whole."""
    variant = scheme in ("yarn", "rerope", "self_extend")
    model = with_variant(scheme) if variant else tiny_model(scheme)
    seen = []

    def keep(attn, args, output):
        seen.append((attn, *args, output))

    layers = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    handles = [layer.register_forward_hook(keep) for layer in layers]
    with torch.no_grad():
        model(stream[:96].view(2, 48))  # 3 x the training length: yarn scales
    for handle in handles:
        handle.remove()
    assert len(seen) == 2
    for attn, x, ctx, output in seen:
        q, k, v = attention_weights.layer_qkv(attn, x, ctx)
        weights = attention_weights.attention_weights(attn, q, k, ctx)
        y = (weights @ v.float()).transpose(1, 2).reshape(x.shape)
        assert torch.allclose(attn.proj(y), output, atol=1e-5)
        rows = attention_weights.attention_weights(attn, q, k, ctx, 20, 35)
        assert torch.allclose(rows, weights[:, :, 20:35, :35], atol=1e-6)


# ---- in the job folder ----------------------------------------------------------------------


def modes(records: list[dict]) -> list[str]:
    return [r["mode"] for r in records]


def probe_rows(records: list[dict], mode: str | None = None) -> list[dict]:
    return [r for r in records if r["mode"] in PROBES and mode in (None, r["mode"])]


def measured(record: dict) -> dict:
    """A record without its measurements of time and date (the rest is deterministic)."""
    times = ("time_s", "train_time_s", "date", "peak_mem_mb")
    return {k: v for k, v in record.items() if k not in times}


@pytest.mark.slow
def test_probes_are_cached_resumed_and_a_changed_setting_recomputes(tmp_path, tiny_config):
    """Every label gets each probe's records; a rerun computes nothing; a record lost to a kill
    is the only one computed again; a changed setting recomputes that probe alone."""
    cfg = tiny_config("pe=rope", ON)
    first = bench.run(cfg, tmp_path)
    done = probe_rows(first)
    # rope, rope+pi, rope+ntk x (context gain at 32 and 64, retrieval at D = 8, 16, attention
    # at 16, 32, 64)
    assert len(done) == 3 * (2 + 2 + 3) and len(first) == 9 + len(done)
    assert {(r["variant"], r["mode"]) for r in done} == {
        (v, m) for v in ("none", "pi", "ntk") for m in PROBES
    }
    assert all(r["status"] == "ok" and r["nll"] is None and r["probe_hash"] for r in done)
    assert {r["distance"] for r in probe_rows(first, "retrieval")} == {8, 16}
    write_jsonl(tmp_path / RECORDS, first[:-1])  # killed while measuring the last one
    again = bench.run(cfg, tmp_path)
    assert again[:-1] == first[:-1]
    assert measured(again[-1]) == measured(first[-1])
    assert bench.run(cfg, tmp_path) == again  # all there: skipped
    fewer = bench.run(tiny_config("pe=rope", ON, "eval.retrieval_snippets=3"), tmp_path)
    assert [r for r in fewer if r["mode"] != "retrieval"] == [
        r for r in again if r["mode"] != "retrieval"
    ]
    redone = probe_rows(fewer, "retrieval")
    assert len(redone) == 6 and {r["snippets"] for r in redone} == {3}
    old_hash = probe_rows(again, "retrieval")[0]["probe_hash"]
    assert old_hash not in {r.get("probe_hash") for r in read_jsonl(tmp_path / RECORDS)}


@pytest.mark.slow
def test_a_job_measured_before_probes_existed_gains_them_and_keeps_its_records(
    tmp_path, tiny_config, caplog
):
    """All perplexity records and no probe records (as results/quick was made): the rerun
    resumes the trained checkpoint, adds the probes and leaves the perplexity records as
    they were."""
    before = bench.run(tiny_config("pe=alibi"), tmp_path)
    assert not probe_rows(before)
    with caplog.at_level(logging.INFO):
        after = bench.run(tiny_config("pe=alibi", ON), tmp_path)
    assert after[: len(before)] == before
    assert (
        modes(after[len(before) :]) == ["context_gain"] * 2 + ["retrieval"] * 2 + ["attention"] * 3
    )
    assert "7 of 10 records to compute" in caplog.text and "resumed at step 3 of 3" in caplog.text


@pytest.mark.slow
def test_a_fine_tuned_model_is_probed_too(tmp_path, tiny_config):
    """Its probes run on the fine-tuned model (its own run id), without eval-time variants."""
    tuned = ["+finetune@finetunes.pi=pi", "finetunes.pi.steps=2", "finetunes.pi.warmup_steps=1"]
    done = bench.run(tiny_config("pe=rope", ON, *tuned), tmp_path)
    by_run = {}
    for r in probe_rows(done):
        by_run.setdefault((r.get("finetune"), r["variant"]), set()).add(r["mode"])
    assert by_run == {
        (None, "none"): set(PROBES),
        (None, "pi"): set(PROBES),
        (None, "ntk"): set(PROBES),
        ("pi", "none"): set(PROBES),
    }


@pytest.mark.slow
def test_probes_off_keeps_the_probe_records(tmp_path, tiny_config):
    """eval.probes=[] neither computes nor drops probe records (a probe not asked for is kept,
    as a variant is)."""
    with_probes = bench.run(tiny_config("pe=nope", ON), tmp_path)
    assert bench.run(tiny_config("pe=nope"), tmp_path) == with_probes


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("eval.probes=[copy]", "unknown eval probe 'copy'; allowed: context_gain, retrieval"),
        ("eval.context_windows=1", "eval.context_windows must be >= 2, got 1"),
        ("eval.retrieval_snippets=0", "eval.retrieval_snippets must be >= 2, got 0"),
        ("eval.attention_windows=0", "eval.attention_windows must be >= 1, got 0"),
        ("eval.retrieval_distances=[0]", r"eval.retrieval_distances\[0\] must be >= 1, got 0"),
    ],
)
def test_bad_probe_settings_are_one_line_errors(tiny_config, override, message):
    with pytest.raises(UserError, match=message):
        plan(tiny_config(override))


def test_a_distance_longer_than_the_eval_lengths_is_refused_before_training(tmp_path, tiny_config):
    with pytest.raises(UserError, match="needs sequences of 148 tokens, more than the longest"):
        bench.run(tiny_config("pe=nope", ON, "eval.retrieval_distances=[100]"), tmp_path)
    assert not list(tmp_path.glob("checkpoint*"))


# ---- the report -----------------------------------------------------------------------------


def probe_record(
    scheme: str, mode: str, x: int, gain: float, half: float = 0.01, seed: int = 0, **more
) -> dict:
    """A hand-made probe record of ``scheme`` at eval length or distance ``x``."""
    fields = {"gain_bits": gain, "gain_ci_low": gain - half, "gain_ci_high": gain + half}
    if mode == "retrieval":
        fields |= {"distance": x, "copy_acc": 0.0, "control_acc": 0.0, "targets": 112}
        x = probes.copy_length(x)
    elif mode == "context_gain":
        fields |= {"targets": 64}
    else:
        fields = {"mean_distance": [x / 4, x / 5], "entropy": [1.0, 2.0], "targets": 2 * x}
    base = record(scheme, seed, x, 0.0, mode=mode, stride=x, probe_hash="abc")
    return {**base, "nll": None, "ppl": None, "bpb": None, **fields, **more}


def probe_folder(tmp_path, retrieval_gains: dict[str, float]):
    rows = []
    for scheme, gain in retrieval_gains.items():
        rows += [record(scheme, 0, 16, 2.0), record(scheme, 0, 32, 2.1)]
        rows += [probe_record(scheme, "context_gain", 32, -0.2)]
        rows += [probe_record(scheme, "retrieval", d, gain) for d in (8, 16)]
        rows += [probe_record(scheme, "attention", n, 0.0) for n in (16, 32)]
    for scheme in retrieval_gains:
        write_jsonl(tmp_path / scheme / RECORDS, [r for r in rows if r["scheme"] == scheme])
    return tmp_path


@pytest.mark.slow
def test_the_report_says_when_the_copy_probe_has_no_signal(tmp_path):
    folder = probe_folder(tmp_path, {"rope": 0.004, "alibi": 0.03})
    built = build_report(folder, echo=False)
    text = built.path.read_text()
    section = text.split("## Context use")[1].split("\n## ")[0]
    assert "**No signal.** At the shortest distance, D = 8 (< L_train = 16)" in section
    assert "| rope   | -0.200 [-0.210, -0.190] |" in section  # context gain, CI over windows
    assert "over the run's windows (one seed)], 64 scored targets" in section
    for name in ("context_gain", "retrieval", "attention"):
        assert f"(figures/{name}.png)" in section and (folder / "tables" / f"{name}.csv").exists()
    attention = pd.read_csv(folder / "tables" / "attention.csv")
    assert attention.columns.tolist() == ["label", "eval_len", "layer", "mean_distance", "entropy"]
    assert len(attention) == 2 * 2 * 2  # labels x lengths x layers
    # the perplexity tables are those of the perplexity records alone
    assert built.tables["ppl"]["eval_len"].tolist() == [16, 32, 16, 32]


@pytest.mark.slow
def test_the_report_names_the_labels_with_signal(tmp_path):
    folder = probe_folder(tmp_path, {"rope": 0.004, "alibi": 0.8})
    text = build_report(folder, echo=False).path.read_text()
    assert "No signal" not in text
    assert "Signal at D = 8 (< L_train = 16) (gain >= 0.05 bits, CI excluding 0): alibi; " in text
    assert "no signal (their numbers are noise): rope." in text


def test_seeds_give_the_probe_cells_their_confidence_interval(tmp_path):
    rows = []
    for seed, gain in enumerate([0.1, 0.2, 0.3]):
        run = {"run_id": f"rope-{seed}"}
        rows += [record("rope", seed, 16, 2.0, **run), record("rope", seed, 32, 2.0, **run)]
        rows += [probe_record("rope", "context_gain", 32, gain, seed=seed, **run)]
        write_jsonl(tmp_path / f"s{seed}" / RECORDS, [r for r in rows if r["seed"] == seed])
    context = build_report(tmp_path, echo=False).context.tables["context_gain"]
    (cell,) = context.itertuples()
    half = 4.302653 * 0.1 / math.sqrt(3)  # t(0.975, 2) x sd / sqrt(n)
    assert (cell.n, cell.over) == (3, "seeds")
    assert cell.mean == pytest.approx(0.2) and cell.ci_high == pytest.approx(0.2 + half)


@pytest.mark.slow
def test_every_eval_key_is_left_out_of_the_job_folder_name():
    """Another probe setting (like any other eval-only key) finds the same trained model's
    folder (eval.variants is left as it was)."""
    cfg = compose(hydra=True)
    excluded = set(cfg.hydra.job.config.override_dirname.exclude_keys)
    keys = {f"eval.{f.name}" for f in dataclasses.fields(EvalConfig)} - {"eval.variants"}
    assert keys <= excluded
