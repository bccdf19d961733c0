"""Figure `beyond_gaussian` (R4, R6 beyond Gaussian covariates; docs/experiments.md#beyond_gaussian): per token measure,
the transfer slope, the final losses against L with each measure's references, softmax's R∞ along its flows, the
L = ∞ profile along the attention scale and the attention scale that training ends at, and the legend they share.
Draws only."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from largeprompt.io.parquet_io import read_parquet
from largeprompt.plots.style import REFERENCE_STYLE, apply_style, corrected_slope_text, figure, legend_below, save_figure, suptitle

COLORS = {"gaussian": "tab:blue", "rademacher": "tab:orange", "uniform": "tab:green"}
MARKERS = {"softmax": "o", "linear": "s"}
COUPLED_DODGE = 1.15  # the coupled distances are drawn at 1.15 L, beside the distances to the flow at L


def _slope_text(fit) -> str:
    if not np.isfinite(fit.get("slope", np.nan)):
        return "no slope (< 2 lengths above the floor)"
    ci = f"[{fit['slope_lo']:.2f}, {fit['slope_hi']:.2f}]" if np.isfinite(fit["slope_lo"]) else "(no CI)"
    return (f"slope {fit['slope']:.2f} {ci}, {int(fit['n_points_above_floor'])}/{int(fit['n_points'])} pts"
            + corrected_slope_text(fit))


def _transfer_panel(ax, gaps, slopes):
    soft = gaps[gaps["model"] == "softmax"]
    for measure, g in soft.groupby("token_measure", sort=False):
        fit = slopes[(slopes["token_measure"] == measure) & (slopes["model"] == "softmax")].iloc[0]
        ax.scatter(g["prompt_length"], g["sup_distance"], color=COLORS[measure], s=14,
                   label=f"{measure}: R4 {_slope_text(fit)}")
        floor = g.dropna(subset=["floor_threshold"]).drop_duplicates("prompt_length").sort_values("prompt_length")
        ax.plot(floor["prompt_length"], floor["floor_threshold"], color=COLORS[measure], linestyle=":", marker="v",
                markerfacecolor="none",
                linewidth=0.8)
        if np.isfinite(fit.get("slope", np.nan)):
            ax.plot([fit["fit_min_prompt_length"], fit["fit_max_prompt_length"]],
                    [fit["fit_gap_at_min"], fit["fit_gap_at_max"]], color=COLORS[measure], linewidth=1.3)
        if "coupled_distance" in g and g["coupled_distance"].notna().any():
            ax.scatter(g["prompt_length"] * COUPLED_DODGE, g["coupled_distance"], color=COLORS[measure], marker="x",
                       s=14, linewidths=0.8)
    ax.set(xscale="log", yscale="log", xlabel="prompt length $L$",
           ylabel=r"$\sup_{t\leq T}\|\theta_L(t)-\theta_\infty(t)\|$ (softmax)")
    drawn = "coupled_distance" in soft and soft["coupled_distance"].notna().any()
    coupled = f"×: to the coupled $L=\\infty$ SGD run, drawn at {COUPLED_DODGE:g} L; " if drawn else ""
    ax.set_title(f"R4: SGD at $L$ against its own limit (●: to the flow, line: its fit; {coupled}dotted ▽: floor × "
                 "factor; Thm 4.3: slope ≈ −1)")


def _loss_panel(ax, table):
    for (measure, model), g in table.groupby(["token_measure", "model"], sort=False):
        g = g.sort_values("prompt_length")
        style = dict(color=COLORS[measure], marker=MARKERS[model], linestyle="-" if model == "softmax" else "--")
        ax.errorbar(g["prompt_length"], g["final_test_loss_mean"],
                    yerr=[g["final_test_loss_mean"] - g["final_test_loss_lo"], g["final_test_loss_hi"] - g["final_test_loss_mean"]],
                    markersize=3, linewidth=1, capsize=2, **style)
        if model == "linear":
            ax.plot(g["prompt_length"], g["optimal_linear_attention_test_risk"], color=COLORS[measure], linestyle=":",
                    linewidth=1.2)
    refs = table.drop_duplicates("prompt_length").sort_values("prompt_length")
    ax.axhline(refs["softmax_infimum"].iloc[0], label=r"$\sigma^2$: softmax's $L=\infty$ optimum / infimum (all three)",
               **REFERENCE_STYLE)
    ax.set(xscale="log", yscale="log", xlabel="prompt length $L$", ylabel="final test MSE (mean, 95% CI over ok runs)")
    counts = ", ".join(f"{m[:3]}/{mo[:3]} {int(r.n_ok.min())}–{int(r.n_ok.max())}"
                       for (m, mo), r in table.groupby(["token_measure", "model"], sort=False))
    ax.set_title(f"R6 per measure (dotted: each measure's $R(\\Gamma^*)$); ok runs per L: {counts}")


def _flow_panel(ax, flows, noise_variance):
    soft = flows[(flows["model"] == "softmax") & (flows["time"] > 0)]
    for (measure, _), f in soft.groupby(["token_measure", "seed"], sort=False):
        ax.plot(f["time"], f["infinite_prompt_risk"] - noise_variance, color=COLORS[measure], linewidth=0.8,
                alpha=0.6 if f["flow_class"].iloc[0] == "converges" else 0.25,
                linestyle="-" if f["flow_class"].iloc[0] == "converges" else "--")
    ax.set(xscale="log", yscale="log", xlabel="time $t$", ylabel=r"$R_\infty(\theta_\infty(t))-\sigma^2$ (softmax)")
    ax.set_title("softmax's $R_\\infty$ along each seed's flow (solid: converges; dashed: drifts)")


def _profile_panel(ax, profiles, optima):
    for measure, p in profiles.groupby("token_measure", sort=False):
        attained = bool(optima.set_index("token_measure").loc[measure, "attained"])
        ax.plot(p["attention_scale"], p["profile_risk"], color=COLORS[measure],
                label=f"{measure}: $L=\\infty$ reaches $\\sigma^2$ {'at every c' if attained else 'only as c → 0'}")
    ax.set(xscale="log", xlabel="attention scale $c$ ($A=cI$)", ylabel=r"$\min_v R_\infty(v, cI)$ at $L=\infty$")
    ax.set_title("what the limit predicts: the best softmax risk along the attention scale")


def _scale_panel(ax, table, optima):
    soft, flow_end = table[table["model"] == "softmax"], optima.set_index("token_measure")["flow_end_attention_scale"]
    for measure, g in soft.groupby("token_measure", sort=False):
        g = g.sort_values("prompt_length")
        ax.errorbar(g["prompt_length"], g["attention_scale_mean"],
                    yerr=[g["attention_scale_mean"] - g["attention_scale_lo"], g["attention_scale_hi"] - g["attention_scale_mean"]],
                    color=COLORS[measure], marker="o", markersize=3, capsize=2, linewidth=1)
        end = flow_end.get(measure, np.nan)
        if np.isfinite(end):
            ax.axhline(end, color=COLORS[measure], linestyle=":", linewidth=1)
    ax.set(xscale="log", xlabel="prompt length $L$", ylabel=r"$\|U_{xx}\|$ at the end (ok softmax runs)")
    ax.set_title("attention scale at the end of training (dotted: median of the converging $L=\\infty$ flows at $T$)")


def _key(fig, transfer_ax, loss_ax, profile_ax) -> None:
    """One legend under the panels: the colours (token measures, with their R4 slope and what their limit reaches),
    the models' marks in the R6 panels and σ²."""
    reach = dict(label.split(": ", 1) for label in profile_ax.get_legend_handles_labels()[1])  # measure → what it reaches
    handles, labels = transfer_ax.get_legend_handles_labels()
    labels = [f"{label}; {reach[label.split(': ', 1)[0]]}" if label.split(": ", 1)[0] in reach else label for label in labels]
    for model, marker in MARKERS.items():
        handles.append(Line2D([], [], color="black", marker=marker, markersize=3, linewidth=1,
                              linestyle="-" if model == "softmax" else "--"))
        labels.append(f"{model} attention (R6 panels)")
    sigma_handles, sigma_labels = loss_ax.get_legend_handles_labels()
    legend_below(fig, handles + sigma_handles, labels + sigma_labels)


def plot_beyond_gaussian(inputs, outputs, params, rule="plot_beyond_gaussian"):
    """Write figures/<run>/beyond_gaussian.{pdf,png}: three panels above, two below, their legend under them."""
    apply_style()
    table, gaps, slopes = (read_parquet(inputs[k]) for k in ("prompt_lengths", "gaps", "slopes"))
    optima, profiles = read_parquet(inputs["optima"]), read_parquet(inputs["scale_profiles"])
    flows = pd.concat([read_parquet(p) for p in inputs["flows"]], ignore_index=True)
    fig = figure("text", 6.6)
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.2, 1])  # own layouts: two wider panels below three
    upper, lower = top.subplots(1, 3), bottom.subplots(1, 2)
    _transfer_panel(upper[0], gaps, slopes)
    _loss_panel(upper[1], table)
    _scale_panel(upper[2], table, optima)
    _flow_panel(lower[0], flows, float(table["softmax_infimum"].iloc[0]))
    _profile_panel(lower[1], profiles, optima)
    _key(fig, upper[0], upper[1], lower[1])
    suptitle(fig, "Beyond Gaussian covariates: softmax's limit is not linear attention, and training still transfers",
             params.get("run"))
    save_figure(fig, outputs["pdf"], outputs["png"])
