"""Training: AdamW, linear warmup then cosine decay, gradient clipping, fixed seeds.

The data order comes from a generator seeded by ``train.seed`` alone, so at a given seed every
scheme is trained on the same batches in the same order, from the same trunk initialisation.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from pe_bench.config import Range, check_fields
from pe_bench.data.corpus import Corpus
from pe_bench.data.tasks import TaskData
from pe_bench.errors import UserError
from pe_bench.files import atomic_write
from pe_bench.model.gpt import GPT
from pe_bench.positions import PositionScheme
from pe_bench.run.distributed import World
from pe_bench.run.progress import Progress, log_epochs

log = logging.getLogger(__name__)

# The ranges of training settings (checked by ``config.check_value`` where a config enters).
AT_LEAST_0, AT_LEAST_1, POSITIVE = Range(ge=0), Range(ge=1), Range(gt=0)
BETA = Range(ge=0, lt=1)  # Adam's betas: 1 or more never forgets, and torch refuses them
SEED = Range(ge=-(2**63), lt=2**64)  # what torch.manual_seed accepts


@dataclass
class TrainConfig:
    seq_len: Annotated[int, AT_LEAST_1] = 64  # training length L_train
    batch_size: Annotated[int, AT_LEAST_1] = 32
    steps: Annotated[int, AT_LEAST_1] = 800
    lr: Annotated[float, POSITIVE] = 2e-3
    min_lr_ratio: Annotated[float, Range(ge=0, le=1)] = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: Annotated[int, AT_LEAST_0] = 50
    weight_decay: Annotated[float, AT_LEAST_0] = 0.1
    beta1: Annotated[float, BETA] = 0.9
    beta2: Annotated[float, BETA] = 0.95
    grad_clip: Annotated[float, AT_LEAST_0] = 1.0  # max global gradient norm; 0 disables clipping
    seed: Annotated[int, SEED] = 0  # trunk init and data order
    log_every: Annotated[int, AT_LEAST_1] = 50  # steps between training-curve points
    val_every: Annotated[int, AT_LEAST_0] = 200  # steps between validation losses (0: at the end)
    val_batches: Annotated[int, AT_LEAST_1] = 8
    ckpt_every: Annotated[int, AT_LEAST_0] = 100  # steps between checkpoints (0: only at the end)
    device: str = "auto"  # auto: cuda when available, else cpu
    compile: bool = False  # torch.compile the training step (worth it on GPU, not on CPU)

    def __post_init__(self) -> None:
        check_fields(self, "train")


@dataclass
class FinetuneConfig:
    """Continue training a trained model at ``factor`` x its training length, as Chen et al.
    (2023, https://arxiv.org/abs/2306.15595) extend LLaMA: with the trained scheme ("FT",
    direct fine-tuning) or with a variant of it such as position interpolation ("PI").

    A fresh AdamW (warmup, then cosine) on the same data stream; settings not listed here
    (betas, clipping, seed, logging, checkpoints) are the run's ``train`` settings.
    """

    factor: Annotated[float, Range(ge=1)] = 4.0  # fine-tuning length = factor x train.seq_len
    steps: Annotated[int, AT_LEAST_1] = 100
    lr: Annotated[float, POSITIVE] = 2e-4
    warmup_steps: Annotated[int, AT_LEAST_0] = 20
    weight_decay: Annotated[float, AT_LEAST_0] = 0.0  # Chen et al. fine-tune without weight decay
    batch_size: Annotated[int, AT_LEAST_1] | None = None  # null: the same tokens per step
    pe: dict[str, Any] | None = None  # the scheme to fine-tune with; null: the trained one

    def __post_init__(self) -> None:
        if self.factor < 1:  # the message tests pin for a config built in Python
            raise UserError(f"finetune factor must be >= 1, got {self.factor:g}")
        check_fields(self, "finetune")

    def train_config(self, train: TrainConfig) -> TrainConfig:
        """The ``TrainConfig`` of this fine-tuning for a model trained with ``train``."""
        seq_len = round(self.factor * train.seq_len)
        tokens_per_step = train.batch_size * train.seq_len
        return dataclasses.replace(
            train,
            seq_len=seq_len,
            batch_size=self.batch_size or max(1, tokens_per_step // seq_len),
            steps=self.steps,
            lr=self.lr,
            warmup_steps=self.warmup_steps,
            weight_decay=self.weight_decay,
        )


@dataclass
class TrainResult:
    curve: list[dict] = field(default_factory=list)  # {"step", "loss", "lr"} and val points
    final_loss: float = float("nan")
    final_val_loss: float = float("nan")
    time_s: float = 0.0


def swap_scheme(model: GPT, scheme: PositionScheme) -> PositionScheme:
    """Put ``scheme`` in place of ``model``'s own, carrying over the trained scheme's parameters
    (eval-time variants, fine-tunes with another scheme); returns the scheme it replaced."""
    original = model.pe
    scheme.load_state_dict(original.state_dict())
    model.pe = scheme.to(next(model.parameters()).device)
    return original


DEVICES = "auto, cpu, cuda, cuda:<index>, mps"  # what train.device may name


def resolve_device(name: str) -> torch.device:
    """The device ``train.device`` names, refused in one line where it is not there (torch
    would fail later, in the middle of a run)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise UserError(f"train.device={name!r} is not a device; allowed: {DEVICES}") from err
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise UserError(
                f"train.device={name!r} but no CUDA device is available; use auto or cpu"
            )
        if device.index is not None and device.index >= count:
            raise UserError(
                f"train.device={name!r} but this machine has {count} CUDA device(s); "
                f"allowed: cuda:0 to cuda:{count - 1}, auto or cpu"
            )
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"train.device={name!r} but no MPS device is available; use auto or cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"train.device={name!r}: pe-bench cannot train there; allowed: {DEVICES}")
    return device


