"""Figure `affine_limit` (R1, docs/experiments.md#affine_limit): T_{μ_L}(t·e) against the exact limit V ∇K(U t·e)."""
from __future__ import annotations

import seaborn as sns

from largeprompt.io.parquet_io import read_parquet
from largeprompt.plots.style import REFERENCE_STYLE, apply_style, figure, legend_below, save_figure, suptitle

TITLES = {
    "gaussian": ("Gaussian tokens", r"limit $V(m + S\,U z_q)$: affine"),
    "rademacher": ("Rademacher tokens", r"limit $V\tanh(U z_q)$"),
    "uniform": ("Uniform tokens", r"limit $V\sqrt{3}\,\mathcal{L}(\sqrt{3}\,U z_q)$"),
}


def plot_affine_limit(inputs, outputs, params=None, rule="plot_affine_limit"):
    """One panel per token measure at text width, the prompt lengths and the limit in one legend below them."""
    apply_style()
    data = read_parquet(inputs["bands"])
    measures = list(dict.fromkeys(data["token_measure"]))
    fig = figure("text", 2.9)
    axes = fig.subplots(1, len(measures), squeeze=False)[0]
    lengths = sorted(data["prompt_length"].unique())
    palette = dict(zip(lengths, sns.color_palette("viridis", len(lengths))))
    for ax, name in zip(axes, measures):
        panel = data[data["token_measure"] == name]
        for L, g in panel.groupby("prompt_length"):
            g = g.sort_values("t")
            ax.plot(g["t"], g["finite_prompt_output_mean"], color=palette[L], label=f"L = {L}")
            ax.fill_between(g["t"], g["finite_prompt_output_lo"], g["finite_prompt_output_hi"], color=palette[L],
                            alpha=0.2, linewidth=0)
        limit = panel.drop_duplicates("point").sort_values("t")
        title, formula = TITLES.get(name, (name, "limit"))
        ax.plot(limit["t"], limit["infinite_prompt_output"], label=r"exact limit $V\nabla K(Uz_q)$", **REFERENCE_STYLE)
        ax.set_title(f"{title}\n{formula}")
        ax.set_xlabel(r"$t$  (query $z_q = t\,e$)")
        ax.set_ylabel(r"$T_{\mu_L}(z_q)$" if ax is axes[0] else "")
        lo, hi = limit["infinite_prompt_output"].min(), limit["infinite_prompt_output"].max()
        pad = 0.35 * (hi - lo)
        ax.set_ylim(lo - pad, hi + pad)
    legend_below(fig, *axes[0].get_legend_handles_labels(), title="mean and 90% band over prompts")
    suptitle(fig, "R1: finite-prompt softmax attention converges to $V\\nabla K(Uz_q)$; only the Gaussian limit is affine",
             (params or {}).get("run"))
    save_figure(fig, outputs["pdf"], outputs["png"])
