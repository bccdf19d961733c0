"""Shared drawing for the R2/R3 concentration figures (docs/experiments.md#output_concentration,
docs/experiments.md#gradient_concentration): draws rows of the rate tables (largeprompt.maths.rate_tables),
computes nothing."""
from __future__ import annotations

import numpy as np
import seaborn as sns
from matplotlib.lines import Line2D

from largeprompt.io.parquet_io import read_parquet
from largeprompt.plots.style import figure, legend_below, row_height, suptitle

ROW_HEIGHT_IN = 1.9  # one row of three panels at text width; less where the rows would not fit a page
FIXED_HEIGHT_IN = 1.5  # the title and the shared legend under the rows
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


def concentration_figure(tables: dict, metrics: tuple[str, ...], title: str, run: str | None):
    """One row of three panels per (token measure, metric), ``metrics`` within each measure (:func:`draw_concentration_row`), the column
    titles on the top row, prompt lengths on the bottom row, one legend of tilts and line styles under them; rows
    shrink to fit a page (docs/architecture.md#print-size). The fitted exponents are figure ``rate_exponent``'s."""
    measures = list(dict.fromkeys(tables["exponents"]["token_measure"]))
    rows = [(measure, metric) for measure in measures for metric in metrics]
    colours = c_palette(tables["exponents"]["c"].unique())
    fig = figure("text", row_height(len(rows), ROW_HEIGHT_IN, FIXED_HEIGHT_IN) * len(rows) + FIXED_HEIGHT_IN)
    grid = fig.subplots(len(rows), 3, squeeze=False, sharex=True)
    for panels, (measure, metric) in zip(grid, rows):
        draw_concentration_row(panels, tables, metric, measure, colours)
    for ax, column in zip(grid[0], ("mean (dashed: predicted rate)", "median (solid), 90% quantile (dotted)",
                                    "local exponent of the mean (dashed: predicted)")):
        ax.set_title(column)
    for ax in grid[-1]:
        ax.set_xlabel("prompt length $L$")
    handles = [Line2D([], [], color=colour, marker="o", ms=2.5) for colour in colours.values()]
    labels = [f"$c$ = {c:g}" for c in colours]
    handles += [Line2D([], [], color="grey", linestyle="--"), Line2D([], [], color="grey", linestyle=":")]
    labels += [r"predicted: $L^{-p(c)}$, $p(c) = \min(1,(\sqrt{1+4/c}-1)/2)$ (Gaussian); $L^{-1}$ (bounded tokens)",
               "90% quantile"]
    legend_below(fig, handles, labels, title=r"tilt $c = \sigma^2 u^2$ (fitted exponents: figure rate_exponent)")
    suptitle(fig, title, run)
    return fig


def draw_concentration_row(panels, tables: dict, metric: str, measure: str, colours: dict) -> None:
    """Three panels for one (token measure, metric): mean (+ predicted rate), median and 90% quantile, local
    exponent (+ predicted exponent), every tilt c in its colour (``colours``: c → colour, :func:`c_palette`); the row is
    named by the first panel's y label."""
    ax_mean, ax_med, ax_local = panels
    mine = {name: _rows(table, metric=metric, token_measure=measure) for name, table in tables.items()}
    for c in sorted(mine["exponents"]["c"].unique()):
        fit = _rows(mine["exponents"], c=c, statistic="mean").iloc[0]
        _draw_c(ax_mean, ax_med, ax_local, mine, _rows(mine["error_statistics"], c=c), c, colours[c], fit)
    for ax in (ax_mean, ax_med):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
    ax_mean.set_ylabel(f"{measure}: {METRIC_LABELS.get(metric, metric)}")
    ax_local.set_xscale("log", base=2)
    ax_local.set_ylabel(r"$-d\log E\,/\,d\log L$")
    ax_local.set_ylim(-0.1, 1.5)


def _draw_c(ax_mean, ax_med, ax_local, mine, stat, c, colour, fit) -> None:
    """One c's curves and bands on the three panels."""
    mean = _rows(stat, statistic="mean").sort_values("prompt_length")
    ax_mean.plot(mean["prompt_length"], mean["estimate"], color=colour, marker="o", ms=2.5)
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
