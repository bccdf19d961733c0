"""The R6 results table: one row per run with its status, and one row per (model, L) with the seed
statistics, the convergence check and the theory (docs/experiments.md#training_vs_prompt_length,
docs/experiments.md#trapped-runs).

A run is ``diverged`` if training stopped on a blown-up batch loss. It is ``trapped`` if its flow escapes
the initial plateau (R∞ of the flow ends below half its start) while the run stops where the flow goes on
(docs/experiments.md#trapped-runs), for one of two reasons, recorded in ``trap_reason``:

* ``no readout``: its readout strength |u_y|·‖U_xx‖ (the size of the map that carries the prompt's labels
  to the prediction) ends below trapped_readout_fraction times the flow's: it never left the plateau;
* ``drifting flow``: the flow has not converged: its sharpness at T exceeds drift_sharpness_ratio times its
  sharpness at T/2, its weights drift without bound along a valley of R∞, where the finite-L risk grows with
  the weights, so finite-L training settles at a worse equilibrium instead.

Otherwise it is ``ok``. An escape time is
the first logged time at which R∞ falls below the midpoint between the flow's start and end risks.
Means and intervals are over the ``ok`` runs of the shared batch stream; replicate runs (another batch
stream, same seed) give the SGD-noise part of the spread.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..icl import regression_task, valley_optimum
from ..parquet_io import read_parquet, write_parquet
from ..pipeline import settings_from
from ..provenance import provenance
from ..rates import t_interval

FINAL_FRACTION = 0.1  # the final loss averages the rows logged in the last tenth of the horizon
SOFTMAX_EXPANSION_MIN_PROMPT_LENGTH = 200  # the softmax leading-order optimum is drawn from here on (an L → ∞ expansion)


@dataclass(frozen=True)
class SummarySettings:
    trapped_readout_fraction: float
    drift_sharpness_ratio: float
    convergence_window: float


def flow_reference(flow: pd.DataFrame) -> dict:
    """What the trapped rule and the escape times read from one seed's flow."""
    flow = flow.sort_values("time")
    start, end = float(flow["infinite_prompt_risk"].iloc[0]), float(flow["infinite_prompt_risk"].iloc[-1])
    threshold = 0.5 * (start + end)
    half = flow[flow["time"] <= 0.5 * flow["time"].iloc[-1]].iloc[-1]
    return {"escapes": end < 0.5 * start, "threshold": threshold, "readout": readout(flow.iloc[-1]),
            "u_y": float(flow["u_y"].iloc[-1]), "escape_time": escape_time(flow, threshold),
            "drift": float(flow["sharpness"].iloc[-1] / half["sharpness"])}


def readout(row) -> float:
    """|u_y|·‖U_xx‖: how strongly the prediction reads the prompt's labels (0 on the plateau's saddle)."""
    return abs(float(row["u_y"])) * float(row["norm_U_xx"])


def escape_time(rows: pd.DataFrame, threshold: float) -> float:
    below = rows[rows["infinite_prompt_risk"] < threshold]
    return float(below["time"].iloc[0]) if len(below) else float("nan")


def run_row(run: pd.DataFrame, ref: dict, cfg: SummarySettings) -> dict:
    """Final losses, status and escape time of one run."""
    run = run.sort_values("step")
    last = run.iloc[-1]
    row = {k: last[k] for k in ("model", "prompt_length", "seed", "stream", "step", "time", "u_y", "stability_margin")}
    row["readout"] = readout(last)
    if (run["status"] == "diverged").any():
        row.update(status="diverged", trap_reason="", final_test_loss=float(last["test_loss"]),
                   final_infinite_prompt_risk=float(last["infinite_prompt_risk"]))
    else:
        tail = run[run["time"] >= (1 - FINAL_FRACTION) * last["time"]]
        reason = trap_reason(row["readout"], ref, cfg)
        row.update(status="trapped" if reason else "ok", trap_reason=reason, final_test_loss=float(tail["test_loss"].mean()),
                   final_infinite_prompt_risk=float(tail["infinite_prompt_risk"].mean()))
    row.update(escape_time=escape_time(run, ref["threshold"]), flow_escape_time=ref["escape_time"],
               flow_readout=ref["readout"], flow_sharpness_growth=ref["drift"])
    return row


