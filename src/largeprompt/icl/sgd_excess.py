"""SGD's stationary excess risk at a constant step (docs/theory.md#sgd-stationary-excess): plain SGD with step η and
batch B around a minimum θ* of the population risk keeps an excess E R(θ) − R(θ*) = η·tr Σ₁/(4B) + O(η²), Σ₁ the
covariance of one prompt's loss gradient at θ*. R6.linear compares trained linear attention with R(Γ*) plus this.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch.func import grad, vmap

from largeprompt.core.seeding import stream_generator
from largeprompt.icl import models


def per_prompt_gradients(params: dict[str, torch.Tensor], query, prompt, target, model: str) -> torch.Tensor:
    """∇_θ (ŷ_b − y_b)² for every prompt b, flattened in the order Q, K, V, O: [B, n_θ]."""
    def loss(p, q, z, y):
        prediction = models.predict_naive(p, q.unsqueeze(0), z.unsqueeze(0), model)[0]
        return (prediction - y) ** 2

    grads = vmap(grad(loss), in_dims=(None, 0, 0, 0))(params, query, prompt, target)
    return torch.cat([grads[n].reshape(query.shape[0], -1) for n in models.PARAMETER_NAMES], dim=1)


def gradient_noise_trace(params: dict[str, torch.Tensor], task, prompt_length: int, model: str, n_prompts: int,
                         generator: torch.Generator, block: int = 250) -> tuple[float, float]:
    """tr Σ₁ = E‖∇ℓ_b‖² − ‖E ∇ℓ_b‖² over fresh prompts of ``task`` at ``prompt_length``, with the Monte Carlo
    standard error of E‖∇ℓ_b‖² (the dominant term at a minimum, where E ∇ℓ_b ≈ 0)."""
    params = {k: v.detach().to(torch.float64) for k, v in params.items()}
    rows = []
    for start in range(0, n_prompts, block):
        query, prompt, target = task.sample(min(block, n_prompts - start), prompt_length, generator)
        rows.append(per_prompt_gradients(params, query, prompt.contiguous(), target, model))
    g = torch.cat(rows)  # [N, n_θ]
    sq = (g * g).sum(1)
    mean = g.mean(0)
    trace = float(sq.mean() - (mean * mean).sum())
    return trace, float(sq.std() / sq.numel() ** 0.5)


def stationary_excess(step_size: float, batch_size: int, trace: float) -> float:
    """η·tr Σ₁/(4B): SGD's leading-order stationary excess risk (docs/theory.md#sgd-stationary-excess)."""
    return step_size * trace / (4.0 * batch_size)



SGD_EXCESS_PROMPTS = 2000  # fresh prompts per run for tr Σ₁ (its Monte Carlo error is carried into R6.linear's test)


def final_weights_and_step(trajectory, dim: int) -> tuple[dict[str, torch.Tensor], float]:
    """A run's last logged weights and the mean step size over its last logging interval (time / steps)."""
    run = trajectory.sort_values("step")
    last, before = run.iloc[-1], run.iloc[-2]
    theta = torch.as_tensor(list(last["theta"]), dtype=torch.float64)
    return models.unflatten(theta, dim), float((last["time"] - before["time"]) / (last["step"] - before["step"]))


def run_excesses(runs, trajectories, task, batch_size: int, seed: int, model: str = "linear",
                 n_prompts: int = SGD_EXCESS_PROMPTS):
    """One row per ok shared-stream run of ``model`` in ``runs``: the predicted stationary excess η·tr Σ₁/(4B) at its
    final weights and step, and its Monte Carlo standard error (prompts from stream (seed, "sgd_excess", L, run seed))."""
    rows = []
    if "theta" not in trajectories:  # a table without weights (written by hand, or before theta was logged)
        return pd.DataFrame(rows, columns=["model", "prompt_length", "seed", "stream", "sgd_excess", "sgd_excess_se"])
    chosen = runs[(runs["model"] == model) & (runs["stream"] == 0) & (runs["status"] == "ok")]
    shared = trajectories[(trajectories["model"] == model) & (trajectories["stream"] == 0)]
    by_run = dict(list(shared.groupby(["prompt_length", "seed"])))  # one pass over the table, not one per run
    for r in chosen.itertuples():
        own = by_run[(r.prompt_length, r.seed)]
        params, step = final_weights_and_step(own, task.token_dim)
        gen = stream_generator(seed, "sgd_excess", int(r.prompt_length), int(r.seed))
        trace, se = gradient_noise_trace(params, task, int(r.prompt_length), model, n_prompts, gen)
        rows.append({"model": model, "prompt_length": int(r.prompt_length), "seed": int(r.seed), "stream": 0,
                     "sgd_excess": stationary_excess(step, batch_size, trace),
                     "sgd_excess_se": stationary_excess(step, batch_size, se)})
    return pd.DataFrame(rows, columns=["model", "prompt_length", "seed", "stream", "sgd_excess", "sgd_excess_se"])


def sgd_excess_columns(ok: pd.DataFrame) -> dict:
    """The mean over ok runs of SGD's predicted stationary excess (docs/theory.md#sgd-stationary-excess) and its
    Monte Carlo standard error; NaN where the runs carry none (softmax)."""
    if "sgd_excess" not in ok or ok["sgd_excess"].isna().all():
        return {"sgd_excess_mean": np.nan, "sgd_excess_se": np.nan}
    values = ok.dropna(subset=["sgd_excess"])
    return {"sgd_excess_mean": float(values["sgd_excess"].mean()),
            "sgd_excess_se": float(np.sqrt((values["sgd_excess_se"] ** 2).sum()) / len(values))}

