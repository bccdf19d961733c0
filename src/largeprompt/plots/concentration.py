"""Shared drawing for the R2/R3 concentration figures (docs/experiments.md#output_concentration,
docs/experiments.md#gradient_concentration): draws rows of the rate tables (largeprompt.maths.rate_tables),
computes nothing."""
from __future__ import annotations

import numpy as np
import seaborn as sns
from matplotlib.lines import Line2D

from largeprompt.io.parquet_io import read_parquet
from largeprompt.plots.style import legend_below

ROW_HEIGHT_IN = 3.4  # one row of three panels at text width, with its legend of fitted exponents under it
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


def _fit_text(fit) -> str:
    return f"{fit.estimate:.2f} [{fit.ci_low:.2f}, {fit.ci_high:.2f}]"


def draw_concentration_row(row, tables: dict, metric: str, measure: str):
    """Three panels for one metric in the subfigure ``row``: mean (+ predicted rate), median and 90% quantile, local
    exponent; the fitted exponents of every c and the line styles in one legend under them."""
    ax_mean, ax_med, ax_local = row.subplots(1, 3)
    mine = {name: _rows(table, metric=metric, token_measure=measure) for name, table in tables.items()}
    colours = c_palette(mine["exponents"]["c"].unique())
    handles, labels = [], []
    for c, colour in colours.items():
        stat = _rows(mine["error_statistics"], c=c)
        fit, mfit = (_rows(mine["exponents"], c=c, statistic=s).iloc[0] for s in ("mean", "median"))
        handles += _draw_c(ax_mean, ax_med, ax_local, mine, stat, c, colour, fit)
        labels.append(f"c={c:g}: mean {_fit_text(fit)}, median {_fit_text(mfit)}")
    guide = (r"predicted rate $L^{-p(c)}$ (left) and exponent $p(c) = \min(1,(\sqrt{1+4/c}-1)/2)$ (right)"
             if measure == "gaussian" else r"predicted rate $L^{-1}$ (left) and exponent 1 (right; bounded tokens)")
    handles += [Line2D([], [], color="grey", linestyle="--"), Line2D([], [], color="grey", linestyle=":")]
    labels += [f"dashed: {guide}", "dotted: 90% quantile"]
    label = METRIC_LABELS.get(metric, metric)
    for ax, title in ((ax_mean, f"mean of {label}"), (ax_med, "median (solid), 90% quantile (dotted)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt length $L$")
        ax.set_title(title)
    ax_mean.set_ylabel(label)
    ax_local.set_xscale("log", base=2)
    ax_local.set_xlabel("prompt length $L$")
    ax_local.set_ylabel(r"local exponent $-d\log E\,/\,d\log L$")
    ax_local.set_title("local decay exponent of the mean")
    ax_local.set_ylim(-0.1, 1.5)
    legend_below(row, handles, labels, title=r"fitted exponent $\hat p$ over the upper half of $L$, 95% bootstrap CI")
    return ax_mean, ax_med, ax_local


def _draw_c(ax_mean, ax_med, ax_local, mine, stat, c, colour, fit) -> list:
    """One c's curves and bands on the three panels; its legend handle."""
    mean = _rows(stat, statistic="mean").sort_values("prompt_length")
    (line,) = ax_mean.plot(mean["prompt_length"], mean["estimate"], color=colour, marker="o", ms=2.5)
    ax_mean.fill_between(mean["prompt_length"], mean["ci_low"], mean["ci_high"], color=colour, alpha=0.25, lw=0)
    guide = _rows(mine["rate_guides"], c=c, statistic="mean").sort_values("prompt_length")
    ax_mean.plot(guide["prompt_length"], guide["guide"], color=colour, linestyle="--", linewidth=1.1)
    med = _rows(stat, statistic="median").sort_values("prompt_length")
    ax_med.plot(med["prompt_length"], med["estimate"], color=colour, marker="o", ms=2.5)
    ax_med.fill_between(med["prompt_length"], med["ci_low"], med["ci_high"], color=colour, alpha=0.25, lw=0)
    q90 = _rows(stat, statistic="q90").sort_values("prompt_length")
    ax_med.plot(q90["prompt_length"], q90["estimate"], color=colour, linestyle=":", linewidth=1.4)
    ax_med.fill_between(q90["prompt_length"], q90["ci_low"], q90["ci_high"], color=colour, alpha=0.15, lw=0)
    local = _rows(mine["local_exponents"], c=c, statistic="mean").sort_values("prompt_length")
    ax_local.plot(local["prompt_length"], local["estimate"], color=colour, marker="o", ms=2.5)
    ax_local.fill_between(local["prompt_length"], local["ci_low"], local["ci_high"], color=colour, alpha=0.2, lw=0)
    ax_local.axhline(fit.predicted, color=colour, linestyle="--", linewidth=1.1)
    return [line]
