"""Figure `trajectory_transfer` (R4, docs/experiments.md#trajectory_transfer): finite-L training against the
infinite-prompt flow from the same start, and the distance between them against L. Draws only."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ..parquet_io import read_parquet
from .style import REFERENCE_STYLE, apply_style, save_figure

EXPERIMENTS = {
    ("reduced_model", "softmax"): ("reduced $(v, A)$ softmax model", "tab:purple", "o"),
    ("full_model", "softmax"): ("§6 model, softmax", "tab:red", "s"),
    ("full_model", "linear"): ("§6 model, linear", "tab:blue", "D"),
}


def _risk_panel(ax, runs, flows):
    runs = runs[(runs["model"] == "softmax") & (runs["stream"] == 0) & (runs["time"] > 0)]
    lengths = sorted(runs["prompt_length"].unique())
    palette = dict(zip(lengths, sns.color_palette("viridis", len(lengths))))
    for (L, seed), g in runs.groupby(["prompt_length", "seed"]):
        ax.plot(g["time"], g["test_loss"], color=palette[L], linewidth=0.9, alpha=0.8,
                label=f"L = {L}" if seed == runs["seed"].min() else None)
    for seed, f in flows[flows["time"] > 0].groupby("seed"):
        style = dict(REFERENCE_STYLE, linestyle=[":", "--", "-."][int(seed) % 3], linewidth=1.1)
        ax.plot(f["time"], f["infinite_prompt_risk"], label=f"$L=\\infty$ flow, seed {seed}", **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"training time $t = \sum_k \mathrm{lr}_k$")
    ax.set_ylabel("test MSE (one line per seed)")
    ax.set_title("§6 softmax model: SGD at each $L$ and the flow from the same start", fontsize=9)
    ax.legend(fontsize=6, ncol=2)


def _sharpness_panel(ax, flows, transfer_lr):
    for seed, f in flows[flows["time"] > 0].groupby("seed"):
        ax.plot(f["time"], f["sharpness"], linewidth=1, label=f"flow, seed {seed}")
    if transfer_lr:
        ax.axhline(2.0 / transfer_lr, color="tab:red", linestyle=":",
                   label=f"2/lr = {2.0 / transfer_lr:.3g}: stability limit of the R4 runs")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"time $t$")
    ax.set_ylabel(r"sharpness $\lambda_{\max}(\nabla^2 R_\infty(\theta_\infty(t)))$")
    ax.set_title("SGD tracks the flow only where lr·sharpness < 2", fontsize=9)
    ax.legend(fontsize=6.5)


def _gap_panel(ax, gaps, slopes):
    for key, (label, color, marker) in EXPERIMENTS.items():
        pts = gaps[(gaps["experiment"] == key[0]) & (gaps["model"] == key[1]) & (gaps["status"] == "ok")]
        if pts.empty:
            continue
        fit = slopes[(slopes["experiment"] == key[0]) & (slopes["model"] == key[1])]
        text = ": no slope (fewer than 2 lengths above the floor)"
        if len(fit) and "slope" in fit and np.isfinite(fit["slope"].iloc[0]):
            f = fit.iloc[0]
            grid = np.geomspace(f["fit_min_prompt_length"], f["fit_max_prompt_length"], 20)
            ax.plot(grid, np.exp(f["intercept"]) * grid ** f["slope"], color=color, linewidth=1)
            text = f": slope {f['slope']:.2f} [{f['slope_lo']:.2f}, {f['slope_hi']:.2f}]"
        ax.scatter(pts["prompt_length"], pts["sup_distance"], color=color, marker=marker, s=22, label=label + text)
        floor = pts.dropna(subset=["noise_floor"])
        if len(floor):
            factor = float(fit["floor_factor"].iloc[0]) if len(fit) else 3.0
            ax.scatter(floor["prompt_length"], factor * floor["noise_floor"], color=color, marker=marker, s=22,
                       facecolors="none", label=f"{label}: {factor:g}× SGD-noise floor (two batch streams)")
    ok = slopes[np.isfinite(slopes["slope"])] if "slope" in slopes else slopes.iloc[:0]
    if len(ok):
        f = ok.iloc[0]
        grid = np.geomspace(f["fit_min_prompt_length"], f["fit_max_prompt_length"], 20)
        mid = np.sqrt(grid[0] * grid[-1])
        y_mid = np.exp(f["intercept"]) * mid ** f["slope"]
        ax.plot(grid, y_mid * mid / grid * 0.5, label=r"slope $-1$ (theory: $O(1/L)$)", **REFERENCE_STYLE)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("prompt length $L$")
    ax.set_ylabel(r"$\sup_{t\leq T}\|\theta_L(t) - \theta_\infty(t)\|$")
    ax.set_title("distance to the flow on a fixed horizon (95% CI on slopes)", fontsize=9)
    ax.legend(fontsize=6)


def plot_trajectory_transfer(inputs, outputs, params=None, rule="plot_trajectory_transfer"):
    apply_style()
    cols = ["model", "prompt_length", "seed", "stream", "time", "test_loss", "status"]
    runs = pd.concat([read_parquet(p, columns=cols) for p in inputs["trajectories"]], ignore_index=True)
    flows = pd.concat([read_parquet(p, columns=["seed", "time", "infinite_prompt_risk", "sharpness"])
                       for p in inputs["flows"]], ignore_index=True)
    gaps, slopes = read_parquet(inputs["gaps"]), read_parquet(inputs["slopes"])
    transfer_lr = float(gaps["transfer_lr"].iloc[0]) if "transfer_lr" in gaps and len(gaps) else None
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6), gridspec_kw={"width_ratios": [1.25, 0.9, 1.15]})
    _risk_panel(axes[0], runs, flows)
    _sharpness_panel(axes[1], flows, transfer_lr)
    _gap_panel(axes[2], gaps, slopes)
    fig.suptitle("R4: finite-prompt training follows the infinite-prompt gradient flow, within $O(1/L)$ on a fixed "
                 "horizon", fontsize=11)
    fig.tight_layout()
    save_figure(fig, outputs["pdf"], outputs["png"])
