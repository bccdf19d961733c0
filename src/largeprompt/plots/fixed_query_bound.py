"""Figure `fixed_query_bound` (R2, docs/experiments.md#fixed_query_bound): empirical quantiles of ‖T_L − T_∞‖ against
the δ-method prediction and the rigorous finite-L bound (docs/theory.md#fixed-query-bound). Every drawn value is a
column of fixed_query_bound/quantiles.parquet (:mod:`largeprompt.stages.simulate_fixed_query_bound`)."""
from __future__ import annotations

import numpy as np
import seaborn as sns

from largeprompt.io.parquet_io import read_parquet
from largeprompt.plots.style import MIN_FONT_PT, REFERENCE_STYLE, apply_style, figure, legend_below, legend_panel, save_figure, suptitle

BOUND_STYLE = dict(linestyle=(0, (6, 2, 1, 2)), linewidth=1.5)


def plot_fixed_query_bound(inputs, outputs, params=None, rule="plot_fixed_query_bound"):
    """One panel per κ and the collapse on L e^{-κ}, three to a row at text width; the legend in the first free cell
    of the last row, or below the panels when the rows are full."""
    apply_style()
    data = read_parquet(inputs["quantiles"])
    kappas = sorted(data["kappa"].unique())
    deltas = sorted(data["delta"].unique(), reverse=True)
    colours = dict(zip(deltas, sns.color_palette("rocket", len(deltas) + 1)))
    n = len(kappas) + 1
    ncols = min(3, n)
    nrows = -(-n // ncols)
    fig = figure("text", 2.4 * nrows + 1.0)
    grid = fig.add_gridspec(nrows, ncols)
    cells = [fig.add_subplot(grid[i // ncols, i % ncols]) for i in range(n)]
    for i, (ax, kappa) in enumerate(zip(cells, kappas)):
        _kappa_panel(ax, data[data["kappa"] == kappa], kappa, deltas, colours, first=i == 0, left=i % ncols == 0)
    _collapse_panel(cells[-1], data, kappas, deltas)
    handles, labels = cells[0].get_legend_handles_labels()
    if n % ncols:
        legend_panel(fig.add_subplot(grid[-1, n % ncols:]), handles, labels)
    else:
        legend_below(fig, handles, labels)
    suptitle(fig, "R2 at fixed queries: empirical quantiles (95% order-statistic CI), the δ-method prediction and the "
                  "rigorous finite-L bound", (params or {}).get("run"))
    save_figure(fig, outputs["pdf"], outputs["png"])


def _kappa_panel(ax, cell, kappa, deltas, colours, first: bool, left: bool) -> None:
    """Quantiles, δ-method prediction and bounds against L at one κ; the first panel's entries name the styles."""
    for delta in deltas:
        d = cell[cell["delta"] == delta].sort_values("prompt_length")
        col = colours[delta]
        ax.plot(d["prompt_length"], d["empirical_quantile"], color=col, marker="o", ms=2.5, label=f"empirical, 1−δ={1 - delta:g}")
        ax.fill_between(d["prompt_length"], d["quantile_ci_low"], d["quantile_ci_high"], color=col, alpha=0.25, lw=0)
        ax.plot(d["prompt_length"], d["delta_method_quantile"], color=col, linestyle="--", linewidth=1.0)
        ax.plot(d["prompt_length"], d["sharp_bound"], color=col, **BOUND_STYLE)
    d = cell[cell["delta"] == deltas[0]].sort_values("prompt_length")
    ax.plot(d["prompt_length"], d["delta_method_rms"], label=r"δ-method RMS $\sqrt{\mathrm{tr}\,C/L}$", **REFERENCE_STYLE)
    mid = cell[np.isclose(cell["delta"], 0.05)].sort_values("prompt_length") if np.isclose(cell["delta"], 0.05).any() else d
    ax.plot(mid["prompt_length"], mid["simple_bound"], color="grey", linestyle=":", linewidth=1.4,
            label=f"simple bound $2\\sqrt{{2\\,\\mathrm{{tr}}C/(L\\delta)}}$, δ={mid['delta'].iloc[0]:g}")
    unit = float(cell["unit_effective_prompt_length"].iloc[0])  # e^κ
    if unit >= cell["prompt_length"].min():
        ax.axvline(unit, color="grey", linewidth=0.8, alpha=0.6)
        ax.text(unit * 1.1, 0.98, r"$L=e^{\kappa}$", transform=ax.get_xaxis_transform(), fontsize=MIN_FONT_PT, va="top")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt length $L$")
    ax.set_title(f"κ = aᵀSa = {kappa:g}")
    if left:
        ax.set_ylabel(r"$(1-\delta)$-quantile of $\|T_{\mu_L} - T_\mu\|$")
    if first:
        ax.plot([], [], color="grey", linestyle="--", linewidth=1.0, label=r"δ-method prediction: quantile of $\|N(0, C/L)\|$")
        ax.plot([], [], color="grey", label=r"rigorous finite-$L$ bound $\min(q/(1-r), B_{triv})$", **BOUND_STYLE)


def _collapse_panel(ax, data, kappas, deltas) -> None:
    """Normalised quantiles against the effective prompt length L e^{-κ}, every κ on one curve."""
    delta = 0.05 if np.isclose(data["delta"], 0.05).any() else deltas[0]
    pal = dict(zip(kappas, sns.color_palette("viridis", len(kappas))))
    for kappa in kappas:
        d = data[(data["kappa"] == kappa) & np.isclose(data["delta"], delta)].sort_values("prompt_length")
        ax.plot(d["effective_prompt_length"], d["normalised_quantile"], color=pal[kappa], marker="o", ms=2.5, label=f"κ={kappa:g}")
        ax.fill_between(d["effective_prompt_length"], d["normalised_quantile_ci_low"], d["normalised_quantile_ci_high"],
                        color=pal[kappa], alpha=0.25, lw=0)
        ax.plot(d["effective_prompt_length"], d["normalised_delta_method_quantile"], color=pal[kappa], linestyle="--", linewidth=1.0)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(r"effective prompt length $L e^{-\kappa}$")
    ax.set_ylabel(rf"{1 - delta:g}-quantile $/ \sqrt{{\mathrm{{tr}}\,C/L}}$")
    ax.set_title("collapse on $L e^{-κ}$ (dashed: δ-method limit)")
    ax.legend()
