"""Figure `gradient_concentration` (R3, docs/experiments.md#gradient_concentration): the concentration panels for the
U and V Jacobians (docs/theory.md#jacobians)."""
from __future__ import annotations

from largeprompt.plots.concentration import ROW_HEIGHT_IN, draw_concentration_row, read_rate_tables
from largeprompt.plots.style import apply_style, figure, save_figure, suptitle


def plot_gradient_concentration(inputs, outputs, params=None, rule="plot_gradient_concentration"):
    apply_style()
    tables = read_rate_tables(inputs)
    measures = list(dict.fromkeys(tables["exponents"]["token_measure"]))
    rows = [(m, metric) for m in measures for metric in ("grad_U", "grad_V")]
    fig = figure("text", ROW_HEIGHT_IN * len(rows) + 0.4)
    for row, (measure, metric) in zip(fig.subfigures(len(rows), 1, squeeze=False)[:, 0], rows):
        first = draw_concentration_row(row, tables, metric, measure)[0]
        first.set_title(f"{measure} tokens: " + first.get_title())
    suptitle(fig, "R3: gradients wrt U and V concentrate like the outputs (paper Prop. 3.4; squared Frobenius error of the Jacobians)",
             (params or {}).get("run"))
    save_figure(fig, outputs["pdf"], outputs["png"])
