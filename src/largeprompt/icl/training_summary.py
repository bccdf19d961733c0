"""The R6 results tables (docs/experiments.md#training_vs_prompt_length, docs/experiments.md#run-status): one row per
run with its status, and one row per (model, L) with the statistics of the ok runs, their modes, the convergence
check and the theory.

A run's status follows from its outcome (:mod:`largeprompt.icl.engine.status`); the class of the R∞ flow from its
initial weights (:mod:`largeprompt.icl.flow_class`) is recorded beside it as the explanation. Means and intervals
are over the ``ok`` runs of the shared batch stream; replicate runs (another batch stream, same seed) give the
SGD-noise part of the spread.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from largeprompt.icl.engine.status import CHANGE_WINDOW, TRAP_REASONS, judge, readout, run_outcome, split_modes, status_counts, status_rule
from largeprompt.icl.flow_class import classify_flow, escape_time, plateau_threshold
from largeprompt.icl.risks import valley_optimum
from largeprompt.icl.sgd_excess import sgd_excess_columns
from largeprompt.maths.rates import t_interval

SOFTMAX_EXPANSION_MIN_PROMPT_LENGTH = 200  # the softmax leading-order optimum is drawn from here on (an L → ∞ expansion)


@dataclass(frozen=True)
class SummarySettings:
    trapped_loss_ratio: dict  # model → ratio
    trapped_readout_fraction: float
    convergence_window: float
    mode_gap_factor: float
    unconverged_change: float


def flow_row(flow: pd.DataFrame, noise_variance: float) -> dict:
    """What the summary reads from one seed's flow: its class, escape and final readout, and its sharpness growth."""
    flow = flow.sort_values("time")
    kind, escape = classify_flow(flow["time"], flow["infinite_prompt_risk"], flow["readout_determinant"], noise_variance)
    half = flow[flow["time"] <= 0.5 * flow["time"].iloc[-1]].iloc[-1]
    last = flow.iloc[-1]
    return {"seed": int(last["seed"]), "flow_class": kind, "flow_escape_time": escape,
            "flow_start_risk": float(flow["infinite_prompt_risk"].iloc[0]),
            "flow_readout": float(readout(last["u_y"], last["norm_U_xx"])),
            "flow_sharpness_growth": float(last["sharpness"] / half["sharpness"])}


def run_row(run: pd.DataFrame, plateau: float, window: float = CHANGE_WINDOW) -> dict:
    """Final values, end change over ``window`` and escape time of one run (its trajectory rows)."""
    row = run_outcome(run, ("model", "prompt_length", "seed", "stream", "step", "time", "u_y", "stability_margin"), window)
    run = run.sort_values("step")
    row["escape_time"] = escape_time(run["time"], run["infinite_prompt_risk"], plateau)
    return row


def judge_prompt_length(runs: pd.DataFrame, cfg: SummarySettings, linear_optimum: float) -> pd.DataFrame:
    """``runs`` of one L with status, trap_reason and reference_loss, judged per model (module docstring)."""
    parts = []
    for model, g in runs.groupby("model"):
        floor = linear_optimum if model == "linear" else np.inf
        parts.append(g.join(judge(g, status_rule(vars(cfg), model), floor)))
    return pd.concat(parts)


def trap_counts(shared: pd.DataFrame) -> dict:
    """Per trap reason (status.TRAP_REASONS), the trapped runs of ``shared`` and how many of them start on a drifting
    R∞ flow: ``n_trapped_no_readout``, ``n_trapped_no_readout_drifting``, …"""
    out = {}
    for reason in TRAP_REASONS:
        trapped = shared[(shared["status"] == "trapped") & (shared["trap_reason"] == reason)]
        key = "n_trapped_" + reason.replace(" ", "_")
        out[key], out[key + "_drifting"] = len(trapped), int((trapped["flow_class"] == "drifts").sum())
    return out


