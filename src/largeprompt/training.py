"""Plain-SGD training of the §6 model at one prompt length, with checkpoint/resume and divergence detection
(SPEC §0, §3.1 stage 2, §4, §5).

Batch s of run ``run_seed`` is drawn from the counter-based stream (base_seed, "train/batch", run_seed, s),
so it does not depend on the model or on earlier steps: softmax and linear see the same batches, and a
resumed run regenerates exactly the batches it would have drawn. Plain SGD has no optimiser state, so
the weights, the step and the logged rows are the whole state of a run.

Logging: a row at every step s that is a multiple of ``log_every`` (and at the last step), holding the
weights θ_s, the test loss and R∞ at θ_s, and ``train_loss`` = mean batch loss ℓ_{s'} at θ_{s'} over the
window s − log_every < s' ≤ s.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from . import models
from .icl import RegressionTask, infinite_prompt_risk
from .seeding import stream_generator

DTYPES = {"float64": torch.float64, "float32": torch.float32}


class TrainingDiverged(RuntimeError):
    """Raised instead of recording status ``diverged`` when divergence is configured to be fatal."""


class _Interrupted(RuntimeError):
    """Test hook: simulates a job killed at a given step."""


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a training trajectory (its hash guards checkpoint reuse)."""

    model: str
    prompt_length: int
    run_seed: int
    base_seed: int
    steps: int
    batch_size: int
    lr: float
    log_every: int
    divergence_threshold: float
    dtype: str = "float32"
    task: str = ""  # the in-context task (config `icl`) as sorted JSON: a checkpoint of another task is not reused

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def estimated_runtime_minutes(steps: int, prompt_length: int) -> int:
    """A generous time limit for one run: 10 min plus 3× the measured ≈ 0.5 ms + 8 µs·L per step at batch 128
    (`largeprompt bench` measures the current cost)."""
    return 10 + int(steps) * (60 + int(prompt_length)) // 2_500_000


def initial_parameters(base_seed: int, run_seed: int, dim: int, dtype=torch.float64, device="cpu"):
    """The run's initial weights, from stream (base_seed, "train/init", run_seed): identical for softmax and linear."""
    return models.init_parameters(dim, stream_generator(base_seed, "train/init", run_seed), dtype=dtype, device=device)


def batch(task: RegressionTask, cfg: RunConfig, step: int, dtype, device):
    """Batch ``step`` of run ``cfg.run_seed``: (query [B, D], prompt [B, L, D], target [B])."""
    gen = stream_generator(cfg.base_seed, "train/batch", cfg.run_seed, step)
    query, prompt, target = task.sample(cfg.batch_size, cfg.prompt_length, gen, dtype=dtype)
    return query.to(device), prompt.to(device), target.to(device)


def test_loss(params, test_set, model: str, prompt_length: int) -> float:
    """MSE on the fixed test set, reading the first ``prompt_length`` tokens of each nested prompt."""
    query, prompt, target = test_set  # [N, D], [N, L_max, D], [N]
    with torch.no_grad():
        pred = models.predict(params, query, prompt[:, :prompt_length], model)  # [N]
        return float(models.mse(pred, target))


def _save_checkpoint(path: Path, state: dict) -> None:
    """torch.save to a temporary name, then an atomic rename: a kill never leaves a half checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _load_checkpoint(path: Path | None, cfg: RunConfig):
    if path is None or not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a corrupt checkpoint is ignored, never trusted
        print(f"checkpoint {path} unreadable ({exc}); starting from step 0")
        return None
    if state.get("config") != cfg.key():
        print(f"checkpoint {path} was made with another config; starting from step 0")
        return None
    return state


def train_run(
    task: RegressionTask,
    cfg: RunConfig,
    test_set,
    *,
    checkpoint_path: str | os.PathLike | None = None,
    checkpoint_every: int = 0,
    fatal_divergence: bool = False,
    device="cpu",
    progress=None,
    _interrupt_at: int | None = None,
) -> pd.DataFrame:
    """Train the §6 ``cfg.model`` at ``cfg.prompt_length`` by plain SGD; return its logged trajectory.

    Resumes from ``checkpoint_path`` when it exists and was written for the same ``cfg``.
    Divergence (a non-finite batch loss or one above ``cfg.divergence_threshold``) stops the run with
    a final row of status ``diverged``, or raises :class:`TrainingDiverged` when ``fatal_divergence``.
    """
    dtype = DTYPES[cfg.dtype]
    dim = task.token_dim
    ckpt = Path(checkpoint_path) if checkpoint_path is not None else None
    test_set = tuple(t.to(device=device, dtype=dtype) for t in test_set)

    state = _load_checkpoint(ckpt, cfg)
    if state is None:
        params = initial_parameters(cfg.base_seed, cfg.run_seed, dim, dtype=dtype, device=device)
        start, rows, window = 0, [], []
    else:
        params = {k: v.to(device) for k, v in state["params"].items()}
        start, rows, window = state["step"], state["rows"], state["window"]
        print(f"resumed from {ckpt} at step {start}")
    for w in params.values():
        w.requires_grad_(True)

    steps_iter = range(start, cfg.steps + 1)
    if progress is not None:
        steps_iter = progress(steps_iter, total=cfg.steps + 1 - start)
    status = "ok"
    for step in steps_iter:
        if ckpt is not None and checkpoint_every and step > start and step % checkpoint_every == 0:
            _save_checkpoint(ckpt, {
                "config": cfg.key(),
                "step": step,
                "params": {k: v.detach().cpu().clone() for k, v in params.items()},
                "rows": rows,
                "window": window,
            })
        if _interrupt_at is not None and step == _interrupt_at:
            raise _Interrupted(step)

        query, prompt, target = batch(task, cfg, step, dtype, device)
        loss = models.mse(models.predict(params, query, prompt, cfg.model), target)  # ℓ_s at θ_s
        loss_value = float(loss.detach())
        window.append(loss_value)
        diverged = not math.isfinite(loss_value) or loss_value > cfg.divergence_threshold
        if step % cfg.log_every == 0 or step == cfg.steps or diverged:
            rows.append(_log_row(task, params, test_set, cfg, step, float(np.mean(window)), "diverged" if diverged else "ok"))
            window = []
        if diverged:
            status = "diverged"
            message = f"{cfg.model} L={cfg.prompt_length} seed={cfg.run_seed}: diverged at step {step} (batch loss {loss_value:.3g})"
            print(message)
            if fatal_divergence:
                raise TrainingDiverged(message + "; set train.fatal_divergence: false to record it and continue")
            break
        if step == cfg.steps:
            break
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for w, g in zip(params.values(), grads):
                w -= cfg.lr * g  # plain SGD
    frame = pd.DataFrame(rows)
    frame.attrs["status"] = status
    return frame


def _log_row(task, params, test_set, cfg: RunConfig, step: int, train_loss: float, status: str) -> dict:
    detached = {k: v.detach() for k, v in params.items()}
    as64 = {k: v.to(torch.float64) for k, v in detached.items()}
    with torch.no_grad():
        risk = float(infinite_prompt_risk(task, *(as64[n].cpu() for n in models.PARAMETER_NAMES)))
    row = {
        "step": step,
        "time": cfg.lr * step,
        "train_loss": train_loss,
        "test_loss": test_loss(detached, test_set, cfg.model, cfg.prompt_length),
        "infinite_prompt_risk": risk,
        "status": status,
    }
    row.update(models.parameter_summaries(as64, task.token_dim))
    theta = models.flatten(as64).cpu().numpy()
    row.update({f"theta_{i:03d}": float(t) for i, t in enumerate(theta)})
    return row
