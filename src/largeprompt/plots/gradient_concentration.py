"""Figure `gradient_concentration` (R3, docs/experiments.md#gradient_concentration): the concentration panels for the
U and V Jacobians (docs/theory.md#jacobians)."""
from __future__ import annotations

from largeprompt.plots.concentration import concentration_figure, read_rate_tables
from largeprompt.plots.style import apply_style, save_figure


def plot_gradient_concentration(inputs, outputs, params=None, rule="plot_gradient_concentration"):
    apply_style()
    tables = read_rate_tables(inputs)
    fig = concentration_figure(tables, ("grad_U", "grad_V"),
                               "R3: gradients wrt U and V concentrate like the outputs (paper Prop. 3.4; "
                               "squared Frobenius error of the Jacobians)", (params or {}).get("run"))
    save_figure(fig, outputs["pdf"], outputs["png"])
