"""Training every run of one prompt length, as the ``train`` and ``train_trajectory_transfer`` rules do
(docs/experiments.md#training-protocol, docs/experiments.md#drifting-runs): the runs, their step sizes
from their own R∞ flows, and the stacked SGD with checkpoints."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from largeprompt.icl.engine.loop import PromptLengthTrainer
from largeprompt.icl.engine.runs import run_specs
from largeprompt.icl.schedules import Decay, stability_margin, step_sizes
from largeprompt.icl.task import RegressionTask


@dataclass(frozen=True)
class TrainSettings:
    """Config section ``train`` (or ``transfer``): what determines the runs of one prompt length."""

    models: list
    seeds: list
    replicate_seeds: list
    batch_size: int
    lr: float
    step_size_rule: str
    stability_fraction: float
    horizon: float
    decay_start: float
    decay_end: float
    final_lr: float
    n_log: int
    divergence_threshold: float
    fatal_divergence: bool
    dtype: str


TRANSFER_FIXED = dict(step_size_rule="constant", stability_fraction=1.0, divergence_threshold=1e4, fatal_divergence=False,
                      dtype="float64", decay_start=1.0, decay_end=1.0)  # plain SGD in float64 at the config's lr


def transfer_section(section: dict) -> dict:
    """The :class:`TrainSettings` fields of an R4 transfer section (``transfer``, or ``transfer`` overridden by
    ``beyond_gaussian.trajectory_transfer``): its keys plus plain constant-step SGD in float64 (docs/experiments.md#trajectory_transfer)."""
    return dict(section, final_lr=section["lr"], **TRANSFER_FIXED)


@dataclass(frozen=True)
class Flow:
    """What training reads from one seed's R∞ flow: its sharpness on the flow grid and its class."""

    times: np.ndarray
    sharpness: np.ndarray
    kind: str  # flow_class.FLOW_CLASSES


def flow_key(spec, flows: dict):
    """The key of a run's own flow in ``flows``: (model, seed) where the two models' limits differ (bounded
    covariates, docs/theory.md#bounded-token-risk), else the seed."""
    return (spec.model, spec.seed) if (spec.model, spec.seed) in flows else spec.seed


def schedules(cfg: TrainSettings, specs, flows: dict) -> list[np.ndarray]:
    """Each run's step sizes. A run whose flow drifts gets at most the step count of the longest other run
    (docs/experiments.md#drifting-runs); a constant lr that a flow says is unstable is warned about, naming the key."""
    decay = Decay(cfg.decay_start, cfg.decay_end, cfg.final_lr)

    def schedule(flow, horizon):
        return step_sizes(cfg.step_size_rule, cfg.lr, horizon, cfg.stability_fraction,
                          None if flow is None else (flow.times, flow.sharpness), decay)

    keys = sorted({flow_key(s, flows) for s in specs}, key=lambda k: k if isinstance(k, tuple) else ("", k))
    own = {k: flows.get(k) for k in keys}
    by_key = {k: schedule(own[k], cfg.horizon) for k in keys}
    drifting = [k for k in keys if own[k] is not None and own[k].kind == "drifts"]
    steady = [len(by_key[k]) for k in keys if k not in drifting]
    budget = max(steady) if steady else len(step_sizes("constant", cfg.lr, cfg.horizon))
    for k in drifting:
        if len(by_key[k]) > budget:
            print(f"seed {k}: its R∞ flow drifts; its {len(by_key[k])} steps to t = {cfg.horizon:g} are cut at {budget}, "
                  f"the longest other run, so it trains to t = {by_key[k][:budget].sum():.4g}")
            by_key[k] = by_key[k][:budget]
    for k in keys:
        if own[k] is not None and (margin := stability_margin(by_key[k], own[k].times, own[k].sharpness)) >= 2.0:
            times, sharp = own[k].times, own[k].sharpness
            print(f"WARNING: config key 'train.lr' = {cfg.lr:g} is unstable for seed {k}: lr·sharpness of its "
                  f"R∞ flow reaches {margin:.3g} ≥ 2 (sharpness {sharp.max():.3g} at t = {times[sharp.argmax()]:g}; "
                  f"stable below lr = {2 / sharp.max():.3g}, or use train.step_size_rule: flow_sharpness)")
    return [by_key[flow_key(s, flows)] for s in specs]


def train_runs(cfg: TrainSettings, task: RegressionTask, prompt_length: int, base_seed: int, test_set,
               flows: dict, *, checkpoint, checkpoint_every: int, key_extra: dict, device,
               progress=None, limits: dict | None = None) -> pd.DataFrame:
    """Every run of ``cfg`` at ``prompt_length`` trained to its horizon: the trajectory rows of all runs, with
    each run's largest lr·sharpness along its own flow in column ``stability_margin`` (NaN without a flow).
    ``checkpoint`` (load/save, e.g. :class:`largeprompt.io.checkpoints.Checkpoint`) or None; ``flows`` by seed or
    (model, seed) (:func:`flow_key`); ``limits``: model → the R∞ its rows log (default the Gaussian closed form)."""
    specs = run_specs(cfg.models, cfg.seeds, cfg.replicate_seeds)
    sizes = schedules(cfg, specs, flows)
    own = {s: flows.get(flow_key(s, flows)) for s in specs}
    margins = {(s.model, s.seed, s.stream): stability_margin(lr, own[s].times, own[s].sharpness)
               for s, lr in zip(specs, sizes) if own[s] is not None}
    if margins:
        print(f"largest lr·sharpness along the runs' own flows: {max(margins.values()):.3f} (stable below 2)")
    trainer = PromptLengthTrainer(task, specs, sizes, prompt_length=prompt_length, base_seed=base_seed,
                                  batch_size=cfg.batch_size, n_log=cfg.n_log, divergence_threshold=cfg.divergence_threshold,
                                  dtype=cfg.dtype, device=device, limits=limits)
    frame = trainer.run(test_set, checkpoint=checkpoint, checkpoint_every=checkpoint_every, key_extra=key_extra,
                        fatal_divergence=cfg.fatal_divergence, progress=progress)
    keys = zip(frame["model"], frame["seed"], frame["stream"])
    frame["stability_margin"] = [margins.get((m, int(s), int(j)), np.nan) for m, s, j in keys]  # max lr·λ of the run
    return frame
