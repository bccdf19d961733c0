"""The held-out test set of the in-context regression task, and the reference risks on it
(docs/experiments.md#training_vs_prompt_length, docs/theory.md#bayes-risk, docs/theory.md#linear-attention-optimum).

The test set holds ``n_test`` prompts at the largest prompt length, drawn from stream
(seed, "icl/test", 0), in long format: one row per (prompt, token_index). Rows 0…L_max−1 are the
prompt tokens (x, y); the row with token_index −1 is the query x_q with its target y_q in column y.
Every row carries the prompt's task β. Prompt length L reads tokens 0…L−1, so prompts are nested.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from largeprompt.core.seeding import stream_generator
from largeprompt.icl.risks import linear_attention_fixed_point, optimal_linear_attention_risk
from largeprompt.icl.task import RegressionTask, ridge_predictions

QUERY_INDEX = -1


def test_set_frame(task: RegressionTask, n_test: int, max_prompt_length: int, seed: int, stream: str = "icl/test",
                   counter: int = 0) -> pd.DataFrame:
    """The long-format test set (module docstring), drawn from stream (seed, ``stream``, ``counter``)."""
    gen = stream_generator(seed, stream, counter)
    query, prompt, target, beta = task.sample_with_tasks(n_test, max_prompt_length, gen)  # [N,D] [N,L,D] [N] [N,d]
    d, L = task.dim, max_prompt_length
    tokens = torch.cat([torch.cat([query[:, None, :d], target[:, None, None]], dim=-1), prompt], dim=1)  # [N, L+1, D]
    frame = pd.DataFrame({
        "prompt": np.repeat(np.arange(n_test), L + 1),
        "token_index": np.tile(np.arange(QUERY_INDEX, L), n_test),
    })
    flat = tokens.reshape(-1, d + 1).numpy()
    for j in range(d):
        frame[f"x{j}"] = flat[:, j]
    frame["y"] = flat[:, d]
    betas = np.repeat(beta.numpy(), L + 1, axis=0)
    for j in range(d):
        frame[f"beta{j}"] = betas[:, j]
    return frame


def load_test_set(frame: pd.DataFrame, prompt_length: int | None = None, dtype=torch.float64, device="cpu",
                  feature_major: bool = False):
    """(query [N, D], prompt [N, L, D], target [N]) from the long-format test set, first L tokens, on ``device``;
    ``feature_major``: the prompt stored feature by feature, as the engine draws its batches (its native readout
    reads that layout, :func:`largeprompt.icl.engine.native_step.supports`)."""
    frame = frame.sort_values(["prompt", "token_index"])
    xcols = sorted((c for c in frame.columns if c.startswith("x")), key=lambda c: int(c[1:]))
    n = frame["prompt"].nunique()
    arr = frame[xcols + ["y"]].to_numpy().reshape(n, -1, len(xcols) + 1)  # [N, L_max+1, D]
    query = torch.tensor(arr[:, 0], dtype=dtype, device=device)  # [N, D]
    target = query[:, -1].clone()  # [N]
    query[:, -1] = 0.0  # z_q = (x_q, 0)
    stop = None if prompt_length is None else 1 + prompt_length
    if feature_major:
        prompt = torch.tensor(arr[:, 1:stop].transpose(2, 0, 1), dtype=dtype, device=device).permute(1, 2, 0)
    else:
        prompt = torch.tensor(arr[:, 1:stop], dtype=dtype, device=device)  # [N, L, D]
    return query, prompt, target


def bayes_prompt_lengths(train_lengths, n_grid: int = 30) -> list[int]:
    """The training grid plus a geometric grid from 1 to the largest L, for a smooth Bayes curve."""
    grid = np.unique(np.round(np.geomspace(1, max(train_lengths), n_grid)).astype(int))
    return sorted(set(int(L) for L in grid) | set(int(L) for L in train_lengths))


def linear_optimum_errors(task: RegressionTask, test_set, prompt_length: int) -> torch.Tensor:
    """Squared errors [N] of the best linear-attention predictor x_qᵀΓ*m̂ on the test prompts' first L tokens
    (docs/theory.md#linear-attention-optimum); their mean is R(Γ*) on the test set."""
    query, prompt, target = test_set
    prompt = prompt[:, :prompt_length]
    lam = task.covariance.numpy()
    gamma = torch.as_tensor(linear_attention_fixed_point(lam, task.task_variance, task.noise_variance, prompt_length,
                                                         task.excess_kurtosis), dtype=prompt.dtype)
    moment = (prompt[..., -1:] * prompt[..., :-1]).mean(1)  # m̂ = (1/L) Σ yᵢxᵢ [N, d]
    return (torch.einsum("ni,ij,nj->n", query[:, :-1], gamma, moment) - target) ** 2


def reference_risks(task: RegressionTask, test_set, prompt_length: int, ridge: float) -> dict:
    """At one L: the Bayes (ridge) and best-linear-attention (Γ*) predictors' MSE on the test set, with standard
    errors, and R(Γ*) in closed form (docs/theory.md#bayes-risk, docs/theory.md#linear-attention-optimum)."""
    query, prompt, target = test_set
    bayes = (ridge_predictions(query, prompt[:, :prompt_length], ridge) - target) ** 2  # [N]
    lam = task.covariance.numpy()
    linear = linear_optimum_errors(task, test_set, prompt_length)  # [N]
    n = len(target)
    return {
        "prompt_length": prompt_length,
        "bayes_risk": float(bayes.mean()),
        "bayes_risk_se": float(bayes.std() / n**0.5),
        "optimal_linear_attention_risk": optimal_linear_attention_risk(lam, task.task_variance, task.noise_variance,
                                                                       prompt_length, task.excess_kurtosis),
        "optimal_linear_attention_test_risk": float(linear.mean()),
        "optimal_linear_attention_test_risk_se": float(linear.std() / n**0.5),
        "n_test_prompts": n,
    }