def autocast(device: torch.device):
    """bf16 autocast on GPU; nothing on CPU (CPU bf16 matmuls are far slower than fp32)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate at ``step`` (0-based): linear warmup, then cosine to lr * min_lr_ratio."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def make_optimizer(model: GPT, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices and embeddings only (nanoGPT's split)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


@torch.no_grad()
def validation_loss(
    model: GPT, corpus: Corpus | TaskData, cfg: TrainConfig, device: torch.device
) -> float:
    """Mean loss on the first ``val_batches`` x ``batch_size`` windows of the valid split (of a
    task: as many fixed validation instances), each window weighing the same."""
    inputs, targets = corpus.valid_windows(cfg.val_batches * cfg.batch_size, cfg.seq_len)
    n_windows = len(inputs)
    model.eval()
    total = 0.0
    for i in range(0, n_windows, cfg.batch_size):
        x, y = inputs[i : i + cfg.batch_size].to(device), targets[i : i + cfg.batch_size].to(device)
        with autocast(device):
            total += model(x, y).item() * len(x)
    model.train()
    return total / n_windows


class Diverged(RuntimeError):
    """Training produced a non-finite loss: the run stops and is recorded as diverged."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"training diverged: loss {loss} at step {step}")
        self.step = step


def save_checkpoint(path: Path, state: dict) -> None:
    """``torch.save`` through ``atomic_write``: a kill leaves the old or the new one, and two
    processes never share a temporary file (its name is unique; removed on failure)."""
    atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Path, fingerprint: str) -> dict | None:
    """The checkpoint at ``path`` if it belongs to this run (its ``fingerprint``), else None.

    An unreadable one stops the run with one line naming it: pe-bench's own writes are atomic,
    so a cut-short file means something outside the run (a full disk, a copy cut short) that
    the user should see, and silently retraining would throw away what it may still hold."""
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict):
            raise TypeError(f"it holds a {type(state).__name__}, not a training state")
    except Exception as err:  # truncated or foreign: OSError, EOFError, UnpicklingError, ...
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {reason}); delete it, "
            "or rerun with force=true to train this run from scratch"
        ) from None
    if state.get("fingerprint") != fingerprint:
        log.warning("%s belongs to another config; training from scratch", path)
        return None
    return state


