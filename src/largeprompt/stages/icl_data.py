"""Stage 1, in-context regression data: the fixed test set and the Bayes risk (SPEC §3.1 stage 1, F6).

The test set holds ``n_test`` prompts at the largest prompt length, drawn from stream
(seed, "icl/test", 0), in long format: one row per (prompt, token_index). Rows 0…L_max−1 are the
prompt tokens (x, y); the row with token_index −1 is the query x_q with its target y_q in column y.
Every row carries the prompt's task β. Prompt length L reads tokens 0…L−1, so prompts are nested.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..icl import RegressionTask, optimal_linear_attention_risk, ridge_predictions
from ..measures import toeplitz_covariance
from ..parquet_io import read_parquet, write_parquet
from ..provenance import provenance
from ..seeding import stream_generator

QUERY_INDEX = -1


def regression_task(icl: dict) -> RegressionTask:
    """The task of config section ``icl``: Λ = Toeplitz(ρ) in d dimensions, τ², σ² (SPEC §0)."""
    cov = toeplitz_covariance(icl["dim"], icl["covariance_rho"], dtype=torch.float64)
    return RegressionTask(cov, icl["task_variance"], icl["noise_variance"])


def test_set_frame(task: RegressionTask, n_test: int, max_prompt_length: int, seed: int) -> pd.DataFrame:
    """The long-format test set (module docstring)."""
    gen = stream_generator(seed, "icl/test", 0)
    query, prompt, target, beta = task.sample_with_tasks(n_test, max_prompt_length, gen)  # [N,D] [N,L,D] [N] [N,d]
    d, L = task.dim, max_prompt_length
    tokens = torch.cat([torch.cat([query[:, None, :d], target[:, None, None]], dim=-1), prompt], dim=1)  # [N, L+1, D]
    frame = pd.DataFrame({
        "prompt": np.repeat(np.arange(n_test), L + 1),
        "token_index": np.tile(np.arange(-1, L), n_test),
    })
    flat = tokens.reshape(-1, d + 1).numpy()
    for j in range(d):
        frame[f"x{j}"] = flat[:, j]
    frame["y"] = flat[:, d]
    betas = np.repeat(beta.numpy(), L + 1, axis=0)
    for j in range(d):
        frame[f"beta{j}"] = betas[:, j]
    return frame


def load_test_set(frame: pd.DataFrame, prompt_length: int | None = None, dtype=torch.float64, device="cpu"):
    """(query [N, D], prompt [N, L, D], target [N]) from the long-format test set, first L tokens, on ``device``."""
    frame = frame.sort_values(["prompt", "token_index"])
    xcols = sorted((c for c in frame.columns if c.startswith("x")), key=lambda c: int(c[1:]))
    n = frame["prompt"].nunique()
    arr = frame[xcols + ["y"]].to_numpy().reshape(n, -1, len(xcols) + 1)  # [N, L_max+1, D]
    query = torch.tensor(arr[:, 0], dtype=dtype, device=device)  # [N, D]
    target = query[:, -1].clone()  # [N]
    query[:, -1] = 0.0  # z_q = (x_q, 0)
    prompt = torch.tensor(arr[:, 1:] if prompt_length is None else arr[:, 1 : 1 + prompt_length], dtype=dtype, device=device)  # [N, L, D]
    return query, prompt, target


def make_icl_test_set(inputs, outputs, params, rule="make_icl_test_set"):
    """Write results/data/icl_test.parquet."""
    task = regression_task(params["icl"])
    frame = test_set_frame(task, params["icl"]["n_test"], params["max_prompt_length"], params["seed"])
    write_parquet(frame, outputs["test_set"], provenance(rule, params, seed=params["seed"]))


def bayes_prompt_lengths(train_lengths, n_grid: int = 30) -> list[int]:
    """The training grid plus a geometric grid from 1 to the largest L, for a smooth Bayes curve."""
    grid = np.unique(np.round(np.geomspace(1, max(train_lengths), n_grid)).astype(int))
    return sorted(set(int(L) for L in grid) | set(int(L) for L in train_lengths))


def bayes_risk(inputs, outputs, params, rule="bayes_risk"):
    """Write results/data/bayes_risk.parquet: the ridge (λ = σ²/τ²) test MSE at every L, with its standard error."""
    icl = params["icl"]
    task = regression_task(icl)
    query, prompt, target = load_test_set(read_parquet(inputs["test_set"]))
    ridge = icl["noise_variance"] / icl["task_variance"]
    rows = []
    for L in bayes_prompt_lengths(params["prompt_lengths"]):
        err2 = (ridge_predictions(query, prompt[:, :L], ridge) - target) ** 2  # [N]
        rows.append({
            "prompt_length": L,
            "bayes_risk": float(err2.mean()),
            "bayes_risk_se": float(err2.std() / len(err2) ** 0.5),
            "in_training_grid": L in set(params["prompt_lengths"]),
            # population risk of the best linear-attention predictor x_qᵀΓ*m̂ (THEORY §F(v)), for reference
            "optimal_linear_attention_risk": optimal_linear_attention_risk(
                task.covariance.numpy(), icl["task_variance"], icl["noise_variance"], L
            ),
        })
    write_parquet(pd.DataFrame(rows), outputs["bayes_risk"], provenance(rule, params, seed=params["seed"]))
