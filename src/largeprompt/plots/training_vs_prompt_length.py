"""Figure `training_vs_prompt_length` (R6, SPEC §3.2): final test MSE against L, softmax and linear, with the Bayes risk."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..parquet_io import read_parquet
from .style import THEORY_STYLE, apply_style, save_figure

COLORS = {"softmax": "tab:red", "linear": "tab:blue"}


def _band(ax, summary, column, color, label):
    s = summary[summary[f"{column}_mean"].notna()].sort_values("prompt_length")  # (L, model) with every seed diverged: none
    ax.plot(s["prompt_length"], s[f"{column}_mean"], "o-", color=color, label=label, markersize=4)
    ax.fill_between(s["prompt_length"], s[f"{column}_lo"], s[f"{column}_hi"], color=color, alpha=0.2, linewidth=0)


def _seeds(ax, runs, column, color):
    ok = runs[runs["status"] == "ok"]
    ax.scatter(ok["prompt_length"], ok[column], s=8, color=color, alpha=0.45, linewidth=0)


def _diverged(ax, runs, color, label):
    bad = runs[runs["status"] != "ok"]
    if len(bad):
        ymax = ax.get_ylim()[1]
        ax.scatter(bad["prompt_length"], np.full(len(bad), ymax), marker="x", s=40, color=color, clip_on=False,
                   label=f"{label}: diverged ({len(bad)} runs)")
        for _, r in bad.iterrows():
            ax.annotate(f"step {int(r['step'])}", (r["prompt_length"], ymax), fontsize=6, color=color,
                        xytext=(2, -8), textcoords="offset points")


def plot_training_vs_prompt_length(inputs, outputs, params, rule="plot_training_vs_prompt_length"):
    apply_style()
    data = read_parquet(inputs["summary"])
    bayes = read_parquet(inputs["bayes_risk"]).sort_values("prompt_length")
    runs, summary = data[data["kind"] == "run"], data[data["kind"] == "summary"]
    sigma2 = float(params["noise_variance"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))

    ax = axes[0]
    for model in ("softmax", "linear"):
        if (summary["model"] == model).any():
            _band(ax, summary[summary["model"] == model], "test_loss", COLORS[model], f"{model} attention (mean, 95% CI over seeds)")
            _seeds(ax, runs[runs["model"] == model], "test_loss", COLORS[model])
    ax.plot(bayes["prompt_length"], bayes["bayes_risk"], color="black", linewidth=1.4,
            label=r"Bayes risk (ridge, $\lambda = \sigma^2/\tau^2$), same test set")
    if "optimal_linear_attention_risk" in bayes:
        ax.plot(bayes["prompt_length"], bayes["optimal_linear_attention_risk"], color=COLORS["linear"], linestyle="--",
                linewidth=1.2, label=r"best linear attention $R(\Gamma^*)$, $\hat y = x_q^\top\Gamma^*\hat m$ (THEORY §F(v))")
    ax.axhline(sigma2, label=rf"noise floor $\sigma^2 = {sigma2:g}$", **THEORY_STYLE)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(5, bayes["prompt_length"].max() * 1.15)
    ok_runs = runs[runs["status"] == "ok"]
    top = max(1.2, 1.3 * float(ok_runs["test_loss"].max())) if len(ok_runs) else 2.0
    ax.set_ylim(0.8 * min(sigma2, float(bayes["bayes_risk"].min())), top)
    for model in ("softmax", "linear"):
        _diverged(ax, runs[runs["model"] == model], COLORS[model], model)
    ax.set_xlabel("prompt length $L$")
    ax.set_ylabel("final test MSE")
    ax.set_title("final test MSE against prompt length")
    ax.legend(fontsize=7.5)

    ax = axes[1]
    for model in ("softmax", "linear"):
        if (summary["model"] == model).any():
            _band(ax, summary[summary["model"] == model], "scaled_excess_risk", COLORS[model], model)
            _seeds(ax, runs[runs["model"] == model], "scaled_excess_risk", COLORS[model])
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlim(5, bayes["prompt_length"].max() * 1.15)
    scaled = ok_runs["scaled_excess_risk"]
    if len(scaled):
        ax.set_ylim(min(0.0, float(scaled.min())) - 0.1 * float(scaled.abs().max()), 1.3 * float(scaled.max()))
    for model in ("softmax", "linear"):
        _diverged(ax, runs[runs["model"] == model], COLORS[model], model)
    ax.set_xlabel("prompt length $L$")
    ax.set_ylabel(r"$L\,\cdot$(test MSE $-$ Bayes risk)")
    ax.set_title("excess risk scaled by $L$ (flat = $O(1/L)$)")
    ax.legend(fontsize=8)
    fig.suptitle("R6: trained softmax attention approaches linear attention and the Bayes risk as $L$ grows", fontsize=11)
    fig.tight_layout()
    save_figure(fig, outputs["pdf"], outputs["png"])
