"""Figure `trajectory_transfer` (R4, docs/experiments.md#trajectory_transfer): finite-L training against the
infinite-prompt flow from the same start, and the distance between them against L. Draws only."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.cm import ScalarMappable
from matplotlib.colors import LogNorm

from largeprompt.io.parquet_io import read_parquet
from largeprompt.plots.style import REFERENCE_STYLE, apply_style, corrected_slope_text, figure, legend_panel, save_figure, suptitle

EXPERIMENTS = {
    ("reduced_model", "softmax"): ("reduced $(v, A)$ softmax model", "tab:purple", "o"),
    ("full_model", "softmax"): ("§6 model, softmax", "tab:red", "s"),
    ("full_model", "linear"): ("§6 model, linear", "tab:blue", "D"),
}


def _risk_panel(ax, runs, flows):
    """Every softmax run of stream 0 coloured by L (a colour bar, not a legend: 19 lengths), the flows in black."""
    runs = runs[(runs["model"] == "softmax") & (runs["stream"] == 0) & (runs["time"] > 0)]
    lengths = sorted(runs["prompt_length"].unique())
    cmap = plt.get_cmap("viridis")
    norm = LogNorm(vmin=min(lengths), vmax=max(lengths)) if len(lengths) > 1 else None
    many, first = runs["seed"].nunique() > 3, runs["seed"].min()
    for (L, seed), g in runs.groupby(["prompt_length", "seed"]):
        ax.plot(g["time"], g["test_loss"], color=cmap(norm(L)) if norm else cmap(0.5),
                linewidth=0.6 if many else 0.9, alpha=0.45 if many else 0.8,
                label=None if norm or seed != first else f"L = {L}")
    for i, (_, f) in enumerate(flows[flows["time"] > 0].groupby("seed")):
        ax.plot(f["time"], f["infinite_prompt_risk"], label="$L=\\infty$ flow from each run's start" if i == 0 else None,
                **dict(REFERENCE_STYLE, linestyle="--", linewidth=1.0))
    if norm:
        bar = ax.figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.02)
        bar.set_label("prompt length $L$ (SGD runs)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"training time $t = \sum_k \mathrm{lr}_k$")
    ax.set_ylabel(f"test MSE ({runs['seed'].nunique()} seeds, one line per run)")
    ax.set_title("§6 softmax model: SGD at each $L$ and the flow from the same start")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower left")


def _sharpness_panel(ax, flows, limit):
    """One line per seed's flow, labelled per seed for up to 3 seeds, else as one legend entry."""
    shown = flows[flows["time"] > 0]
    n = shown["seed"].nunique()
    for i, (seed, f) in enumerate(shown.groupby("seed")):
        label = f"flow, seed {seed}" if n <= 3 else (f"the flow of each seed ({n})" if i == 0 else None)
        ax.plot(f["time"], f["sharpness"], linewidth=1, color=None if n <= 3 else "tab:gray", alpha=1 if n <= 3 else 0.6,
                label=label)
    if limit:
        ax.axhline(limit, color="tab:red", linestyle=":", label=f"2/lr = {limit:.3g}: stability limit of the R4 runs")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"time $t$")
    ax.set_ylabel(r"sharpness $\lambda_{\max}(\nabla^2 R_\infty(\theta_\infty(t)))$")
    ax.set_title("SGD tracks the flow only where lr·sharpness < 2 (the R6 runs keep lr·λ ≤ 1.6 by their step-size rule)")
    ax.legend(loc="lower right")


def _fit_label(label, fit) -> str:
    if not len(fit) or "slope" not in fit or not np.isfinite(fit["slope"].iloc[0]):
        return label + ": no slope (fewer than 2 lengths above the floor)"
    f = fit.iloc[0]
    ci = f"[{f['slope_lo']:.2f}, {f['slope_hi']:.2f}]" if np.isfinite(f["slope_lo"]) else "(no CI)"
    return f"{label}: slope {f['slope']:.2f} {ci} over {int(f['n_fitted'])}/{int(f['n_points'])} points" + corrected_slope_text(f)


def _spaced(lengths, ratio: float = 1.4) -> list:
    """The prompt lengths to label, skipping any within ``ratio`` of the last one kept (160 beside 200, 500 beside
    640 ran into each other when the reduced model's and the §6 runs' lengths share the axis)."""
    kept = []
    for L in lengths:
        if not kept or L / kept[-1] >= ratio:
            kept.append(L)
    return kept


