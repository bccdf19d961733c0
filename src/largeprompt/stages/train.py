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
import pandas as pd

from largeprompt.core.devices import dtype_of, resolve_device
from largeprompt.icl.flow_class import classify_flow
from largeprompt.icl.run_status import StatusRule, final_loss, judge, readout
from largeprompt.icl.schedules import Decay, stability_margin, step_sizes
from largeprompt.icl.task import regression_task
from largeprompt.icl.trainer import PromptLengthTrainer
from largeprompt.icl.training import run_specs
from largeprompt.io.parquet_io import read_parquet, write_parquet
from largeprompt.io.pipeline import DEFAULT_RUNTIME, settings_from
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress
from largeprompt.stages.icl_data import linear_optimum_errors, load_test_set


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


@dataclass(frozen=True)
class Flow:
    """What training reads from one seed's R∞ flow: its sharpness on the flow grid and its class."""

    times: np.ndarray
    sharpness: np.ndarray
    kind: str  # flow_class.FLOW_CLASSES


def load_flows(paths, noise_variance: float) -> dict[int, Flow]:
    """seed → :class:`Flow` of each seed's infinite-prompt flow file."""
    flows = {}
    for path in paths:
        f = read_parquet(path, columns=["seed", "time", "sharpness", "infinite_prompt_risk", "readout_determinant"])
        f = f.sort_values("time")
        kind, _ = classify_flow(f["time"], f["infinite_prompt_risk"], f["readout_determinant"], noise_variance)
        flows[int(f["seed"].iloc[0])] = Flow(f["time"].to_numpy(), f["sharpness"].to_numpy(), kind)
    return flows


def schedules(cfg: TrainSettings, specs, flows: dict[int, Flow]) -> list[np.ndarray]:
    """Each run's step sizes. A run whose flow drifts gets at most the step count of the longest other run
    (docs/experiments.md#drifting-runs); a constant lr that a flow says is unstable is warned about, naming the key."""
    decay = Decay(cfg.decay_start, cfg.decay_end, cfg.final_lr)

    def schedule(seed, horizon):
        flow = flows.get(seed)
        return step_sizes(cfg.step_size_rule, cfg.lr, horizon, cfg.stability_fraction,
                          None if flow is None else (flow.times, flow.sharpness), decay)

    seeds = sorted({s.seed for s in specs})
    by_seed = {s: schedule(s, cfg.horizon) for s in seeds}
    drifting = [s for s in seeds if s in flows and flows[s].kind == "drifts"]
    steady = [len(by_seed[s]) for s in seeds if s not in drifting]
    budget = max(steady) if steady else len(step_sizes("constant", cfg.lr, cfg.horizon))
    for s in drifting:
        if len(by_seed[s]) > budget:
            print(f"seed {s}: its R∞ flow drifts; its {len(by_seed[s])} steps to t = {cfg.horizon:g} are cut at {budget}, "
                  f"the longest other run, so it trains to t = {by_seed[s][:budget].sum():.4g}")
            by_seed[s] = by_seed[s][:budget]
    for s in seeds:
        if s in flows and (margin := stability_margin(by_seed[s], flows[s].times, flows[s].sharpness)) >= 2.0:
            times, sharp = flows[s].times, flows[s].sharpness
            print(f"WARNING: config key 'train.lr' = {cfg.lr:g} is unstable for seed {s}: lr·sharpness of its "
                  f"R∞ flow reaches {margin:.3g} ≥ 2 (sharpness {sharp.max():.3g} at t = {times[sharp.argmax()]:g}; "
                  f"stable below lr = {2 / sharp.max():.3g}, or use train.step_size_rule: flow_sharpness)")
    return [by_seed[s.seed] for s in specs]


