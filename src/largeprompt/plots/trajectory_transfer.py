"""Figure `trajectory_transfer` (R4, SPEC §3.2): finite-L training against the infinite-prompt flow from the same start."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ..parquet_io import read_parquet
from .style import THEORY_STYLE, apply_style, save_figure

EXPERIMENTS = {
    "reduced_model": ("reduced $(v, A)$ softmax model, $d=3$, $t \\leq 1$", "tab:purple", "o"),
    "full_model": ("§6 model, softmax", "tab:red", "s"),
}


def plot_trajectory_transfer(inputs, outputs, params, rule="plot_trajectory_transfer"):
    apply_style()
    cols = ["model", "prompt_length", "seed", "time", "test_loss", "status"]
    runs = pd.concat([read_parquet(p, columns=cols) for p in inputs["runs"]], ignore_index=True)
    runs = runs[runs["model"] == "softmax"]
    flows = pd.concat([read_parquet(p, columns=["seed", "time", "infinite_prompt_risk", "sharpness"]) for p in inputs["flows"]],
                      ignore_index=True)
    gap = read_parquet(inputs["gap"])
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6), gridspec_kw={"width_ratios": [1.25, 0.8, 1.15]})

    ax = axes[0]
    lengths = sorted(runs["prompt_length"].unique())
    palette = dict(zip(lengths, sns.color_palette("viridis", len(lengths))))
    for L in lengths:
        g = runs[(runs["prompt_length"] == L) & (runs["time"] > 0)]
        mean = g.groupby("time")["test_loss"].mean()
        ax.plot(mean.index, mean.to_numpy(), color=palette[L], linewidth=1.2, label=f"L = {L}")
        bad = g[g["status"] == "diverged"]
        ax.scatter(bad["time"], np.minimum(bad["test_loss"], 2.0), marker="x", color=palette[L], s=40, zorder=5)
    flow = flows[flows["time"] > 0].groupby("time")["infinite_prompt_risk"].mean()
    ax.plot(flow.index, flow.to_numpy(), label=r"$L=\infty$: gradient flow on closed-form $R_\infty(\theta)$", **THEORY_STYLE)
    ax.axvline(params["horizon"], color="grey", linestyle=":", linewidth=1)
    ax.text(params["horizon"], 1.0, " horizon of the gap", color="grey", fontsize=7, va="top")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(top=2.0)
    ax.set_xlabel(r"training time $t = \mathrm{lr}\cdot\mathrm{step}$")
    ax.set_ylabel("test MSE (mean over seeds)")
    ax.set_title("§6 softmax model: SGD at each $L$ vs the $L = \\infty$ flow (same start)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)

    ax = axes[1]
    sharp = flows.dropna(subset=["sharpness"])
    sharp = sharp[sharp["time"] > 0]
    for seed, g in sharp.groupby("seed"):
        ax.plot(g["time"], g["sharpness"], color="black", alpha=0.6, linewidth=1, label="flow, one line per seed" if seed == sharp["seed"].min() else None)
    lr = float(params["lr"])
    ax.axhline(2.0 / lr, color="tab:red", linestyle=":", label=f"2/lr = {2.0 / lr:.3g}: SGD stability limit")
    ax.axvline(params["horizon"], color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"time $t$")
    ax.set_ylabel(r"sharpness $\lambda_{\max}(\nabla^2 R_\infty(\theta_\infty(t)))$")
    ax.set_title("SGD can follow the flow only while sharpness < 2/lr", fontsize=9)
    ax.legend(fontsize=7)

    ax = axes[2]
    points = gap[gap["kind"] == "gap"]
    fits = gap[gap["kind"] == "fit"]
    for exp, (label, color, marker) in EXPERIMENTS.items():
        pts = points[(points["experiment"] == exp) & (points["model"] == "softmax")]
        if pts.empty:
            continue
        ok = pts[pts["status"] == "ok"]
        fit = fits[(fits["experiment"] == exp) & (fits["model"] == "softmax")]
        text = ""
        if len(fit):
            f = fit.iloc[0]
            grid = np.geomspace(ok["prompt_length"].min(), ok["prompt_length"].max(), 50)
            ax.plot(grid, np.exp(f["intercept"]) * grid ** f["slope"], color=color, linewidth=1)
            text = f": slope {f['slope']:.2f} [{f['slope_lo']:.2f}, {f['slope_hi']:.2f}]"
        ax.scatter(ok["prompt_length"], ok["sup_distance"], color=color, marker=marker, s=22, label=label + text)
        bad = pts[pts["status"] != "ok"]
        if len(bad):
            ax.scatter(bad["prompt_length"], bad["sup_distance"].clip(upper=1e3), color=color, marker="x", s=40,
                       label=f"{label}: diverged runs")
    ref = points[points["experiment"] == "reduced_model"]
    if len(ref):
        L0, y0 = ref["prompt_length"].min(), ref[ref["prompt_length"] == ref["prompt_length"].min()]["sup_distance"].mean()
        grid = np.geomspace(L0, points["prompt_length"].max(), 20)
        ax.plot(grid, y0 * L0 / grid, label=r"theory: $O(1/L)$ (slope $-1$)", **THEORY_STYLE)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("prompt length $L$")
    ax.set_ylabel(r"$\sup_{t\leq T}\|\theta_L(t) - \theta_\infty(t)\|$")
    ax.set_title("distance to the infinite-prompt flow on a fixed horizon (95% CI on slopes)", fontsize=9)
    ax.legend(fontsize=7)
    fig.suptitle("R4: finite-prompt training follows the infinite-prompt gradient flow, within $O(1/L)$ on a fixed horizon", fontsize=11)
    fig.tight_layout()
    save_figure(fig, outputs["pdf"], outputs["png"])