def _gap_points(ax, pts, fit, label, color, marker) -> set:
    """One experiment's distances, fit, coupled distances, cut and floor; the kinds of mark it drew (for the key)."""
    drawn = set()
    if len(fit) and "slope" in fit and np.isfinite(fit["slope"].iloc[0]):
        f = fit.iloc[0]
        ax.plot([f["fit_min_prompt_length"], f["fit_max_prompt_length"]], [f["fit_gap_at_min"], f["fit_gap_at_max"]],
                color=color, linewidth=1)
    ax.scatter(pts["prompt_length"], pts["sup_distance"], color=color, marker=marker, s=22, label=_fit_label(label, fit))
    if "coupled_distance" in pts and pts["coupled_distance"].notna().any():
        ax.scatter(pts["prompt_length"], pts["coupled_distance"], color=color, marker="x", s=18, linewidths=0.9)
        cut = pts.dropna(subset=["coupled_floor_threshold"]).drop_duplicates("prompt_length").sort_values("prompt_length")
        ax.plot(cut["prompt_length"], cut["coupled_floor_threshold"], color=color, linestyle=":", linewidth=1)
        drawn |= {"coupled", "cut"}
    threshold = pts.dropna(subset=["floor_threshold"]).drop_duplicates("prompt_length")
    if len(threshold) and len(fit):
        ax.scatter(threshold["prompt_length"], threshold["floor_threshold"], color=color, marker=marker, s=22,
                   facecolors="none")
        drawn.add("floor")
    return drawn


def _gap_key(ax, drawn: set, factor: str) -> None:
    """Legend entries, in grey, for the kinds of mark every experiment shares (its colour and shape name it)."""
    grey = dict(color="tab:gray")
    if "coupled" in drawn:
        ax.scatter([], [], marker="x", s=18, linewidths=0.9, label="×: distance to its coupled L = ∞ run "
                   "(what the ledger tests)", **grey)
        ax.plot([], [], linestyle=":", linewidth=1, label="dotted: its cut, a multiple of the prompt-noise floor "
                "(falls like $L^{-1/2}$)", **grey)
    if "floor" in drawn:
        ax.scatter([], [], marker="o", s=22, facecolors="none", edgecolors="tab:gray",
                   label=f"open: {factor} floor, median over seeds")


def _gap_panel(ax, gaps, slopes):
    drawn = set()
    for key, (label, color, marker) in EXPERIMENTS.items():
        pts = gaps[(gaps["experiment"] == key[0]) & (gaps["model"] == key[1]) & (gaps["status"] == "ok")]
        if len(pts):
            fit = slopes[(slopes["experiment"] == key[0]) & (slopes["model"] == key[1])]
            drawn |= _gap_points(ax, pts, fit, label, color, marker)
    factor = f"{float(slopes['floor_factor'].iloc[0]):g}×" if len(slopes) else "a multiple of"
    _gap_key(ax, drawn, factor)
    ref = slopes[(slopes["experiment"] == "full_model") & (slopes["model"] == "softmax")]
    if len(ref) and "reference_gap_at_min" in ref and np.isfinite(ref["reference_gap_at_min"].iloc[0]):
        f = ref.iloc[0]
        ax.plot([f["fit_min_prompt_length"], f["fit_max_prompt_length"]], [f["reference_gap_at_min"], f["reference_gap_at_max"]],
                label=r"slope $-1$: the $O(1/L)$ of Thm 4.3", **REFERENCE_STYLE)
    ax.set_xscale("log")
    ax.set_yscale("log")
    lengths = _spaced(sorted(gaps["prompt_length"].unique()))
    ax.set_xticks(lengths, [str(L) for L in lengths])
    ax.minorticks_off()
    ax.set_xlabel("prompt length $L$")
    ax.set_ylabel(r"$\sup_{t\leq T}\|\theta_L(t) - \theta_\infty(t)\|$")
    ax.set_title(f"distance to the flow (filled; slopes fitted above {factor} its floor, the larger of SGD noise and "
                 "Euler error) and to the coupled L = ∞ SGD run on the same batches (×; no Euler error, no batch noise)")


def plot_trajectory_transfer(inputs, outputs, params=None, rule="plot_trajectory_transfer"):
    """Two by two at text width: the risks and the sharpness above, the distances and their legend below."""
    apply_style()
    cols = ["model", "prompt_length", "seed", "stream", "time", "test_loss", "status"]
    runs = pd.concat([read_parquet(p, columns=cols) for p in inputs["trajectories"]], ignore_index=True)
    flows = pd.concat([read_parquet(p, columns=["seed", "time", "infinite_prompt_risk", "sharpness"])
                       for p in inputs["flows"]], ignore_index=True)
    gaps, slopes = read_parquet(inputs["gaps"]), read_parquet(inputs["slopes"])
    limit = float(gaps["stability_limit"].iloc[0]) if "stability_limit" in gaps and len(gaps) else None
    fig = figure("text", 6.4)
    axes = fig.subplots(2, 2, height_ratios=[1, 1.2])
    _risk_panel(axes[0, 0], runs, flows)
    _sharpness_panel(axes[0, 1], flows, limit)
    _gap_panel(axes[1, 0], gaps, slopes)
    legend_panel(axes[1, 1], *axes[1, 0].get_legend_handles_labels())
    suptitle(fig, "R4: finite-prompt training follows the infinite-prompt gradient flow, within $O(1/L)$ on a fixed "
                 "horizon",
             (params or {}).get("run"))
    save_figure(fig, outputs["pdf"], outputs["png"])