def fit(
    model: GPT,
    corpus: Corpus | TaskData,
    cfg: TrainConfig,
    device: torch.device,
    desc: str = "train",
    on_log: Callable[[dict], None] | None = None,
    checkpoint: Path | None = None,
    fingerprint: str = "",
    world: World | None = None,
    resume: bool = True,
) -> TrainResult:
    """Train ``model`` in place for ``cfg.steps`` steps; returns the training curve.

    With ``checkpoint``, the full training state (weights, optimizer, data-order and global RNG
    states, step, curve) is saved there every ``cfg.ckpt_every`` steps and at the end, and a
    matching checkpoint found at start is resumed (unless ``resume`` is False): on CPU the result
    is bitwise the same as an uninterrupted run. Raises ``Diverged`` on a non-finite loss
    (checked whenever the loss is logged or a checkpoint is written, so a checkpoint never holds
    a diverged state).

    Under torchrun (``world.size > 1``) each rank trains on its slice of every global batch
    through DistributedDataParallel, and rank 0 alone writes the checkpoint.
    """
    world = world or World()
    training = _Training.start(model, corpus, cfg, device, world)
    result, first_step, elapsed = TrainResult(), 0, 0.0
    state = load_checkpoint(checkpoint, fingerprint) if checkpoint and resume else None
    if state:
        result.curve, first_step, elapsed = training.restore(state)
        log.info("%s: resumed at step %d of %d from %s", desc, first_step, cfg.steps, checkpoint)
    start = time.perf_counter()
    bar = _progress_bar(desc, first_step, cfg.steps, world)
    step_tokens = cfg.batch_size * cfg.seq_len
    progress = Progress(
        desc, cfg.steps, step_tokens, first_step, bar.disable is True and world.main
    )
    if world.main:
        log_epochs(desc, corpus, cfg.steps, cfg.batch_size, cfg.seq_len)
    for step in bar:
        loss, lr = training.step(step)
        done = step + 1
        log_now, save_now = _due(done, cfg, checkpoint is not None)
        if not (log_now or save_now):
            continue
        loss_value = world.mean(loss).item()  # the only host sync in the loop
        if not math.isfinite(loss_value):
            raise Diverged(done, loss_value)
        if log_now:
            point = training.curve_point(done, loss_value, lr)
            result.curve.append(point)
            bar.set_postfix(loss=f"{loss_value:.3f}")
            progress.log(done, loss_value)
            if on_log:
                on_log(point)
        if save_now and world.main:
            state = training.state(done, result.curve, elapsed + time.perf_counter() - start)
            save_checkpoint(checkpoint, {"fingerprint": fingerprint, **state})
    return _finished(result, cfg, elapsed + time.perf_counter() - start, desc)


def _progress_bar(desc: str, first_step: int, steps: int, world: World) -> tqdm:
    """The steps still to run, as a progress bar on the main process (silent elsewhere)."""
    return tqdm(
        range(first_step, steps),
        desc=desc,
        initial=first_step,
        total=steps,
        disable=None if world.main else True,
        dynamic_ncols=True,
    )


def _due(done: int, cfg: TrainConfig, checkpointing: bool) -> tuple[bool, bool]:
    """Whether a curve point, and a checkpoint (when ``checkpointing``), are due after ``done``
    steps: every ``log_every`` and ``ckpt_every`` steps, and both at the last step."""
    log_now = done % cfg.log_every == 0 or done == cfg.steps
    save_now = checkpointing and (
        done == cfg.steps or bool(cfg.ckpt_every and done % cfg.ckpt_every == 0)
    )
    return log_now, save_now


