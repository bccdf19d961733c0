"""Figure `rate_exponent` (R2, R3, SPEC §3.2): fitted decay exponents against c with the F4 curve and the paper-form fit.

The theory curves come from :mod:`largeprompt.rates` (σ² = c for the Gaussian sweep, so ĉ₂/σ² = ĉ₂/c).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

from ..parquet_io import read_parquet
from ..rates import paper_form_exponent, predicted_exponent
from .concentration import METRIC_LABELS
from .style import THEORY_STYLE, apply_style, save_figure

MARKERS = {"output": "o", "grad_U": "s", "grad_V": "^"}
OFFSETS = {"output": 0.96, "grad_U": 1.0, "grad_V": 1.04}  # small horizontal dodge, display only


def plot_rate_exponent(inputs, outputs, params=None, rule="plot_rate_exponent"):
    apply_style()
    rates = read_parquet(inputs["rates"])
    exps = rates[rates["quantity"] == "exponent"]
    measures = list(dict.fromkeys(exps["measure"]))
    fig, axes = plt.subplots(1, len(measures), figsize=(10.5 * len(measures), 4.6), squeeze=False)
    colours = dict(zip(MARKERS, sns.color_palette("deep", 3)))
    for ax, measure in zip(axes[0], measures):
        cells = exps[exps["measure"] == measure]
        for metric in MARKERS:
            for stat, fill in (("mean", True), ("median", False)):
                sel = cells[(cells["metric"] == metric) & (cells["statistic"] == stat)].sort_values("c")
                if sel.empty:
                    continue
                x = sel["c"].to_numpy() * OFFSETS[metric]
                err = np.vstack([sel["estimate"] - sel["ci_low"], sel["ci_high"] - sel["estimate"]])
                ax.errorbar(x, sel["estimate"], yerr=err, color=colours[metric], marker=MARKERS[metric], ms=5,
                            mfc=colours[metric] if fill else "white", linestyle="-" if fill else ":", linewidth=1, capsize=2,
                            label=f"{stat} of {METRIC_LABELS[metric]}")
        grid = np.geomspace(cells["c"].min() * 0.8, cells["c"].max() * 1.25, 200)
        f4_label = r"F4 prediction $\min(1, 1/(2c))$" if measure == "gaussian" else "prediction 1 (bounded tokens)"
        ax.plot(grid, predicted_exponent(grid, measure), label=f4_label, **THEORY_STYLE)
        for metric, ls in (("output", (0, (4, 2))), ("grad_U", (0, (1.5, 1.5)))):
            c2 = rates[(rates["quantity"] == "paper_form_c2") & (rates["metric"] == metric) & (rates["measure"] == measure)]
            if c2.empty:
                continue
            row = c2.iloc[0]
            sub = grid[grid >= row.c * 0.9]
            ax.plot(sub, paper_form_exponent(row.estimate, sub), color="grey", linestyle=ls, linewidth=1.4,
                    label=(f"paper form $c_1\\ln L/L^{{c_2/\\sigma^2}}$ ({metric}, $c \\geq {row.c:g}$): "
                           f"$\\hat c_2$={row.estimate:.2f} [{row.ci_low:.2f}, {row.ci_high:.2f}], curve $\\hat c_2/c$"))
        ax.set_xscale("log")
        ax.set_xlabel(r"tilt strength $c = \sigma^2 u^2$" + ("  ($\\sigma^2 = c$, $U = I$)" if measure == "gaussian" else ""))
        ax.set_ylabel(r"decay exponent $p$  (error $\propto L^{-p}$)")
        ax.set_ylim(0, 1.25)
        ax.set_title(f"{measure} tokens: exponents fitted on the upper half of the $L$ grid, 95% bootstrap CI", fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("R2/R3: the mean error rate slows down as the tilt grows; the median keeps rate 1", fontsize=11)
    fig.tight_layout()
    save_figure(fig, outputs["pdf"], outputs["png"])
