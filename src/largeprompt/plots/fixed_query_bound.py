"""Figure `fixed_query_bound` (R2, docs/experiments.md#fixed_query_bound): empirical quantiles of ‖T_L − T_∞‖ against
the δ-method prediction and the rigorous finite-L bound (docs/theory.md#fixed-query-bound). Every drawn value is a
column of fixed_query_bound/quantiles.parquet (:mod:`largeprompt.stages.simulate_fixed_query_bound`)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

from largeprompt.io.parquet_io import read_parquet
from largeprompt.plots.style import REFERENCE_STYLE, apply_style, save_figure, suptitle

BOUND_STYLE = dict(linestyle=(0, (6, 2, 1, 2)), linewidth=1.5)


def plot_fixed_query_bound(inputs, outputs, params=None, rule="plot_fixed_query_bound"):
    apply_style()
    data = read_parquet(inputs["quantiles"])
    kappas = sorted(data["kappa"].unique())
    deltas = sorted(data["delta"].unique(), reverse=True)
    colours = dict(zip(deltas, sns.color_palette("rocket", len(deltas) + 1)))
    fig, axes = plt.subplots(1, len(kappas) + 1, figsize=(3.6 * (len(kappas) + 1), 4.2), squeeze=False)
    for ax, kappa in zip(axes[0], kappas):
        cell = data[data["kappa"] == kappa]
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
            ax.text(unit * 1.1, 0.98, r"$L=e^{\kappa}$", transform=ax.get_xaxis_transform(), fontsize=7, va="top")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt length $L$")
        ax.set_title(f"κ = aᵀSa = {kappa:g}", fontsize=10)
        if ax is axes[0][0]:
            ax.set_ylabel(r"$(1-\delta)$-quantile of $\|T_{\mu_L} - T_\mu\|$")
            ax.plot([], [], color="grey", linestyle="--", linewidth=1.0, label=r"δ-method prediction: quantile of $\|N(0, C/L)\|$")
            ax.plot([], [], color="grey", label=r"rigorous finite-$L$ bound $\min(q/(1-r), B_{triv})$", **BOUND_STYLE)
            fig.legend(*ax.get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.42, 0.02), ncol=4, fontsize=8, frameon=False)
    ax = axes[0][-1]
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
    ax.set_title("collapse on $L e^{-κ}$ (dashed: δ-method limit)", fontsize=10)
    ax.legend(fontsize=7)
    suptitle(fig, "R2 at fixed queries: empirical quantiles (95% order-statistic CI), the δ-method prediction and the rigorous finite-L bound",
             (params or {}).get("run"), fontsize=11)
    fig.tight_layout()
    save_figure(fig, outputs["pdf"], outputs["png"])
