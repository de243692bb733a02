"""The ``pe-bench`` command line refused in one line naming the bad value and what is allowed
(``cli.command_line``, before Hydra runs anything), and the plan's refusals before training;
fast in process, the console script's own in slow tests."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from pe_bench.cli import bench
from pe_bench.cli.command_line import check_command
from pe_bench.errors import UserError
from pe_bench.resolvers import run_dir_name
from pe_bench.run.config import TOP_KEYS
from tests.helpers import ROOT, TINY, compose, overridden, pe_bench

# Bad input, refused before any training with one line naming the value and what is allowed.
BAD_INPUT = [
    (["pe=pi"], "pe=pi is an eval-time variant of rope"),
    (["pe=learned", "pe.max_positions=32"], "scheme 'learned' cannot serve length 64"),
    (["data=text", "data.path=/no/such/folder"], "data.path='/no/such/folder' does not exist"),
    (["eval.tokens=99999999"], "evaluation needs 99,999,937 to score 99,999,936 targets"),
    (["train.steps=abc"], "train.steps='abc' must be an integer"),
    (["model.num_heads=3"], "model.num_heads (3) must divide model.d_model (32)"),
    (["eval.lengths=[0,16]"], "eval.lengths[0] must be >= 1, got 0"),
    (["eval.factors=[0]"], "eval.factors[0] must be > 0, got 0.0"),
    (["model.d_model=36", "model.num_heads=4"], "rope needs an even head_dim, got 9"),
    (
        ["eval.modes=[sliding]", "eval.stride=100"],
        "eval.stride=100 is longer than the eval window 16",
    ),
    (["eval.modes=[overlap]"], "unknown eval mode 'overlap'; allowed: nonoverlap, sliding"),
    (["pe=t5", "+pe.buckets=8"], "scheme 't5' has no option buckets; allowed: num_buckets"),
    (["+pe.plugin=no_such_pkg.my_pe"], "pe.plugin='no_such_pkg.my_pe' does not import"),
    (["+train.stesp=3"], "unknown key train.stesp; allowed:"),
    (["model.attention=flex"], "model.attention=flex: FlexAttention has no backward on CPU"),
    # Issue 15, item 7: each was silent, misleading or a traceback.
    (["+modle=smoke"], "unknown key modle (did you mean model?); allowed: compare, data,"),
    (["train.min_lr_ratio=-5"], "train.min_lr_ratio must be >= 0 and <= 1, got -5.0"),
    (["pe.base=-1"], "pe.base must be > 1, got -1.0"),
    (["pe.base=abc"], "pe.base='abc' must be a number"),
    (["data=text"], "data=text needs data.path=<file or folder>"),
    (["data=hf"], "data=hf needs data.name=<dataset>, e.g. Salesforce/wikitext"),
    (["data.valid_frac=2"], "data.valid_frac must be > 0 and < 1, got 2.0"),
    (["data.test_frac=abc"], "data.test_frac='abc' must be a number"),
    (
        ["data.valid_frac=0.6", "data.test_frac=0.5"],
        "data.valid_frac + data.test_frac must be < 1 (the rest is the train split), got 0.6 + 0.5",
    ),
    (["+finetune@finetunes.pi=pi", "finetunes.pi.steps=-3"], "finetunes.pi.steps must be >= 1"),
    (
        ["+finetune@finetunes.pi=pi", "finetunes.pi.pe.factor=0.5"],
        "finetunes.pi.pe.factor must be >= 1, got 0.5",
    ),
    (
        ["train.batch_size=100000000000"],
        "train.batch_size=100000000000 x seq_len 16: one training step needs at least",
    ),
    (["model.vocab_size=10"], "model.vocab_size=10 is smaller than the corpus's 256 byte symbols"),
    (["eval.variants.pi.factor=abc"], "eval.variants.pi.factor='abc' must be a number"),
    (["pe=alibi", "eval.variants.ntk.base=1"], "eval.variants.ntk.base must be > 1, got 1.0"),
    (["train.beta2=1.5"], "train.beta2 must be >= 0 and < 1, got 1.5"),
    (["train.lr=0"], "train.lr must be > 0, got 0.0"),
    (["logger=wandb", "logger.mode=offlne"], "logger.mode='offlne' must be one of offline,"),
    (
        ["+pe.plugin=tests.plugins.raises_at_import"],
        "pe.plugin='tests.plugins.raises_at_import' does not import: RuntimeError: cannot reach",
    ),
    (
        ["pe.name=init_raises", "+pe.plugin=tests.plugins.init_raises", "~pe.base"],
        "scheme 'init_raises' (tests.plugins.init_raises.InitRaises) raised in __init__ with "
        "options {}: ValueError: needs d_model >= 4096, got 32",
    ),
    (
        ["+pe.plugin=tests.plugins.not_a_scheme"],
        "does not import: TypeError: @register('not_a_scheme') needs a PositionScheme subclass",
    ),
    pytest.param(
        ["train.device=cuda"],
        "train.device='cuda' but no CUDA device is available",
        marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here"),
    ),
]


def first_in_fast_lane(cases: list, n: int) -> list:
    """The cases as pytest params, all but the first ``n`` marked slow (about 0.3 s each:
    each composes the config as Hydra does)."""
    params = [c if hasattr(c, "marks") else pytest.param(*c) for c in cases]
    return [
        p if i < n else pytest.param(*p.values, marks=[*p.marks, pytest.mark.slow], id=p.id)
        for i, p in enumerate(params)
    ]


@pytest.mark.parametrize(("args", "message"), first_in_fast_lane(BAD_INPUT, 6))
def test_bad_input_is_refused_before_training(tmp_path, tiny_config, args, message):
    with pytest.raises(UserError, match=re.escape(message)):
        bench.run(tiny_config(*args), tmp_path)
    # nothing written, nothing trained: at most the job folder's lock, for refusals that need
    # the data (too few test tokens)
    assert not [path for path in tmp_path.iterdir() if path.name != ".lock"]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["-m", "--cfg", "hydra"], "--multirun and --cfg given together"),
        (["--run", "--info", "all"], "--run and --info given together"),
    ],
)
def test_two_of_hydras_modes_at_once_are_one_line(flags, said):
    # Hydra raised its ValueError ("Only one of --run, --multirun, --cfg ...") as a traceback
    with pytest.raises(UserError, match=re.escape(said) + ".*allowed: one of --run, --multirun"):
        check_command([*flags, "pe=rope"])


def test_a_plugin_with_a_syntax_error_is_one_line(tmp_path, monkeypatch, tiny_config):
    (tmp_path / "bad_syntax.py").write_text("def broken(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    message = "pe.plugin='bad_syntax' does not import: SyntaxError: invalid syntax ("
    with pytest.raises(UserError, match=re.escape(message) + r".*bad_syntax.py, line 1\)"):
        bench.run(tiny_config("+pe.plugin=bad_syntax"), tmp_path / "out")


def test_top_keys_are_the_composed_config_keys(tiny_config):
    assert set(tiny_config()) == set(TOP_KEYS)


# conf/pe's files, the one list of pe options (Hydra names them in this order)
PE_OPTIONS = ", ".join(sorted(path.stem for path in (ROOT / "conf" / "pe").glob("*.yaml")))
TRAIN_KEYS = "batch_size, beta1, beta2, ckpt_every, compile, device, grad_clip, log_every, lr"

# Bad input that only the console script meets: Hydra refuses it while composing, before
# ``run``, with many lines of its own; ``pe-bench`` says it in one.
CONSOLE_BAD_INPUT = [
    (
        ["pe=roep"],
        f"pe=roep is not an option of pe (did you mean pe=rope?); allowed: {PE_OPTIONS}",
    ),
    (
        ["-m", "pe=rope,roep"],
        "pe=roep is not an option of pe (did you mean pe=rope?); allowed: alibi,",
    ),
    (
        ["train.step=10"],
        f"unknown key train.step (did you mean train.steps?); allowed: {TRAIN_KEYS}",
    ),
    (["pe.bse=1"], "unknown key pe.bse (did you mean pe.base?); allowed: base, name"),
    (["logger=mlflow"], "logger=mlflow is not an option of logger; allowed: none, wandb"),
    (
        ["+finetune@finetunes.x=nosuch"],
        "+finetune@finetunes.x=nosuch is not an option of finetune; allowed: drope, ft, pi",
    ),
    (["experiment=nosuch"], "experiment=nosuch is not an option of experiment; allowed: alibi_"),
    (["+modle=smoke"], "unknown key modle (did you mean model?); allowed: compare, data,"),
    (["out_root=/dev/null/x"], "out_root='/dev/null/x' cannot hold the job folders (Not a dir"),
    (["pe.base=abc"], "pe.base='abc' must be a number"),
    (["pe=pi"], "pe=pi is an eval-time variant of rope"),
    (["data=text", "data.path=/no/such/folder"], "data.path='/no/such/folder' does not exist"),
    (["+pe.plugin=bad_syntax"], "pe.plugin='bad_syntax' does not import: SyntaxError:"),
    (["pe.name=init_raises", "+pe.plugin=tests.plugins.init_raises", "~pe.base"], "raised in"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("args", "message"), CONSOLE_BAD_INPUT)
def test_bad_input_is_one_clear_line(tmp_path, args, message):
    (tmp_path / "bad_syntax.py").write_text("def broken(:\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    flags = [arg for arg in args if arg.startswith("-")]  # Hydra's flags come first
    out = next((Path(a.split("=", 1)[1]) for a in args if a.startswith("out_root=")), None)
    rest = [arg for arg in args if arg not in flags and not arg.startswith("out_root=")]
    proc = pe_bench(*flags, *TINY, *rest, out=out or tmp_path / "out", env=env)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("pe-bench: error: "), proc.stderr
    assert message in lines[0]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.pt"))


# Issue 30: the values the reliability round made one line for single runs, in a sweep: the
# command-line check plans every job first, so one line, exit 2, no job folder.
SWEEP_BAD_INPUT = [
    (["model.num_heads=3"], "model.num_heads (3) must divide model.d_model"),
    (["data=text", "data.path=/nonexistent/corpus"], "data.path='/nonexistent/corpus' does not"),
    (["eval.lengths=[0]"], "eval.lengths[0] must be >= 1, got 0"),
    (["train.lr=abc"], "train.lr='abc' must be a number"),
    (["train.min_lr_ratio=-5"], "train.min_lr_ratio must be >= 0 and <= 1, got -5.0"),
    (["data=text"], "data=text needs data.path=<file or folder>"),
    (["model.vocab_size=10"], "model.vocab_size=10 is smaller than the corpus's 256 byte"),
    (["pe.base=abc"], "pe.base"),
    (["train.beta2=1.5"], "train.beta2 must be >= 0 and < 1, got 1.5"),
    (["eval.variants.pi.factor=abc"], "eval.variants.pi.factor='abc' must be a number"),
    (["pe=learned", "pe.max_positions=8"], "max_positions=8 is below the training length"),
    (["+train.stesp=3"], "unknown key train.stesp"),
    (["logger=wandb", "logger.mode=offlne"], "logger.mode='offlne' must be one of offline,"),
]
SWEEPS = {"experiment": ["experiment=smoke"], "command line": ["-m", "pe=rope,alibi"]}


@pytest.mark.parametrize("sweep", SWEEPS)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(*case, marks=[pytest.mark.slow] if i >= 2 else [])
        for i, case in enumerate(SWEEP_BAD_INPUT)
    ],
)
def test_a_bad_value_in_a_sweep_is_refused_before_any_job(tmp_path, sweep, args, message):
    if "pe=rope,alibi" in SWEEPS[sweep] and any(a.startswith("pe=") for a in args):
        message = "pe is given twice"  # beside a sweep over pe, a scheme is refused first
    with pytest.raises(UserError, match=re.escape(message)) as caught:
        check_command([*SWEEPS[sweep], *args, f"out_root={tmp_path / 'out'}"])
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_sweep_names_the_job_with_the_bad_value(tmp_path):
    """The first job is fine, the second is not: every job is planned, and the one refused is
    named with its overrides."""
    message = "train.lr must be > 0, got 0.0 (in the sweep's job pe=rope train.lr=0 "
    with pytest.raises(UserError, match=re.escape(message)):
        check_command(["-m", "pe=rope", "train.lr=1e-3,0", f"out_root={tmp_path / 'out'}"])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sweep", "args", "message"),
    [("experiment", *SWEEP_BAD_INPUT[0]), ("command line", *SWEEP_BAD_INPUT[3])],
)
def test_a_bad_value_in_a_sweep_is_one_line_and_exit_2(tmp_path, sweep, args, message):
    flags = [a for a in SWEEPS[sweep] if a.startswith("-")]
    rest = [a for a in SWEEPS[sweep] if not a.startswith("-")]
    proc = pe_bench(*flags, *rest, *args, out=tmp_path / "out")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("pe-bench: error: ") and message in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_corrected_sweep_reports_no_stale_failure(tmp_path):
    """A job folder an earlier sweep left failed, which this sweep does not run again, is not
    named as failed by this sweep (nor does it fail it)."""
    stale = tmp_path / "fix" / "pe=rope,train.lr=0.5"
    stale.mkdir(parents=True)
    (stale / "error.txt").write_text("an earlier sweep's failure\n")
    proc = pe_bench("-m", "pe=rope,alibi", "name=fix", *TINY, out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "failed:" not in proc.stdout + proc.stderr


# Issue 29, items 7-9: inputs that gave a traceback, were silently ignored or were refused
# with a misleading line. Each is now one line naming the bad value and what is allowed,
# before anything is made. (args, what the line must say); ``{tmp}`` is the test's folder.
ROUND_3 = [
    # tracebacks
    (["=3"], "override '=3' has no key; allowed: key=value"),
    (["train.lr=${oops}"], "train.lr=${oops} cannot be resolved (Interpolation key 'oops'"),
    (["name=a_file"], "{tmp}/out/a_file is a file; allowed: move that file away, or pick"),
    (["pe=alibi", "name=jobs"], "cannot be made: a file is in its place; allowed: move that"),
    # silently ignored
    (["eval.factors=[]"], "eval.factors=[] gives no eval length; allowed: one factor or more"),
    (["eval.factors=[inf]"], "eval.factors[0] must be a finite number > 0, got inf"),
    (["eval.factors=[1,inf]"], "eval.factors[1] must be a finite number > 0, got inf"),
    (["data.vocab_size=300"], "data.vocab_size=300 is not read by this run: only a BPE"),
    # misleading
    (["pe=[rope,alibi]"], "pe=[rope,alibi] selects 2 configs of pe at once; allowed: one, e.g."),
    (["data.tokenizer=bpe", "data.vocab_size=0"], "data.vocab_size=0 leaves no room for merges"),
    (
        ["data.tokenizer=bpe", "data.vocab_size=100000000000000000000"],
        "allowed: data.vocab_size of at most ",
    ),
    (["train.seq_len=10000000"], "GiB of cpu memory here; allowed: "),  # a batch or a length
    (["train.seq_len=2000000000"], "is longer than the corpus: data=stdlib holds "),
]
# model=hf: a scheme, a fine-tune or a training key it would ignore (no model is loaded).
PRETRAINED_UNREAD = [
    (["pe=alibi"], "pe=alibi is not read by this run: model=hf keeps the model's own RoPE"),
    (["pe.base=5"], "pe.base=5 is not read by this run: model=hf keeps the model's own RoPE"),
    (["train.steps=5"], "train.steps=5 is not read by this run: model=hf trains nothing"),
    (["+finetune@finetunes.pi=pi"], "is not read by this run: model=hf evaluates the model as"),
    (["data.tokenizer=bpe"], "data.tokenizer=bpe is not read by this run: model=hf reads the"),
]


def files_where_jobs_go(tmp_path: Path) -> None:
    """A file ``a_file`` where ``name=a_file`` puts its jobs, and a file named as the folder
    of the job ``pe=alibi name=jobs`` (with ``TINY``)."""
    out = tmp_path / "out"
    (out / "jobs").mkdir(parents=True)
    (out / "a_file").write_text("")
    dirname = compose(*TINY, "pe=alibi", "name=jobs", hydra=True).hydra.job.override_dirname
    (out / "jobs" / run_dir_name(dirname)).write_text("")


@pytest.mark.parametrize(("args", "message"), first_in_fast_lane(ROUND_3, 3))
def test_round_3_bad_input_is_one_line_before_anything_is_made(tmp_path, args, message):
    files_where_jobs_go(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(UserError) as caught:
        check_command(overridden(*TINY, *args, f"out_root={tmp_path / 'out'}"))
    assert message.replace("{tmp}", str(tmp_path)) in str(caught.value)
    assert "\n" not in str(caught.value)
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.slow
@pytest.mark.parametrize(("args", "message"), PRETRAINED_UNREAD)
def test_what_a_pretrained_model_would_ignore_is_refused(tmp_path, args, message):
    with pytest.raises(UserError, match=re.escape(message)):
        check_command(["model=hf", "model.name=org/model", *args, f"out_root={tmp_path}"])
    check_command(["model=hf", "model.name=org/model", "+pe@eval.variants.y=yarn"])  # allowed


def test_a_key_given_twice_is_refused():
    """Hydra uses the last value without a word; a benchmark run for hours on the other."""
    message = "train.lr is given twice (train.lr=1e-3 and train.lr=2e-3); allowed: one value"
    with pytest.raises(UserError, match=re.escape(message)):
        check_command(["train.lr=1e-3", "train.lr=2e-3"])


def test_a_flag_after_the_overrides_is_one_line():
    with pytest.raises(UserError, match="unrecognized arguments: pe=rope,alibi; allowed: Hydra"):
        check_command(["train.steps=3", "-m", "pe=rope,alibi"])


def test_a_missing_local_model_is_no_such_folder(tmp_path):
    """A path (it starts with '/') where nothing is: not the hub's "Repo id must be in the
    form ..." (no network is asked)."""
    missing = tmp_path / "no_model"
    with pytest.raises(UserError, match=re.escape(f"model.name='{missing}': no such file or")):
        bench.run(compose("model=hf", f"model.name={missing}"), tmp_path / "out")


@pytest.mark.slow
def test_a_non_utf8_argument_is_one_clear_line(tmp_path):
    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/\xff")
    proc = pe_bench(*TINY, out=Path(out))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "is not UTF-8 text; allowed: UTF-8 keys and values" in proc.stderr
