"""Figure `gradient_concentration` (R3, docs/experiments.md#gradient_concentration): the concentration panels for the
U and V Jacobians (docs/theory.md#jacobians)."""
from __future__ import annotations

import matplotlib.pyplot as plt

from largeprompt.plots.concentration import draw_concentration_row, read_rate_tables
from largeprompt.plots.style import apply_style, layout, save_figure, suptitle


def plot_gradient_concentration(inputs, outputs, params=None, rule="plot_gradient_concentration"):
    apply_style()
    tables = read_rate_tables(inputs)
    measures = list(dict.fromkeys(tables["exponents"]["token_measure"]))
    rows = [(m, metric) for m in measures for metric in ("grad_U", "grad_V")]
    fig, axes = plt.subplots(len(rows), 3, figsize=(17, 4.3 * len(rows)), squeeze=False)
    for row, (measure, metric) in zip(axes, rows):
        draw_concentration_row(row, tables, metric, measure)
        row[0].set_title(f"{measure} tokens: " + row[0].get_title(), fontsize=9)
    suptitle(fig, "R3: gradients wrt U and V concentrate like the outputs (paper Prop. 3.4; squared Frobenius error of the Jacobians)",
             (params or {}).get("run"), fontsize=11)
    layout(fig)
    save_figure(fig, outputs["pdf"], outputs["png"])