def seed_mean_change(trajectories: pd.DataFrame, ok: pd.DataFrame, window: float) -> float:
    """|m(end) − m(start of the window)| / m(end), m = seed-mean test loss of the ok shared-stream runs that reached
    the full horizon, each end averaged over a twentieth of the horizon (docs/experiments.md#training-protocol)."""
    keep = trajectories.merge(ok[["seed", "stream"]], on=["seed", "stream"])
    horizon = trajectories["time"].max()
    full = keep.groupby("seed")["time"].transform("max") >= horizon * (1 - 1e-9)
    keep = keep[full]
    if keep.empty:
        return float("nan")
    width = horizon / 20

    def level(t0):
        rows = keep[(keep["time"] >= t0) & (keep["time"] <= t0 + width)]
        return rows.groupby("seed")["test_loss"].mean().mean()

    end, start = level(horizon - width), level((1 - window) * horizon)
    return float(abs(end - start) / end)


def prompt_length_row(runs: pd.DataFrame, trajectories: pd.DataFrame, bayes: pd.Series, theory: dict,
                      cfg: SummarySettings, level: float = 0.95) -> dict:
    """Seed statistics of one (model, L), over the ok runs of the shared stream."""
    shared = runs[runs["stream"] == 0]
    ok = shared[shared["status"] == "ok"]
    model, L = runs["model"].iloc[0], int(runs["prompt_length"].iloc[0])
    row = {"model": model, "prompt_length": L, "n_seeds": len(shared), **status_counts(shared),
           "n_drifting_flows": int((shared["flow_class"] == "drifts").sum()),
           **trap_counts(shared),
           "bayes_risk": float(bayes["bayes_risk"]), "noise_variance": theory["noise_variance"]}
    for col in ("final_test_loss", "excess_risk", "scaled_excess_risk"):
        row[f"{col}_mean"], row[f"{col}_lo"], row[f"{col}_hi"] = t_interval(ok[col], level)
    row["ci_half_width_fraction"] = (row["final_test_loss_hi"] - row["final_test_loss_mean"]) / row["final_test_loss_mean"]
    median = ok["final_test_loss"].median()
    row["final_test_loss_median"] = median
    row["max_deviation_from_median"] = float((ok["final_test_loss"] / median - 1).abs().max()) if len(ok) else np.nan
    modes = split_modes(ok["final_test_loss"], cfg.mode_gap_factor)
    row.update(n_modes=modes.n_modes, lower_mode_mean=modes.lower_mean, lower_mode_runs=modes.lower_runs,
               upper_mode_mean=modes.upper_mean, upper_mode_runs=modes.upper_runs)
    row["seed_mean_change"] = seed_mean_change(trajectories, ok, cfg.convergence_window)
    row["converged"] = bool(row["seed_mean_change"] < 0.01)
    replicas = runs[runs["stream"] > 0].merge(ok[["seed", "final_test_loss"]], on="seed", suffixes=("", "_shared"))
    row["sgd_noise_spread"] = float((replicas["final_test_loss"] - replicas["final_test_loss_shared"]).abs().max()) \
        if len(replicas) else np.nan
    row["max_stability_margin"] = float(runs["stability_margin"].max())
    row.update(theory_columns(L, bayes, theory))
    predicted = row[f"{model}_theory_scaled_excess"]
    for end in ("mean", "lo", "hi"):  # measured L·excess over its leading-order prediction, with the interval
        row[f"scaled_excess_over_theory_{end}"] = row[f"scaled_excess_risk_{end}"] / predicted
    row["excess_over_noise_mean"] = row["final_test_loss_mean"] - theory["noise_variance"]
    row.update(sgd_excess_columns(ok))
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
            "n_test_prompts": int(bayes["n_test_prompts"]),
            "softmax_leading_order_risk": softmax, "softmax_leading_order_test_risk": test + softmax - population,
            "softmax_theory_valid": L >= SOFTMAX_EXPANSION_MIN_PROMPT_LENGTH,
            "linear_theory_scaled_excess": L * (test - b), "softmax_theory_scaled_excess": L * (test + softmax - population - b),
            "predicted_excess_ratio": (softmax - theory["noise_variance"]) / (population - theory["noise_variance"])}