def trap_reason(run_readout: float, ref: dict, cfg: SummarySettings) -> str:
    """'' (not trapped), 'no readout' or 'drifting flow' (module docstring); only where the flow escapes."""
    if not ref["escapes"]:
        return ""
    if run_readout < cfg.trapped_readout_fraction * ref["readout"]:
        return "no readout"
    return "drifting flow" if ref["drift"] > cfg.drift_sharpness_ratio else ""


def seed_mean_change(trajectories: pd.DataFrame, ok: pd.DataFrame, window: float) -> float:
    """|m(end) − m(start of the window)| / m(end), m = seed-mean test loss of the ok shared-stream runs, each end
    averaged over a twentieth of the horizon (docs/experiments.md#training-protocol)."""
    keep = trajectories.merge(ok[["seed", "stream"]], on=["seed", "stream"])
    if keep.empty:
        return float("nan")
    horizon = keep["time"].max()
    width = horizon / 20

    def level(t0):
        rows = keep[(keep["time"] >= t0) & (keep["time"] <= t0 + width)]
        return rows.groupby("seed")["test_loss"].mean().mean()

    end, start = level(horizon - width), level((1 - window) * horizon)
    return float(abs(end - start) / end)


def prompt_length_row(runs: pd.DataFrame, trajectories: pd.DataFrame, bayes: pd.Series, theory: dict,
                      cfg: SummarySettings) -> dict:
    """Seed statistics of one (model, L), over the ok runs of the shared stream."""
    shared = runs[runs["stream"] == 0]
    ok = shared[shared["status"] == "ok"]
    model, L = runs["model"].iloc[0], int(runs["prompt_length"].iloc[0])
    row = {"model": model, "prompt_length": L, "n_seeds": len(shared), "n_ok": len(ok),
           "n_trapped": int((shared["status"] == "trapped").sum()), "n_diverged": int((shared["status"] == "diverged").sum()),
           "bayes_risk": float(bayes["bayes_risk"]), "noise_variance": theory["noise_variance"]}
    for col in ("final_test_loss", "excess_risk", "scaled_excess_risk"):
        row[f"{col}_mean"], row[f"{col}_lo"], row[f"{col}_hi"] = t_interval(ok[col])
    median = ok["final_test_loss"].median()
    row["final_test_loss_median"] = median
    row["max_deviation_from_median"] = float((ok["final_test_loss"] / median - 1).abs().max()) if len(ok) else np.nan
    row["seed_mean_change"] = seed_mean_change(trajectories, ok, cfg.convergence_window)
    row["converged"] = bool(row["seed_mean_change"] < 0.01)
    replicas = runs[runs["stream"] > 0].merge(ok[["seed", "final_test_loss"]], on="seed", suffixes=("", "_shared"))
    row["sgd_noise_spread"] = float((replicas["final_test_loss"] - replicas["final_test_loss_shared"]).abs().max()) \
        if len(replicas) else np.nan
    row["max_stability_margin"] = float(runs["stability_margin"].max())
    row.update(theory_columns(L, bayes, theory))
    row["excess_over_noise_mean"] = row["final_test_loss_mean"] - theory["noise_variance"]
    return row


def theory_columns(L: int, bayes: pd.Series, theory: dict) -> dict:
    """The linear optimum R(Γ*) and the softmax leading-order optimum σ² + f(α*)/L, in population and on the
    test set (docs/theory.md#linear-attention-optimum, docs/theory.md#softmax-finite-prompt-optimum).

    On the test set, R(Γ*) is the Γ* predictor's MSE on the same prompts; the softmax value adds the
    population difference σ² + f(α*)/L − R(Γ*) to it, so that both theory excesses over the test-set Bayes
    risk carry the same test-set noise as the measured ones.
    """
    population, test = float(bayes["optimal_linear_attention_risk"]), float(bayes["optimal_linear_attention_test_risk"])
    softmax = theory["noise_variance"] + theory["valley_correction"] / L
    b = float(bayes["bayes_risk"])
    return {"optimal_linear_attention_risk": population, "optimal_linear_attention_test_risk": test,
            "softmax_leading_order_risk": softmax, "softmax_leading_order_test_risk": test + softmax - population,
            "softmax_theory_valid": L >= SOFTMAX_EXPANSION_MIN_PROMPT_LENGTH,
            "linear_theory_scaled_excess": L * (test - b), "softmax_theory_scaled_excess": L * (test + softmax - population - b),
            "predicted_excess_ratio": (softmax - theory["noise_variance"]) / (population - theory["noise_variance"])}


