"""Figure `training_vs_prompt_length` (R6, docs/experiments.md#training_vs_prompt_length): final test MSE
against L for softmax and linear attention, the theory over it, trapped runs and escape times. Draws only:
every number comes from results/<run>/summary/training_*.parquet and data/bayes_risk.parquet."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..parquet_io import read_parquet
from .style import REFERENCE_STYLE, apply_style, save_figure

COLORS = {"softmax": "tab:red", "linear": "tab:blue"}


def _band(ax, table, column, color, label):
    t = table[table[f"{column}_mean"].notna()].sort_values("prompt_length")
    ax.plot(t["prompt_length"], t[f"{column}_mean"], "o-", color=color, label=label, markersize=4)
    ax.fill_between(t["prompt_length"], t[f"{column}_lo"], t[f"{column}_hi"], color=color, alpha=0.2, linewidth=0)


def _runs(ax, runs, column, color):
    """ok runs as dots, trapped as open triangles, diverged as crosses at the top (never dropped)."""
    shared = runs[runs["stream"] == 0]
    ok = shared[shared["status"] == "ok"]
    ax.scatter(ok["prompt_length"], ok[column], s=9, color=color, alpha=0.5, linewidth=0)
    for reason, marker in (("no readout", "^"), ("drifting flow", "v")):
        trapped = shared[(shared["status"] == "trapped") & (shared["trap_reason"] == reason)]
        if len(trapped):
            ax.scatter(trapped["prompt_length"], trapped[column], s=30, marker=marker, facecolors="none", edgecolors=color,
                       label=f"trapped, {reason} ({len(trapped)} runs)")
    bad = shared[shared["status"] == "diverged"]
    if len(bad):
        ax.scatter(bad["prompt_length"], np.full(len(bad), ax.get_ylim()[1]), marker="x", s=40, color=color,
                   clip_on=False, label=f"diverged ({len(bad)} runs)")


def _loss_panel(ax, runs, table, bayes):
    for model, color in COLORS.items():
        t, r = table[table["model"] == model], runs[runs["model"] == model]
        if len(t):
            _band(ax, t, "final_test_loss", color, f"{model} attention (mean, 95% CI over ok seeds)")
            _runs(ax, r, "final_test_loss", color)
    ax.plot(bayes["prompt_length"], bayes["bayes_risk"], color="black", linewidth=1.2, label="Bayes (ridge) risk")
    lin = table[table["model"] == table["model"].iloc[0]].sort_values("prompt_length")
    ax.plot(lin["prompt_length"], lin["optimal_linear_attention_risk"], color="tab:blue", linestyle="--",
            linewidth=1.1, label=r"best linear attention $R(\Gamma^*)$")
    valid = lin[lin["softmax_theory_valid"]]
    ax.plot(valid["prompt_length"], valid["softmax_leading_order_risk"], color="tab:red", linestyle="--", linewidth=1.1,
            label=r"softmax optimum $\sigma^2 + f(\alpha^*)/L$ (leading order)")
    ax.axhline(float(table["noise_variance"].iloc[0]), label=r"noise floor $\sigma^2$", **REFERENCE_STYLE)
    ax.set_xscale("log")
    ax.set_yscale("log")
    shared = runs[runs["stream"] == 0]
    ax.set_ylim(0.8 * float(table["noise_variance"].iloc[0]), 1.3 * float(shared["final_test_loss"].max()))
    for (model, L), g in table.groupby(["model", "prompt_length"]):  # trapped / all seeds, per L, at the top
        ax.annotate(f"{int(g['n_trapped'].iloc[0])}/{int(g['n_seeds'].iloc[0])}", (L, ax.get_ylim()[1]), fontsize=6,
                    color=COLORS[model], ha="center", va="bottom", xytext=(0, 2 if model == "softmax" else 9),
                    textcoords="offset points", annotation_clip=False)
    ax.set_title("final test loss; numbers at the top: trapped / seeds per $L$\n(red: softmax, blue: linear)",
                 fontsize=8, pad=20)
    ax.set_xlabel("prompt length $L$")
    ax.set_ylabel("final test MSE")
    ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)


def _excess_panel(ax, runs, table):
    for model, color in COLORS.items():
        t, r = table[table["model"] == model], runs[(runs["model"] == model) & (runs["status"] == "ok")]
        if len(t):
            _band(ax, t, "scaled_excess_risk", color, f"{model} (ok runs)")
            _runs(ax, r, "scaled_excess_risk", color)
    lin = table[table["model"] == table["model"].iloc[0]].sort_values("prompt_length")
    ax.plot(lin["prompt_length"], lin["linear_theory_scaled_excess"], color="tab:blue", linestyle="--", linewidth=1.1,
            label=r"$L\,(R(\Gamma^*) - $Bayes$)$")
    valid = lin[lin["softmax_theory_valid"]]
    ax.plot(valid["prompt_length"], valid["softmax_theory_scaled_excess"], color="tab:red", linestyle="--",
            linewidth=1.1, label=r"$L\,(\sigma^2 + f(\alpha^*)/L - $Bayes$)$")
    ax.set_xscale("log")
    ok = runs[(runs["status"] == "ok") & (runs["stream"] == 0)]
    top = max(float(ok["scaled_excess_risk"].max()), float(lin["softmax_theory_scaled_excess"][lin["softmax_theory_valid"]].max()))
    ax.set_ylim(min(0.0, float(ok["scaled_excess_risk"].min())), 1.25 * top)
    ax.set_xlabel("prompt length $L$")
    ax.set_ylabel(r"$L\,\cdot$ (test MSE $-$ Bayes risk)")
    last = lin.iloc[-1]
    ax.set_title(f"flat in $L$ = excess risk $O(1/L)$\nat L = {int(last['prompt_length'])} softmax/linear excess: "
                 f"{last['excess_ratio_measured']:.2f} measured, {last['excess_ratio_predicted']:.2f} leading order", fontsize=8,
                 pad=20)
    ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)


def _escape_panel(ax, runs):
    shared = runs[(runs["stream"] == 0) & (runs["status"] != "diverged")]
    for model, color in COLORS.items():
        r = shared[shared["model"] == model]
        ax.scatter(r["prompt_length"] * (1.06 if model == "linear" else 0.94), r["escape_time"], s=14, color=color,
                   label=f"{model} run")
    flows = shared.drop_duplicates("seed")
    for _, f in flows.iterrows():
        ax.axhline(f["flow_escape_time"], color="black", linestyle=":", linewidth=0.9)
        ax.annotate(f"flow, seed {int(f['seed'])}", (shared["prompt_length"].max(), f["flow_escape_time"]), fontsize=6,
                    va="bottom", ha="right")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("prompt length $L$")
    ax.set_ylabel("escape time (R∞ below the plateau midpoint)")
    ax.set_title("escape from the initial plateau:\nruns vs their $L=\\infty$ flows", fontsize=8, pad=20)
    ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)


def plot_training_vs_prompt_length(inputs, outputs, params=None, rule="plot_training_vs_prompt_length"):
    apply_style()
    runs, table = read_parquet(inputs["runs"]), read_parquet(inputs["summary"])
    bayes = read_parquet(inputs["bayes_risk"]).sort_values("prompt_length")
    fig, axes = plt.subplots(1, 3, figsize=(16, 6.4))
    _loss_panel(axes[0], runs, table, bayes)
    _excess_panel(axes[1], runs, table)
    _escape_panel(axes[2], runs)
    fig.suptitle("R6: trained softmax attention approaches linear attention as the prompt grows", fontsize=11, y=0.995)
    fig.subplots_adjust(top=0.84, bottom=0.24, wspace=0.25)
    save_figure(fig, outputs["pdf"], outputs["png"])
