"""Figure `output_concentration` (R2, docs/experiments.md#output_concentration): mean, median, 90% quantile and local exponent of ‖T_L − T_∞‖²."""
from __future__ import annotations

import matplotlib.pyplot as plt

from largeprompt.plots.concentration import draw_concentration_row, read_rate_tables
from largeprompt.plots.style import apply_style, layout, save_figure, suptitle


def plot_output_concentration(inputs, outputs, params=None, rule="plot_output_concentration"):
    apply_style()
    tables = read_rate_tables(inputs)
    measures = list(dict.fromkeys(tables["exponents"]["token_measure"]))
    fig, axes = plt.subplots(len(measures), 3, figsize=(17, 4.3 * len(measures)), squeeze=False)
    for row, measure in zip(axes, measures):
        draw_concentration_row(row, tables, "output", measure)
        row[0].set_title(f"{measure} tokens: " + row[0].get_title(), fontsize=9)
    suptitle(fig, r"R2: finite-prompt outputs concentrate on the limit; predicted mean rate "
             r"$L^{-\min(1,(\sqrt{1+4/c}-1)/2)}$ (up to logs), median rate $L^{-1}$",
             (params or {}).get("run"), fontsize=11)
    layout(fig)
    save_figure(fig, outputs["pdf"], outputs["png"])