def excess_ratios(table: pd.DataFrame) -> pd.DataFrame:
    """Per L, softmax's excess over the Bayes risk divided by linear's: measured (means over ok runs) and
    predicted (the leading-order optima, docs/theory.md#softmax-finite-prompt-optimum)."""
    if not {"softmax", "linear"} <= set(table["model"]):
        return table.assign(excess_ratio_measured=np.nan, excess_ratio_predicted=np.nan)
    wide = table.pivot(index="prompt_length", columns="model")
    measured = wide["scaled_excess_risk_mean"]["softmax"] / wide["scaled_excess_risk_mean"]["linear"]
    predicted = wide["softmax_theory_scaled_excess"]["softmax"] / wide["linear_theory_scaled_excess"]["softmax"]
    return table.assign(excess_ratio_measured=table["prompt_length"].map(measured),
                        excess_ratio_predicted=table["prompt_length"].map(predicted))


def run_table(trajectories: pd.DataFrame, flows: pd.DataFrame, bayes: pd.DataFrame, cfg: SummarySettings,
              noise_variance: float) -> pd.DataFrame:
    """One row per run: final values, status (judged per (model, L)) and its flow's class."""
    plateau = {int(f.seed): plateau_threshold(f.flow_start_risk, noise_variance) for f in flows.itertuples()}
    runs = pd.DataFrame([run_row(g, plateau[int(seed)], cfg.convergence_window)
                         for (_, _, seed, _), g in trajectories.groupby(["model", "prompt_length", "seed", "stream"])])
    runs = pd.concat([judge_prompt_length(g, cfg, float(bayes.loc[L, "optimal_linear_attention_test_risk"]))
                      for L, g in runs.groupby("prompt_length")]).sort_index()
    runs = runs.merge(flows.drop(columns="flow_start_risk"), on="seed", how="left")
    runs["escape_time_ratio"] = runs["escape_time"] / runs["flow_escape_time"]  # the run's escape against its flow's
    runs["bayes_risk"] = runs["prompt_length"].map(bayes["bayes_risk"])
    runs["excess_risk"] = runs["final_test_loss"] - runs["bayes_risk"]
    runs["scaled_excess_risk"] = runs["prompt_length"] * runs["excess_risk"]
    return runs


def theory_of(task) -> dict:
    """σ² and softmax's leading-order valley optimum (α*, f(α*)) of ``task`` (docs/theory.md#softmax-finite-prompt-optimum);
    NaN for non-Gaussian covariates, for which it is not derived."""
    alpha, f_min = np.nan, np.nan
    if task.token_measure == "gaussian":
        alpha, f_min = valley_optimum(task.covariance.numpy(), task.task_variance, task.noise_variance)
    return {"noise_variance": task.noise_variance, "valley_correction": f_min, "valley_scale": alpha}


def prompt_length_table(runs: pd.DataFrame, trajectories: pd.DataFrame, bayes: pd.DataFrame, theory: dict,
                        cfg: SummarySettings) -> pd.DataFrame:
    """One row per (model, L) of ``runs`` (:func:`run_table`): :func:`prompt_length_row` with the excess ratios."""
    rows = [prompt_length_row(g, trajectories[(trajectories["model"] == m) & (trajectories["prompt_length"] == L)],
                              bayes.loc[L], theory, cfg) for (m, L), g in runs.groupby(["model", "prompt_length"])]
    return excess_ratios(pd.DataFrame(rows).assign(valley_scale=theory["valley_scale"],
                                                   valley_correction=theory["valley_correction"]))


def summary_line(r) -> str:
    """One (model, L) row of :func:`prompt_length_table` as a line of the job's log."""
    modes = f" modes {r.lower_mode_mean:.4f} ({r.lower_mode_runs}) | {r.upper_mode_mean:.4f} ({r.upper_mode_runs})" \
        if r.n_modes == 2 else ""
    return (f"{r.model:8s} L={r.prompt_length:5d}: test {r.final_test_loss_mean:.4f} "
            f"[{r.final_test_loss_lo:.4f}, {r.final_test_loss_hi:.4f}] (±{100 * r.ci_half_width_fraction:.1f}%) "
            f"ok {r.n_ok}/{r.n_seeds} unconverged {r.n_unconverged} trapped {r.n_trapped} diverged {r.n_diverged}{modes} "
            f"change {r.seed_mean_change:.4f} R(Γ*) test {r.optimal_linear_attention_test_risk:.4f}")
