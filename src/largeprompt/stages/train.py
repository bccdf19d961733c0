"""Stage 2, training at each prompt length: every (model, seed) run at one L in one job
(docs/experiments.md#training-protocol).

* :func:`train` — the R6 runs, with the step-size rule of config ``train.step_size_rule``
  (``flow_sharpness`` reads each seed's infinite-prompt flow; ``constant`` is the paper's plain SGD).
* :func:`train_transfer` — the R4 runs: constant small lr, large batch, short horizon, each seed also
  on an independent batch stream to measure the SGD-noise floor.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..devices import dtype_of, resolve_device
from ..icl import regression_task
from ..parquet_io import read_parquet, write_parquet
from ..pipeline import DEFAULT_RUNTIME, settings_from
from ..provenance import provenance
from ..runlog import progress
from ..schedules import Decay, stability_margin, step_sizes
from ..trainer import PromptLengthTrainer
from ..training import run_specs
from .icl_data import load_test_set


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


def load_flows(paths) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """seed → (times, sharpness) of each seed's infinite-prompt flow."""
    flows = {}
    for path in paths:
        f = read_parquet(path, columns=["seed", "time", "sharpness"]).sort_values("time")
        flows[int(f["seed"].iloc[0])] = (f["time"].to_numpy(), f["sharpness"].to_numpy())
    return flows


def schedules(cfg: TrainSettings, specs, flows) -> list[np.ndarray]:
    """Each run's step sizes; warns (naming the key and the limit) where a constant lr is unstable for a flow."""
    decay = Decay(cfg.decay_start, cfg.decay_end, cfg.final_lr)
    sizes = [step_sizes(cfg.step_size_rule, cfg.lr, cfg.horizon, cfg.stability_fraction, flows.get(s.seed), decay)
             for s in specs]
    for spec, lr in zip(specs, sizes):
        if spec.seed in flows:
            margin = stability_margin(lr, *flows[spec.seed])
            if margin >= 2.0:
                times, sharp = flows[spec.seed]
                print(f"WARNING: config key 'train.lr' = {cfg.lr:g} is unstable for {spec.label}: lr·sharpness of its "
                      f"R∞ flow reaches {margin:.3g} ≥ 2 (sharpness {sharp.max():.3g} at t = {times[sharp.argmax()]:g}; "
                      f"stable below lr = {2 / sharp.max():.3g}, or use train.step_size_rule: flow_sharpness)")
    return sizes


def fit_prompt_length(cfg: TrainSettings, params, inputs, outputs, rule, runtime, flows) -> None:
    """Train every run of ``cfg`` at params['prompt_length'] and write its trajectories."""
    L, base_seed = int(params["prompt_length"]), int(params["seed"])
    task = regression_task(params["icl"])
    specs = run_specs(cfg.models, cfg.seeds, cfg.replicate_seeds)
    sizes = schedules(cfg, specs, flows)
    margins = {(s.model, s.seed, s.stream): stability_margin(lr, *flows[s.seed]) for s, lr in zip(specs, sizes)
               if s.seed in flows}
    if margins:
        print(f"largest lr·sharpness along the runs' own flows: {max(margins.values()):.3f} (stable below 2)")
    device, dtype = resolve_device(runtime.device), dtype_of(cfg.dtype)
    test_set = load_test_set(read_parquet(inputs["test_set"]), L, dtype=dtype, device=device)
    trainer = PromptLengthTrainer(task, specs, sizes, prompt_length=L, base_seed=base_seed, batch_size=cfg.batch_size,
                                  n_log=cfg.n_log, divergence_threshold=cfg.divergence_threshold, dtype=cfg.dtype,
                                  device=device)
    checkpoint = Path(params["checkpoint"])
    frame = trainer.run(test_set, checkpoint=checkpoint, checkpoint_every=runtime.checkpoint_every,
                        key_extra={"icl": params["icl"]}, fatal_divergence=cfg.fatal_divergence,
                        progress=functools.partial(progress, None, desc=f"{rule} L={L} ({len(specs)} runs)"))
    keys = zip(frame["model"], frame["seed"], frame["stream"])
    frame["stability_margin"] = [margins.get((m, int(s), int(j)), np.nan) for m, s, j in keys]  # max lr·λ of the run
    for (model, seed, stream), g in frame.groupby(["model", "seed", "stream"]):
        last = g.iloc[-1]
        print(f"{model:8s} seed={seed} stream={stream}: t={last['time']:.4g} step {last['step']} test {last['test_loss']:.5f}"
              f" R_inf {last['infinite_prompt_risk']:.5f} {last['status']}")
    write_parquet(frame, outputs["trajectories"],
                  provenance(rule, params, base_seed=base_seed, run_seeds=sorted({s.seed for s in specs}), runtime=runtime))
    checkpoint.unlink(missing_ok=True)  # the job is complete: its checkpoint is spent


def train(inputs, outputs, params, rule="train", runtime=DEFAULT_RUNTIME):
    """Write results/<run>/train/L{L}.parquet: every R6 run at this L (checkpointed at params['checkpoint'])."""
    cfg = settings_from(TrainSettings, params["train"], "train")
    fit_prompt_length(cfg, params, inputs, outputs, rule, runtime, load_flows(inputs["flows"]))


def train_transfer(inputs, outputs, params, rule="train_transfer", runtime=DEFAULT_RUNTIME):
    """Write results/<run>/transfer/L{L}.parquet: the R4 runs at this L, constant lr."""
    section = dict(params["transfer"], step_size_rule="constant", stability_fraction=1.0, divergence_threshold=1e4,
                   fatal_divergence=False, dtype="float64", decay_start=1.0, decay_end=1.0, final_lr=params["transfer"]["lr"])
    cfg = settings_from(TrainSettings, section, "transfer")
    fit_prompt_length(cfg, params, inputs, outputs, rule, runtime, load_flows(inputs.get("flows", [])))