def fit_prompt_length(cfg: TrainSettings, params, inputs, outputs, rule, runtime, flows) -> None:
    """Train every run of ``cfg`` at params['prompt_length'] and write its trajectories."""
    L, base_seed = int(params["prompt_length"]), int(params["seed"])
    task = regression_task(params["icl"])
    specs = run_specs(cfg.models, cfg.seeds, cfg.replicate_seeds)
    sizes = schedules(cfg, specs, flows)
    margins = {(s.model, s.seed, s.stream): stability_margin(lr, flows[s.seed].times, flows[s.seed].sharpness)
               for s, lr in zip(specs, sizes) if s.seed in flows}
    if margins:
        print(f"largest lr·sharpness along the runs' own flows: {max(margins.values()):.3f} (stable below 2)")
    device, dtype = resolve_device(runtime.device), dtype_of(cfg.dtype)
    test_frame = read_parquet(inputs["test_set"])
    test_set = load_test_set(test_frame, L, dtype=dtype, device=device)
    trainer = PromptLengthTrainer(task, specs, sizes, prompt_length=L, base_seed=base_seed, batch_size=cfg.batch_size,
                                  n_log=cfg.n_log, divergence_threshold=cfg.divergence_threshold, dtype=cfg.dtype,
                                  device=device)
    checkpoint = Path(params["checkpoint"])
    frame = trainer.run(test_set, checkpoint=checkpoint, checkpoint_every=runtime.checkpoint_every,
                        key_extra={"icl": params["icl"]}, fatal_divergence=cfg.fatal_divergence,
                        progress=functools.partial(progress, None, desc=f"{rule} L={L} ({len(specs)} runs)"))
    keys = zip(frame["model"], frame["seed"], frame["stream"])
    frame["stability_margin"] = [margins.get((m, int(s), int(j)), np.nan) for m, s, j in keys]  # max lr·λ of the run
    report_runs(frame, flows, runtime.status_rule, test_frame, L, task)
    write_parquet(frame, outputs["trajectories"],
                  provenance(rule, params, base_seed=base_seed, run_seeds=sorted({s.seed for s in specs}), runtime=runtime))
    checkpoint.unlink(missing_ok=True)  # the job is complete: its checkpoint is spent


def report_runs(frame: pd.DataFrame, flows: dict[int, Flow], rule: dict | None, test_frame, L: int, task) -> None:
    """One log line per run: where it ended and, with the summary's status rule, what the summary will call it."""
    runs = pd.DataFrame([{"model": m, "seed": s, "stream": j, "time": g["time"].iloc[-1], "step": g["step"].iloc[-1],
                          "final_test_loss": final_loss(g["time"], g["test_loss"]),
                          "readout": float(readout(g["u_y"].iloc[-1], g["norm_U_xx"].iloc[-1])),
                          "diverged": bool((g["status"] == "diverged").any())}
                         for (m, s, j), g in frame.groupby(["model", "seed", "stream"])])
    if rule is not None and flows:
        floor = float(linear_optimum_errors(task, load_test_set(test_frame, L), L).mean())  # R(Γ*), as the summary
        runs = pd.concat([g.join(judge(g, StatusRule(float(rule["trapped_loss_ratio"][m]), float(rule["trapped_readout_fraction"])),
                                       floor if m == "linear" else np.inf)) for m, g in runs.groupby("model")])
    for r in runs.itertuples():
        verdict = "diverged" if r.diverged else getattr(r, "status", "")
        if getattr(r, "trap_reason", None):
            verdict = f"counted as trapped ({r.trap_reason}: {r.final_test_loss / r.reference_loss:.2f} × the reference)"
        kind = f"; its flow {flows[r.seed].kind}" if r.seed in flows else ""
        print(f"{r.model:8s} seed={r.seed} stream={r.stream}: t={r.time:.4g} step {r.step} final test {r.final_test_loss:.5f}"
              f" {verdict}{kind}")


def train(inputs, outputs, params, rule="train", runtime=DEFAULT_RUNTIME):
    """Write results/<run>/train/L{L}.parquet: every R6 run at this L (checkpointed at params['checkpoint'])."""
    cfg = settings_from(TrainSettings, params["train"], "train")
    fit_prompt_length(cfg, params, inputs, outputs, rule, runtime,
                      load_flows(inputs["flows"], params["icl"]["noise_variance"]))


def train_transfer(inputs, outputs, params, rule="train_transfer", runtime=DEFAULT_RUNTIME):
    """Write results/<run>/transfer/L{L}.parquet: the R4 runs at this L, constant lr."""
    section = dict(params["transfer"], step_size_rule="constant", stability_fraction=1.0, divergence_threshold=1e4,
                   fatal_divergence=False, dtype="float64", decay_start=1.0, decay_end=1.0, final_lr=params["transfer"]["lr"])
    cfg = settings_from(TrainSettings, section, "transfer")
    fit_prompt_length(cfg, params, inputs, outputs, rule, runtime, {})
