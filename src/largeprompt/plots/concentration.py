"""Shared drawing for the R2/R3 concentration figures (docs/experiments.md#output_concentration,
docs/experiments.md#gradient_concentration): draws rows of the rate tables (largeprompt.maths.rate_tables),
computes nothing."""
from __future__ import annotations

import numpy as np
import seaborn as sns
from matplotlib.legend import Legend

from largeprompt.io.parquet_io import read_parquet

METRIC_LABELS = {
    "output": r"$\|T_L - T_\infty\|^2$",
    "grad_U": r"$\|\partial_U T_L - \partial_U T_\infty\|_F^2$",
    "grad_V": r"$\|\partial_V T_L - \partial_V T_\infty\|_F^2$",
}


def c_palette(c_values):
    return dict(zip(sorted(c_values), sns.color_palette("viridis", len(c_values))))


def _rows(rates, **eq):
    mask = np.ones(len(rates), dtype=bool)
    for k, v in eq.items():
        mask &= rates[k].to_numpy() == v
    return rates[mask]


def read_rate_tables(inputs, names=("error_statistics", "exponents", "rate_guides", "local_exponents")) -> dict:
    """The rate tables a concentration figure draws, by name (inputs named like the tables)."""
    return {name: read_parquet(inputs[name]) for name in names}


def draw_concentration_row(axes, tables: dict, metric: str, measure: str):
    """Three panels for one metric: mean (+ predicted rate), median and 90% quantile, local exponent."""
    ax_mean, ax_med, ax_local = axes
    mine = {name: _rows(table, metric=metric, token_measure=measure) for name, table in tables.items()}
    colours = c_palette(mine["exponents"]["c"].unique())
    for c, colour in colours.items():
        stat = _rows(mine["error_statistics"], c=c)
        mean = _rows(stat, statistic="mean").sort_values("prompt_length")
        fit = _rows(mine["exponents"], c=c, statistic="mean").iloc[0]
        ax_mean.plot(mean["prompt_length"], mean["estimate"], color=colour, marker="o", ms=2.5,
                     label=f"c={c:g}: $\\hat p$={fit.estimate:.2f} [{fit.ci_low:.2f}, {fit.ci_high:.2f}]")
        ax_mean.fill_between(mean["prompt_length"], mean["ci_low"], mean["ci_high"], color=colour, alpha=0.25, lw=0)
        guide = _rows(mine["rate_guides"], c=c, statistic="mean").sort_values("prompt_length")
        ax_mean.plot(guide["prompt_length"], guide["guide"], color=colour, linestyle="--", linewidth=1.1)
        med = _rows(stat, statistic="median").sort_values("prompt_length")
        mfit = _rows(mine["exponents"], c=c, statistic="median").iloc[0]
        ax_med.plot(med["prompt_length"], med["estimate"], color=colour, marker="o", ms=2.5,
                    label=f"c={c:g}: median $\\hat p$={mfit.estimate:.2f} [{mfit.ci_low:.2f}, {mfit.ci_high:.2f}]")
        ax_med.fill_between(med["prompt_length"], med["ci_low"], med["ci_high"], color=colour, alpha=0.25, lw=0)
        q90 = _rows(stat, statistic="q90").sort_values("prompt_length")
        ax_med.plot(q90["prompt_length"], q90["estimate"], color=colour, linestyle=":", linewidth=1.4)
        ax_med.fill_between(q90["prompt_length"], q90["ci_low"], q90["ci_high"], color=colour, alpha=0.15, lw=0)
        local = _rows(mine["local_exponents"], c=c, statistic="mean").sort_values("prompt_length")
        ax_local.plot(local["prompt_length"], local["estimate"], color=colour, marker="o", ms=2.5)
        ax_local.fill_between(local["prompt_length"], local["ci_low"], local["ci_high"], color=colour, alpha=0.2, lw=0)
        ax_local.axhline(fit.predicted, color=colour, linestyle="--", linewidth=1.1)
    guide = r"predicted rate $L^{-p(c)}$, $p=\min(1,(\sqrt{1+4/c}-1)/2)$" if measure == "gaussian" else r"predicted rate $L^{-1}$ (bounded tokens)"
    ax_mean.plot([], [], color="grey", linestyle="--", label=guide)
    ax_med.plot([], [], color="grey", linestyle=":", label="90% quantile")
    predicted = r"predicted exponent $\min(1, (\sqrt{1+4/c}-1)/2)$" if measure == "gaussian" else "predicted exponent 1"
    ax_local.plot([], [], color="grey", linestyle="--", label=predicted)
    label = METRIC_LABELS.get(metric, metric)
    for ax, title in ((ax_mean, f"mean of {label}"), (ax_med, "median (solid), 90% quantile (dotted)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt length $L$")
        ax.set_title(title, fontsize=9)
    ax_mean.set_ylabel(label)
    ax_local.set_xscale("log", base=2)
    ax_local.set_xlabel("prompt length $L$")
    ax_local.set_ylabel(r"local exponent $-d\log E\,/\,d\log L$")
    ax_local.set_title("local decay exponent of the mean", fontsize=9)
    ax_local.set_ylim(-0.1, 1.5)
    ax_local.legend(fontsize=6.5, loc="upper left")
    _fit_legends(ax_local, ax_mean, ax_med)


def _fit_legends(ax_local, ax_mean, ax_med):
    """The fitted exponents of every c, mean (first column) and median (second), in one legend right of the row:
    inside the panels they covered the curves once a row has nine c values (the paper run)."""
    (mean_h, mean_l), (med_h, med_l) = ax_mean.get_legend_handles_labels(), ax_med.get_legend_handles_labels()
    legend = Legend(ax_local, mean_h + med_h, mean_l + med_l, ncol=2, fontsize=6.5, title_fontsize=6.5,
                    title=r"fitted exponents $\hat p$ over the upper half of $L$, 95% bootstrap CI: mean | median",
                    loc="upper left", bbox_to_anchor=(1.03, 1.0))
    ax_local.add_artist(legend).set_clip_on(False)  # add_artist clips to the axes; this lies outside them