def excess_ratios(table: pd.DataFrame) -> pd.DataFrame:
    """Per L, softmax's excess over the Bayes risk divided by linear's: measured (means over ok runs) and
    predicted (the leading-order optima, docs/theory.md#softmax-finite-prompt-optimum)."""
    wide = table.pivot(index="prompt_length", columns="model")
    if not {"softmax", "linear"} <= set(table["model"]):
        return table.assign(excess_ratio_measured=np.nan, excess_ratio_predicted=np.nan)
    measured = wide["scaled_excess_risk_mean"]["softmax"] / wide["scaled_excess_risk_mean"]["linear"]
    predicted = wide["softmax_theory_scaled_excess"]["softmax"] / wide["linear_theory_scaled_excess"]["softmax"]
    return table.assign(excess_ratio_measured=table["prompt_length"].map(measured),
                        excess_ratio_predicted=table["prompt_length"].map(predicted))


def summarize_training(inputs, outputs, params, rule="summarize_training"):
    """Write results/<run>/summary/training_runs.parquet (one row per run) and training_prompt_lengths.parquet."""
    cfg = settings_from(SummarySettings, params["train"], "train")
    icl = params["icl"]
    task = regression_task(icl)
    bayes = read_parquet(inputs["bayes_risk"]).set_index("prompt_length")
    flows = {int(f["seed"].iloc[0]): flow_reference(f) for f in map(read_parquet, inputs["flows"])}
    trajectories = pd.concat([read_parquet(p) for p in inputs["trajectories"]], ignore_index=True)
    runs = pd.DataFrame([run_row(g, flows[int(seed)], cfg)
                         for (_, _, seed, _), g in trajectories.groupby(["model", "prompt_length", "seed", "stream"])])
    runs["bayes_risk"] = runs["prompt_length"].map(bayes["bayes_risk"])
    runs["excess_risk"] = runs["final_test_loss"] - runs["bayes_risk"]
    runs["scaled_excess_risk"] = runs["prompt_length"] * runs["excess_risk"]
    alpha, f_min = valley_optimum(task.covariance.numpy(), task.task_variance, task.noise_variance)
    theory = {"noise_variance": task.noise_variance, "valley_correction": f_min, "valley_scale": alpha}
    rows = [prompt_length_row(g, trajectories[(trajectories["model"] == m) & (trajectories["prompt_length"] == L)],
                              bayes.loc[L], theory, cfg) for (m, L), g in runs.groupby(["model", "prompt_length"])]
    table = excess_ratios(pd.DataFrame(rows).assign(valley_scale=alpha, valley_correction=f_min))
    for r in rows:
        print(f"{r['model']:8s} L={r['prompt_length']:5d}: test {r['final_test_loss_mean']:.4f} "
              f"[{r['final_test_loss_lo']:.4f}, {r['final_test_loss_hi']:.4f}] median {r['final_test_loss_median']:.4f} "
              f"ok {r['n_ok']}/{r['n_seeds']} trapped {r['n_trapped']} diverged {r['n_diverged']} "
              f"change {r['seed_mean_change']:.4f} R(Γ*) test {r['optimal_linear_attention_test_risk']:.4f}")
    prov = provenance(rule, params, run_seeds=sorted(runs["seed"].unique()))
    write_parquet(runs, outputs["runs"], prov)
    write_parquet(table, outputs["prompt_lengths"], prov)
