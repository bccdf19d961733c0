"""Plain-SGD training of the §6 model: every (model, seed) run at one prompt length in one process
(docs/experiments.md#training-protocol).

Runs are stacked (:mod:`largeprompt.icl.engine.stacked`) and advance together, one step at a time. Batch k of
batch stream j is drawn from the counter-based stream (base_seed, "train/batch", j, k): softmax and
linear runs, and all seeds, share stream 0 (common random numbers); a ``replicate`` run repeats a
seed on an independent stream, which measures the SGD-noise part of the spread. Each run has its
own step sizes (:mod:`largeprompt.icl.schedules`) and clock t = Σ lr; it logs a row whenever its clock
passes a point of the grid T·j/n_log. Plain SGD has no optimiser state, so the weights, the step and
the logged rows are the whole state, and a job resumes bit-identically from its checkpoint
(:class:`largeprompt.io.checkpoints.Checkpoint`, passed in by the stage).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from largeprompt.core.seeding import stream_generator, stream_rng
from largeprompt.icl import models
from largeprompt.icl.engine import stacked, tuning
from largeprompt.icl.risks import infinite_prompt_risk
from largeprompt.icl.task import RegressionTask


class TrainingDiverged(RuntimeError):
    """Raised instead of recording status ``diverged`` when divergence is configured to be fatal."""


@dataclass(frozen=True)
class RunSpec:
    """One training run: the model, its seed (initial weights) and its batch stream (0 = shared)."""

    model: str
    seed: int
    stream: int = 0

    @property
    def label(self) -> str:
        return f"{self.model} seed={self.seed}" + (f" stream={self.stream}" if self.stream else "")


def run_specs(models_: list[str], seeds: list[int], replicate_seeds: list[int]) -> list[RunSpec]:
    """Every (model, seed) on the shared stream, then each replicate seed on streams 1, 2, …."""
    specs = [RunSpec(m, int(s)) for s in seeds for m in models_]
    specs += [RunSpec(m, int(s), j + 1) for j, s in enumerate(replicate_seeds) for m in models_]
    return specs


def initial_parameters(base_seed: int, run_seed: int, dim: int, dtype=torch.float64, device="cpu"):
    """The run's initial weights, from stream (base_seed, "train/init", run_seed): identical for softmax and linear."""
    return models.init_parameters(dim, stream_generator(base_seed, "train/init", run_seed), dtype=dtype, device=device)


def batch_generator(base_seed: int, stream: int, step: int, dtype):
    """The generator of batch ``step`` of batch stream ``stream``: numpy's ziggurat for float64 batches (the R4 runs;
    exact law, faster than torch's float64 randn), torch's randn for float32 ones (docs/theory.md#token-sampler)."""
    if dtype == torch.float64:
        return stream_rng(base_seed, "train/batch", stream, step)
    return stream_generator(base_seed, "train/batch", stream, step)


def batch(task: RegressionTask, base_seed: int, stream: int, step: int, batch_size: int, prompt_length: int, dtype, device):
    """Batch ``step`` of batch stream ``stream``: (query [B, D], prompt [B, L, D], target [B])."""
    gen = batch_generator(base_seed, stream, step, dtype)
    query, prompt, target = task.sample(batch_size, prompt_length, gen, dtype=dtype)
    return query.to(device), prompt.to(device), target.to(device)


def whitened_batch(task: RegressionTask, base_seed: int, stream: int, step: int, batch_size: int, prompt_length: int,
                   dtype, device):
    """The engine's batch ``step`` of ``stream``: :func:`batch`'s numbers with the prompt whitened, (query, prompt',
    target, T or None) (:meth:`largeprompt.icl.task.RegressionTask.sample_whitened`)."""
    gen = batch_generator(base_seed, stream, step, dtype)
    query, prompt, target, frame = task.sample_whitened(batch_size, prompt_length, gen, dtype=dtype)
    return query.to(device), prompt.to(device), target.to(device), None if frame is None else frame.to(device)


def test_losses(stack: stacked.RunStack, test_set, batch_size: int = 128) -> np.ndarray:
    """MSE [R] of every run on the fixed test set (query [N, D], prompt [N, L, D], target [N]), with the machine's
    plan for training batches of ``batch_size`` (:mod:`largeprompt.icl.engine.tuning`)."""
    query, prompt, target = test_set
    N, L, D = prompt.shape
    plan = tuning.plan_for(int(stack.softmax.sum()), L, min(N, batch_size), D, prompt.dtype, prompt.device)
    with torch.no_grad():
        pred = stacked.predict(stack, query, prompt, plan)  # [R, N]
        return ((pred - target) ** 2).mean(-1).double().cpu().numpy()


def log_row(task: RegressionTask, params: dict[str, torch.Tensor], step: int, time: float, train_loss: float,
            test_loss: float, status: str, limit=None) -> dict:
    """One trajectory row: losses, R∞ (closed form, float64; or ``limit``'s value, e.g. the quadrature R∞ of
    bounded covariates, :func:`largeprompt.icl.bounded_risk.limit_risk`), parameter summaries and θ."""
    as64 = {k: v.detach().to(device="cpu", dtype=torch.float64) for k, v in params.items()}
    with torch.no_grad():
        if limit is None:
            if task.token_measure != "gaussian":
                raise ValueError(f"{task.token_measure} covariates: pass the R∞ to log (icl.bounded_risk.limit_risk)")
            risk = float(infinite_prompt_risk(task, *(as64[n] for n in models.PARAMETER_NAMES)))
        else:
            risk = float(limit.value(models.flatten(as64).numpy()))
    row = {"step": int(step), "time": float(time), "train_loss": train_loss, "test_loss": float(test_loss),
           "infinite_prompt_risk": risk, "status": status}
    row.update(models.parameter_summaries(as64, task.token_dim))
    row["theta"] = models.flatten(as64).numpy().tolist()  # all weights in the order of models.flatten (Q, K, V, O)
    return row
