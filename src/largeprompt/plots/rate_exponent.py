"""Figure `rate_exponent` (R2, R3, docs/experiments.md#rate_exponent): fitted decay exponents against c with the
predicted exponent min(1, 1/(2c)) and the paper-form fit (paper Prop. 3.1).

Every curve is a row of rates.parquet (``predicted_exponent_curve``, ``paper_form_exponent_curve``, written by
:mod:`largeprompt.stages.rate_tables`); this module only draws.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

from largeprompt.io.parquet_io import read_parquet
from largeprompt.plots.concentration import METRIC_LABELS
from largeprompt.plots.style import REFERENCE_STYLE, apply_style, save_figure, suptitle

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
        curve = rates[(rates["quantity"] == "predicted_exponent_curve") & (rates["measure"] == measure)].sort_values("c")
        label = (r"predicted rate $L^{-\min(1,\,1/(2c))}$: exponent $\min(1, 1/(2c))$" if measure == "gaussian"
                 else r"predicted rate $L^{-1}$: exponent 1 (bounded tokens)")
        ax.plot(curve["c"], curve["estimate"], label=label, **REFERENCE_STYLE)
        for metric, ls in (("output", (0, (4, 2))), ("grad_U", (0, (1.5, 1.5)))):
            mine = (rates["metric"] == metric) & (rates["measure"] == measure)
            c2 = rates[(rates["quantity"] == "paper_form_c2") & mine]
            if c2.empty:
                continue
            row = c2.iloc[0]
            sub = rates[(rates["quantity"] == "paper_form_exponent_curve") & mine].sort_values("c")
            ax.plot(sub["c"], sub["estimate"], color="grey", linestyle=ls, linewidth=1.4,
                    label=(f"paper form $c_1\\ln L/L^{{c_2/\\sigma^2}}$ ({metric}, $c \\geq {row.c:g}$): "
                           f"$\\hat c_2$={row.estimate:.2f} [{row.ci_low:.2f}, {row.ci_high:.2f}], curve $\\hat c_2/c$"))
        ax.set_xscale("log")
        ax.set_xlabel(r"tilt strength $c = \sigma^2 u^2$" + ("  ($\\sigma^2 = c$, $U = I$)" if measure == "gaussian" else ""))
        ax.set_ylabel(r"decay exponent $p$  (error $\propto L^{-p}$)")
        ax.set_ylim(0, 1.25)
        ax.set_title(f"{measure} tokens: exponents fitted on the upper half of the $L$ grid, 95% bootstrap CI", fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    suptitle(fig, "R2/R3: the mean error rate slows down as the tilt grows; the median keeps rate 1",
             (params or {}).get("run"), fontsize=11)
    fig.tight_layout()
    save_figure(fig, outputs["pdf"], outputs["png"])
