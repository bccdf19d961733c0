"""Figure `output_concentration` (R2, docs/experiments.md#output_concentration): mean, median, 90% quantile and local exponent of ‖T_L − T_∞‖²."""
from __future__ import annotations

from largeprompt.plots.concentration import concentration_figure, read_rate_tables
from largeprompt.plots.style import apply_style, save_figure


def plot_output_concentration(inputs, outputs, params=None, rule="plot_output_concentration"):
    apply_style()
    tables = read_rate_tables(inputs)
    fig = concentration_figure(tables, ("output",),
                               r"R2: finite-prompt outputs concentrate on the limit; predicted mean rate "
                               r"$L^{-\min(1,(\sqrt{1+4/c}-1)/2)}$ (up to logs), median rate $L^{-1}$",
                               (params or {}).get("run"))
    save_figure(fig, outputs["pdf"], outputs["png"])
