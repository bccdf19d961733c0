"""R4's coupled counterpart of a finite-L run (docs/theory.md#coupled-limit): plain SGD on the L = ∞ readout
(:func:`largeprompt.icl.models.limit_readout`) from the run's initial weights, at its constant step, on the very
batches it trained on: batch k of its stream redrawn (:func:`largeprompt.icl.engine.runs.batch_generator`), the tasks
β, queries and targets kept, the prompt dropped.

The two runs then share their Euler error and the task-and-query noise of their batches, which cancel in their
difference; what remains is the O(1/L) of the prompt's finiteness and the prompt-token noise, of order
√(lr·T/(B·L)), which falls with L instead of flooring it (docs/theory.md#coupled-limit).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from largeprompt.icl import models
from largeprompt.icl.engine.runs import batch_generator, initial_parameters
from largeprompt.icl.task import RegressionTask

RUN = ["model", "seed", "stream"]


def limit_step(states: dict, query, beta, target, task: RegressionTask, lr: float) -> None:
    """One SGD step, in place, of every run in ``states`` ((model, …) → its weights) on the mean squared error of the
    L = ∞ readout over the batch: one backward pass for all of them (their weights are disjoint)."""
    weights = [[params[n] for n in models.PARAMETER_NAMES] for params in states.values()]
    loss = sum(models.mse(models.limit_readout(query, beta, *models.attention_parameters(*w), task, key[0]), target)
               for key, w in zip(states, weights))
    flat = [w for ws in weights for w in ws]
    models.sgd_update(flat, torch.autograd.grad(loss, flat), lr)


def coupled_runs(runs: pd.DataFrame, task: RegressionTask, base_seed: int, lr: float, batch_size: int,
                 prompt_length: int, progress=None) -> pd.DataFrame:
    """One row per logged (model, seed, stream, step) of the runs at ``prompt_length`` that did not diverge: ``theta``
    of the coupled L = ∞ run at that step (module doc). ``runs``: trajectory rows of one L (columns model, seed,
    stream, step, status); ``progress(total=…)``: a bar updated once per step, or None."""
    ok = runs.groupby(RUN)["status"].transform(lambda s: (s != "diverged").all())
    rows = []
    if not ok.any():
        return pd.DataFrame(rows, columns=[*RUN, "step", "theta"])
    logged = runs[ok].groupby(RUN)["step"].apply(lambda s: set(s.astype(int)))
    bar = progress(total=sum(max(max(steps) for steps in m) for _, m in logged.groupby(level="stream"))) if progress else None
    for stream, members in logged.groupby(level="stream"):
        states = {key: {n: w.requires_grad_() for n, w in initial_parameters(base_seed, key[1], task.token_dim).items()}
                  for key in members.index}
        last = max(max(steps) for steps in members)
        for step in range(last + 1):
            for key, params in states.items():
                if step in members[key]:
                    theta = models.flatten({n: w.detach() for n, w in params.items()}).numpy().copy()
                    rows.append({"model": key[0], "seed": int(key[1]), "stream": int(stream), "step": step, "theta": theta})
            if step == last:
                break
            gen = batch_generator(base_seed, int(stream), step, torch.float64)
            query, target, beta = task.sample_query_side(batch_size, prompt_length, gen)
            limit_step(states, query, beta, target, task, lr)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return pd.DataFrame(rows, columns=[*RUN, "step", "theta"])


def with_coupled_weights(runs: pd.DataFrame, task: RegressionTask, base_seed: int, lr: float, batch_size: int,
                         prompt_length: int, progress=None) -> pd.DataFrame:
    """``runs`` (the trajectory rows of one L, as the training job writes them) with ``coupled_theta``: the coupled
    L = ∞ run's weights at each logged step (:func:`coupled_runs`); None for the runs that diverged."""
    coupled = coupled_runs(runs, task, base_seed, lr, batch_size, prompt_length, progress)
    coupled = coupled.rename(columns={"theta": "coupled_theta"})
    out = runs.merge(coupled, on=[*RUN, "step"], how="left", validate="one_to_one")
    out["coupled_theta"] = [None if not isinstance(t, np.ndarray) else t for t in out["coupled_theta"]]
    return out


def coupled_weights_of(runs: pd.DataFrame, settings, base_seed: int, prompt_length: int, progress=None) -> pd.DataFrame:
    """:func:`with_coupled_weights` of a training job's rows (``settings``: its
    :class:`largeprompt.icl.engine.job.Runs`, constant-step SGD); the ``then`` of the R4 training jobs."""
    cfg = settings.cfg
    if cfg.step_size_rule != "constant":
        raise ValueError(f"a coupled L = ∞ run follows constant-step SGD, not step_size_rule {cfg.step_size_rule!r}")
    return with_coupled_weights(runs, settings.task, base_seed, cfg.lr, cfg.batch_size, prompt_length, progress)


def coupled_differences(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs``' rows (of one L) that have a coupled partner (column ``coupled_theta``, :func:`with_coupled_weights`),
    with ``difference`` = θ_L − θ^c_∞ at that step (a vector)."""
    merged = runs[runs["coupled_theta"].notna()].copy()
    merged["difference"] = [np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
                            for a, b in zip(merged["theta"], merged["coupled_theta"])]
    return merged.drop(columns="coupled_theta")
