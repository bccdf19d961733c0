"""Figure `balanced_flow` (R5, docs/experiments.md#balanced_flow, paper Thm 5.1): R∞(t), b(t) and ‖A(t)‖_F from balanced
starts, to the Bayes point."""
from __future__ import annotations

import seaborn as sns

from largeprompt.io.parquet_io import read_parquet
from largeprompt.plots.style import REFERENCE_STYLE, apply_style, figure, legend_below, save_figure, suptitle


def plot_balanced_flow(inputs, outputs, params=None, rule="plot_balanced_flow"):
    """Three panels at text width; the starts and b* in one legend below them."""
    apply_style()
    data = read_parquet(inputs["flow"])
    alphas = sorted(data["alpha"].unique())
    palette = dict(zip(alphas, sns.color_palette("viridis", len(alphas))))
    b_star = float(data["b_star"].iloc[0])
    fig = figure("text", 2.9)
    axes = fig.subplots(1, 3)
    for alpha in alphas:
        run = data[data["alpha"] == alpha]
        kw = dict(color=palette[alpha], label=rf"$\alpha = {alpha:g}$")
        axes[0].plot(run["time"], run["infinite_prompt_risk"], **kw)
        axes[1].plot(run["time"], run["b"], **kw)
        axes[1].plot(run["time"], run["norm_A"], color=palette[alpha], linestyle=":", linewidth=2.0, alpha=0.7)
        axes[2].plot(run["time"], run["distance_to_bayes"], **kw)
    axes[0].set_yscale("log")
    axes[0].set_title(r"risk $R_\infty(A, b) = \frac{1}{2}\mathrm{tr}((b\Sigma A - I)\Sigma(b\Sigma A - I)^\top)$")
    axes[0].set_ylabel(r"$R_\infty(t)$ (minimum 0)")
    axes[1].axhline(b_star, label=rf"$b^* = \|A^*\|_F = \mathrm{{tr}}(\Sigma^{{-2}})^{{1/4}} = {b_star:.3f}$", **REFERENCE_STYLE)
    axes[1].set_ylabel(r"$b(t)$ (solid), $\|A(t)\|_F$ (dotted)")
    axes[1].set_title(r"scale $b = \|A\|_F$ (balancedness $b^2 - \|A\|_F^2 = 0$ is conserved)")
    axes[2].set_yscale("log")
    axes[2].set_ylabel(r"$\sqrt{(b - b^*)^2 + \|A - A^*\|_F^2}$")
    axes[2].set_title("distance to the Bayes point")
    for ax in axes:
        ax.set_xlabel(r"time $t$")
    handles, labels = axes[0].get_legend_handles_labels()
    legend_below(fig, handles + axes[1].get_lines()[-1:], labels + axes[1].get_legend_handles_labels()[1][-1:],
                 title=r"start $b = \|A\|_F = \alpha$")
    suptitle(fig, r"R5: gradient flow from balanced starts reaches the Bayes point $b^*$, "
                 r"$A^* = \mathrm{tr}(\Sigma^{-2})^{-1/4}\Sigma^{-1}$",
             (params or {}).get("run"))
    save_figure(fig, outputs["pdf"], outputs["png"])
