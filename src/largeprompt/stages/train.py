"""Stage 2, training at each prompt length: one (model, L, seed) run per job (SPEC §3.1 stage 2, §5)."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pandas as pd

from ..parquet_io import read_parquet, write_parquet
from ..provenance import provenance
from ..rates import t_interval
from ..runlog import progress, resolve_device
from ..training import RunConfig, train_run
from .icl_data import load_test_set, regression_task


def run_config(params: dict) -> RunConfig:
    """The RunConfig of a job from its rule params (config sections ``train`` and ``seed``)."""
    train = params["train"]
    return RunConfig(
        model=params["model"],
        prompt_length=int(params["prompt_length"]),
        run_seed=int(params["run_seed"]),
        base_seed=int(params["seed"]),
        steps=int(train["steps"]),
        batch_size=int(train["batch_size"]),
        lr=float(train["lr"]),
        log_every=int(train["log_every"]),
        divergence_threshold=float(train["divergence_threshold"]),
        dtype=train["dtype"],
        task=json.dumps(params["icl"], sort_keys=True),
    )


def train(inputs, outputs, params, rule="train"):
    """Write results/train/{model}/L{L}/seed{seed}.parquet; checkpoint at params['checkpoint'] meanwhile."""
    cfg = run_config(params)
    task = regression_task(params["icl"])
    test_set = load_test_set(read_parquet(inputs["test_set"]), cfg.prompt_length)
    frame = train_run(
        task, cfg, test_set,
        checkpoint_path=params["checkpoint"],
        checkpoint_every=int(params["train"]["checkpoint_every"]),
        fatal_divergence=bool(params["train"]["fatal_divergence"]),
        device=resolve_device(params.get("device", "cpu")),
        progress=functools.partial(progress, desc=f"{cfg.model} L={cfg.prompt_length} seed={cfg.run_seed}"),
    )
    frame.insert(0, "model", cfg.model)
    frame.insert(1, "prompt_length", cfg.prompt_length)
    frame.insert(2, "seed", cfg.run_seed)
    last = frame.iloc[-1]
    print(f"final: step {last['step']}, test_loss {last['test_loss']:.5f}, R_inf {last['infinite_prompt_risk']:.5f}, status {last['status']}")
    write_parquet(frame, outputs["trajectory"], provenance(rule, params, seed=cfg.run_seed))
    Path(params["checkpoint"]).unlink(missing_ok=True)  # the run is complete: its checkpoint is spent


TAIL_FRACTION = 0.1


def summarize_training(inputs, outputs, params, rule="summarize_training"):
    """Write results/train/summary.parquet: the final losses of every run (``kind`` = run; the mean of the rows logged
    in the last tenth of training, or the diverged row) and, per (model, L),
    the mean and 95% t-interval over the seeds that did not diverge (``kind`` = summary) of the final test
    MSE, of the excess over the Bayes risk at that L (same test set) and of L·excess."""
    bayes = read_parquet(inputs["bayes_risk"]).set_index("prompt_length")["bayes_risk"]
    finals = []
    for path in inputs["runs"]:
        run = read_parquet(path, columns=["model", "prompt_length", "seed", "step", "time", "train_loss", "test_loss",
                                          "infinite_prompt_risk", "status"])
        final = run.iloc[-1].copy()
        if final["status"] == "ok":  # average the evaluations over the last tenth of training (SGD oscillates)
            tail = run[run["step"] >= (1.0 - TAIL_FRACTION) * final["step"]]
            for col in ("train_loss", "test_loss", "infinite_prompt_risk"):
                final[col] = tail[col].mean()
        finals.append(final)
    runs = pd.DataFrame(finals).reset_index(drop=True)
    runs["kind"] = "run"
    runs["bayes_risk"] = runs["prompt_length"].map(bayes)
    runs["excess_risk"] = runs["test_loss"] - runs["bayes_risk"]
    runs["scaled_excess_risk"] = runs["prompt_length"] * runs["excess_risk"]
    rows = []
    for (model, L), g in runs.groupby(["model", "prompt_length"]):
        ok = g[g["status"] == "ok"]
        row = {"kind": "summary", "model": model, "prompt_length": int(L), "n_seeds": len(g), "n_diverged": int((g["status"] != "ok").sum()),
               "bayes_risk": float(bayes[L])}
        for col in ("test_loss", "excess_risk", "scaled_excess_risk", "infinite_prompt_risk"):
            row[f"{col}_mean"], row[f"{col}_lo"], row[f"{col}_hi"] = t_interval(ok[col])
        rows.append(row)
        print(f"{model:8s} L={L:5d}: test MSE {row['test_loss_mean']:.4f} [{row['test_loss_lo']:.4f}, {row['test_loss_hi']:.4f}]"
              f"  Bayes {row['bayes_risk']:.4f}  diverged {row['n_diverged']}/{row['n_seeds']}")
    frame = pd.concat([runs, pd.DataFrame(rows)], ignore_index=True)
    write_parquet(frame, outputs["summary"], provenance(rule, params, seed=None))