@dataclass
class _Training:
    """What every step of one ``fit`` uses, built once: the model (and the form the step calls,
    ``step_model``), its optimizer, the data-order generator, this rank's rows of a batch."""

    model: GPT
    step_model: nn.Module
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    rows: slice
    corpus: Corpus | TaskData
    cfg: TrainConfig
    device: torch.device

    @classmethod
    def start(
        cls,
        model: GPT,
        corpus: Corpus | TaskData,
        cfg: TrainConfig,
        device: torch.device,
        world: World,
    ) -> _Training:
        """A fresh start: the data order seeded by ``cfg.seed`` alone, a new AdamW."""
        step_model = _step_model(model, cfg, device, world)
        rows = world.batch_slice(cfg.batch_size)
        optimizer = make_optimizer(model, cfg)
        generator = torch.Generator().manual_seed(cfg.seed)
        return cls(model, step_model, optimizer, generator, rows, corpus, cfg, device)

    def step(self, step: int) -> tuple[torch.Tensor, float]:
        """Optimizer step ``step`` (0-based) on the next batch; its loss, left on the device
        (reading it is a host sync), and its learning rate."""
        cfg, device, rows = self.cfg, self.device, self.rows
        lr = lr_at(step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x, y = self.corpus.train_batch(cfg.batch_size, cfg.seq_len, self.generator)
        x, y = x[rows].to(device, non_blocking=True), y[rows].to(device, non_blocking=True)
        with autocast(device):
            loss = self.step_model(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        return loss, lr

    def curve_point(self, done: int, loss: float, lr: float) -> dict[str, float]:
        """A training-curve point after ``done`` steps, with the validation loss when due."""
        point = {"step": done, "loss": loss, "lr": lr}
        if done == self.cfg.steps or (self.cfg.val_every and done % self.cfg.val_every == 0):
            point["val_loss"] = validation_loss(self.model, self.corpus, self.cfg, self.device)
        return point

    def state(self, step: int, curve: list[dict], elapsed: float) -> dict[str, Any]:
        """Everything a resumed run needs to continue bitwise as if it had not stopped."""
        return {
            "step": step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "curve": curve,
            "elapsed": elapsed,
        }

    def restore(self, state: dict[str, Any]) -> tuple[list[dict], int, float]:
        """Put a checkpoint's training state back (``state`` in reverse); returns its curve,
        step and elapsed seconds."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        return state["curve"], state["step"], state["elapsed"]


def _step_model(model: GPT, cfg: TrainConfig, device: torch.device, world: World) -> nn.Module:
    """``model`` on ``device`` in training mode, as the training step calls it: wrapped in DDP
    across processes, compiled with ``train.compile``."""
    model.to(device).train()
    if device.type == "cuda":  # TF32 matmuls: the usual trade on Ampere and later
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    step_model: nn.Module = model
    if world.size > 1:
        ids = [device.index] if device.type == "cuda" else None
        step_model = DistributedDataParallel(model, device_ids=ids)
    if cfg.compile:
        step_model = torch.compile(step_model)
    return step_model


def _finished(result: TrainResult, cfg: TrainConfig, time_s: float, desc: str) -> TrainResult:
    result.final_loss = result.curve[-1]["loss"]
    result.final_val_loss = result.curve[-1]["val_loss"]
    result.time_s = time_s
    log.info(
        "%s: %d steps in %.1f s, final loss %.4f, val loss %.4f",
        desc,
        cfg.steps,
        result.time_s,
        result.final_loss,
        result.final_val_loss,
    )
    return result


def finetune(
    model: GPT,
    scheme: PositionScheme,
    corpus: Corpus | TaskData,
    cfg: TrainConfig,
    device: torch.device,
    **fit_args: Any,
) -> tuple[GPT, TrainResult]:
    """A copy of the trained ``model`` trained further with ``cfg`` (a ``FinetuneConfig``'s
    ``train_config``) and ``scheme``; the trained model stays as it is. ``fit_args`` go to
    ``fit`` (checkpoint, fingerprints, world, resume)."""
    tuned = copy.deepcopy(model)
    swap_scheme(tuned, scheme)
    return tuned, fit(tuned, corpus, cfg, device, **fit_args)
