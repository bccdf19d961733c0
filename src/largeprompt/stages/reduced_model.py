"""Rule ``reduced_model`` (R4; docs/theory.md#trajectory-transfer): the reduced (v, A) model trained by SGD at
several L against its infinite-prompt flow (isotropic start, closed form); the distance to the flow per (L, seed), and
``coupled_difference`` (v − v^c, A − A^c) to its coupled L = ∞ run (docs/theory.md#coupled-limit)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from largeprompt.icl.dynamics import isotropic_flow, reduced_model_sgd
from largeprompt.icl.risks import reduced_infinite_prompt_risk
from largeprompt.icl.task import RegressionTask
from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.pipeline import settings_from
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress


@dataclass(frozen=True)
class ReducedModelSettings:
    """Config section ``infinite.reduced_model``: the isotropic task and the SGD runs."""

    dim: int
    noise_variance: float
    v0: float
    a0: float
    lr: float
    steps: int
    batch_size: int
    log_every: int
    prompt_lengths: list
    seeds: list


def reduced_task(cfg: ReducedModelSettings) -> RegressionTask:
    """The reduced model's isotropic task: Λ = I_d, τ² = 1, σ² from config (docs/theory.md#reduced-infinite-prompt-risk)."""
    return RegressionTask(np.eye(cfg.dim), 1.0, cfg.noise_variance)


def training_steps(steps: int, log_every: int) -> np.ndarray:
    """The logged steps of a run of ``steps`` steps: multiples of log_every and the last."""
    return np.unique(np.r_[np.arange(0, steps + 1, log_every), steps])


def _reduced_frame(task, L, seed, steps, times, v, A, v_inf, A_inf) -> pd.DataFrame:
    with torch.no_grad():
        risk = [float(reduced_infinite_prompt_risk(task, torch.tensor(vi), torch.tensor(Ai))) for vi, Ai in zip(v, A)]
    dist = np.sqrt((v - v_inf) ** 2 + ((A - A_inf) ** 2).sum(axis=(1, 2)))
    return pd.DataFrame({"prompt_length": L, "seed": seed, "step": steps, "time": times, "v": v,
                         "norm_A": np.linalg.norm(A, axis=(1, 2)), "infinite_prompt_risk": risk,
                         "distance_to_flow": dist,
                         "theta": list(np.concatenate([np.asarray(v)[:, None], A.reshape(len(A), -1)], axis=1))})


def reduced_model(inputs, outputs, params, rule="reduced_model"):
    """Write results/<run>/infinite/reduced_model.parquet: SGD at each L and seed, and the L = ∞ flow (prompt_length 0)."""
    cfg = settings_from(ReducedModelSettings, params["infinite"]["reduced_model"], "infinite.reduced_model")
    task = reduced_task(cfg)
    d = task.dim
    steps = training_steps(cfg.steps, cfg.log_every)
    times = cfg.lr * steps
    v_inf, a_inf = isotropic_flow(cfg.v0, cfg.a0, d, times)  # closed form (Λ = I)
    A_inf = a_inf[:, None, None] * np.eye(d)  # [T, d, d]
    frames = [_reduced_frame(task, 0, -1, steps, times, v_inf, A_inf, v_inf, A_inf).assign(coupled_difference=None)]
    for L, s in progress([(L, s) for L in cfg.prompt_lengths for s in cfg.seeds], desc="reduced model SGD"):
        logged, v, A, v_c, A_c = reduced_model_sgd(task, cfg.v0, cfg.a0 * np.eye(d), L, cfg.lr, cfg.steps,
                                                   cfg.batch_size, params["seed"], s, cfg.log_every)
        frame = _reduced_frame(task, L, s, logged, cfg.lr * logged, v, A, v_inf, A_inf)
        frame["coupled_difference"] = list(np.concatenate([(v - v_c)[:, None], (A - A_c).reshape(len(v), -1)], axis=1))
        frames.append(frame)
        print(f"L={L} seed={s}: sup distance to the L=inf flow {frames[-1]['distance_to_flow'].max():.4f}")
    write_parquet(pd.concat(frames, ignore_index=True), outputs["result"],
                  provenance(rule, params, base_seed=params["seed"], run_seeds=cfg.seeds))
