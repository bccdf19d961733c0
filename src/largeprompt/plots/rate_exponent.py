"""Figure `rate_exponent` (R2, R3, docs/experiments.md#rate_exponent): fitted decay exponents against c with the
predicted exponent min(1, (√(1+4/c) − 1)/2) (docs/theory.md#random-query-rate) and the paper-form fit (paper Prop. 3.1).

Every curve is a row of exponent_curves.parquet (``predicted``, ``paper_form``; :mod:`largeprompt.maths.rate_tables`);
this module only draws.
"""
from __future__ import annotations

import numpy as np
import seaborn as sns
from matplotlib.container import ErrorbarContainer

from largeprompt.io.parquet_io import read_parquet
from largeprompt.plots.concentration import METRIC_LABELS
from largeprompt.plots.style import REFERENCE_STYLE, apply_style, figure, legend_below, save_figure, suptitle

MARKERS = {"output": "o", "grad_U": "s", "grad_V": "^"}
OFFSETS = {"output": 0.96, "grad_U": 1.0, "grad_V": 1.04}  # small horizontal dodge, display only


def plot_rate_exponent(inputs, outputs, params=None, rule="plot_rate_exponent"):
    """One panel per token measure, a column wide for one measure and the text width for more; one legend below."""
    apply_style()
    exps, curves = read_parquet(inputs["exponents"]), read_parquet(inputs["exponent_curves"])
    fits = read_parquet(inputs["paper_form_fits"])
    measures = list(dict.fromkeys(exps["token_measure"]))
    fig = figure("column", 5.2) if len(measures) == 1 else figure("text", 4.4)
    axes = fig.subplots(1, len(measures), squeeze=False)[0]
    colours = dict(zip(MARKERS, sns.color_palette("deep", 3)))
    for ax, measure in zip(axes, measures):
        _measure_panel(ax, exps[exps["token_measure"] == measure], curves, fits, measure, colours)
    _shared_legend(fig, axes)
    suptitle(fig, "R2/R3: the mean error rate slows down as the tilt grows; the median keeps rate 1",
             (params or {}).get("run"))
    save_figure(fig, outputs["pdf"], outputs["png"])


def _measure_panel(ax, cells, curves, fits, measure, colours) -> None:
    """The fitted exponents of one token measure against c, the predicted exponent and the paper-form fits."""
    for metric in MARKERS:
        for stat, fill in (("mean", True), ("median", False)):
            sel = cells[(cells["metric"] == metric) & (cells["statistic"] == stat)].sort_values("c")
            if sel.empty:
                continue
            x = sel["c"].to_numpy() * OFFSETS[metric]
            err = np.vstack([sel["estimate"] - sel["ci_low"], sel["ci_high"] - sel["estimate"]])
            ax.errorbar(x, sel["estimate"], yerr=err, color=colours[metric], marker=MARKERS[metric], ms=4,
                        mfc=colours[metric] if fill else "white", linestyle="-" if fill else ":", linewidth=1, capsize=2,
                        label=f"{stat} of {METRIC_LABELS[metric]}")
    curve = curves[(curves["curve"] == "predicted") & (curves["token_measure"] == measure)].sort_values("c")
    label = (r"predicted rate $L^{-p(c)}$: exponent $p(c)=\min(1,(\sqrt{1+4/c}-1)/2)$" if measure == "gaussian"
             else r"predicted rate $L^{-1}$: exponent 1 (bounded tokens)")
    ax.plot(curve["c"], curve["exponent"], label=label, **REFERENCE_STYLE)
    model = cells[(cells["metric"] == "output") & (cells["statistic"] == "mean")].sort_values("c")
    if "predicted_finite_range" in model and model["predicted_finite_range"].notna().any():
        ax.plot(model["c"], model["predicted_finite_range"], linestyle="none", marker="x", ms=6, mew=1.4, color="black",
                label="large-tilt model's exponent over the same $L$ (semi-analytic simulation)", zorder=5)
    for metric, ls in (("output", (0, (4, 2))), ("grad_U", (0, (1.5, 1.5)))):
        fit = fits[(fits["metric"] == metric) & (fits["token_measure"] == measure)] if len(fits) else fits
        if fit.empty:
            continue
        row = fit.iloc[0]
        sub = curves[(curves["curve"] == "paper_form") & (curves["metric"] == metric)
                     & (curves["token_measure"] == measure)].sort_values("c")
        ax.plot(sub["c"], sub["exponent"], color="grey", linestyle=ls, linewidth=1.4,
                label=(f"paper form $c_1\\ln L/L^{{c_2/\\sigma^2}}$ ({metric}, $c \\geq {row.min_c:g}$): "
                       f"$\\hat c_2$={row.c2:.2f} [{row.c2_ci_low:.2f}, {row.c2_ci_high:.2f}], curve $\\hat c_2/c$"))
    ax.set_xscale("log")
    ax.set_xlabel(r"tilt strength $c = \sigma^2 u^2$" + ("  ($\\sigma^2 = c$, $U = I$)" if measure == "gaussian" else ""))
    ax.set_ylabel(r"decay exponent $p$  (error $\propto L^{-p}$)")
    ax.set_ylim(0, 1.25)
    ax.set_title(f"{measure} tokens: exponents fitted on the upper half of $L$, 95% bootstrap CI")


def _shared_legend(fig, axes) -> None:
    """One legend under the panels (the measures share their entries): beside each panel it made the figure three
    panels wide per measure."""
    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    order = sorted(entries, key=lambda label: not isinstance(entries[label], ErrorbarContainer))  # the data first
    legend_below(fig, [entries[label] for label in order], order)
