"""Figure `init_dependence` (docs/experiments.md#init_dependence): how often the R∞ flow from a torch-default init
converges, drifts or stays on the plateau, when it escapes, and what predicts the class. Draws only: every number
comes from results/<run>/init_dependence/*.parquet."""
from __future__ import annotations

import numpy as np

from largeprompt.io.parquet_io import read_parquet
from largeprompt.plots.style import MIN_FONT_PT, apply_style, figure, save_figure, suptitle

CLASS_COLORS = {"converges": "tab:green", "drifts": "tab:purple", "plateau": "tab:gray"}


def _fractions(ax, classes):
    x = np.arange(len(classes))
    frac = classes["fraction"].to_numpy()
    err = np.vstack([frac - classes["fraction_lo"], classes["fraction_hi"] - frac])
    ax.bar(x, frac, color=[CLASS_COLORS[c] for c in classes["flow_class"]], alpha=0.8)
    ax.errorbar(x, frac, yerr=err, fmt="none", color="black", capsize=5, linewidth=1.2)
    for xi, r in zip(x, classes.itertuples()):
        ax.annotate(f"{r.n_flows}/{r.n_seeds}", (xi, r.fraction_hi), ha="center", va="bottom", fontsize=MIN_FONT_PT,
                    xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, classes["flow_class"])
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("fraction of inits (95% Wilson interval)")
    changed = int(classes["n_changed_at_doubled_horizon"].sum())
    ax.set_title(f"class of each seed's $R_\\infty$ flow at $T$ (doubling $T$ changes {changed} of "
                 f"{int(classes['n_seeds'].iloc[0])} classes)")


def _escape_times(ax, flows):
    escaped = flows[flows["escape_time"].notna()]
    bins = np.geomspace(max(escaped["escape_time"].min(), 0.5) / 1.2, escaped["escape_time"].max() * 1.2, 25)
    for kind, color in CLASS_COLORS.items():
        times = escaped.loc[escaped["flow_class"] == kind, "escape_time"]
        if len(times):
            ax.hist(times, bins=bins, color=color, alpha=0.6, label=f"{kind} ({len(times)})")
    ax.set_xscale("log")
    ax.set_xlabel("escape time (first $t$ with $R_\\infty$ below the plateau midpoint)")
    ax.set_ylabel("inits")
    ax.set_title("escape from the initial plateau, by class")
    ax.legend()


def _route(ax, flows):
    escaped = flows[flows["escape_time"].notna()]
    for kind, color in CLASS_COLORS.items():
        g = escaped[escaped["flow_class"] == kind]
        if len(g):
            ax.scatter(g["escape_time"], g["route_ratio_half_escape"], s=12, color=color, alpha=0.7, label=kind)
    ax.axhline(1.0, color="black", linestyle=":", linewidth=0.9)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("escape time")
    ax.set_ylabel(r"$\|m_y\|\|u_x\| \,/\, (|u_y|\,\|M_x\|_F)$ at half the escape time")
    ax.set_title("which term of $C_1$ carries the escape: rank-one $m_y u_x^\\top\\Lambda$ (above 1) or "
                 "$u_y M_x^\\top\\Lambda$ (below)")
    ax.legend()


def _predictors(ax, predictors):
    y = np.arange(len(predictors))[::-1]
    acc = predictors["accuracy"].to_numpy()
    err = np.vstack([acc - predictors["accuracy_lo"], predictors["accuracy_hi"] - acc])
    colors = ["tab:blue" if c == "init" else "tab:orange" for c in predictors["computed"]]
    ax.barh(y, acc, color=colors, alpha=0.75)
    ax.errorbar(acc, y, xerr=err, fmt="none", color="black", capsize=3, linewidth=1)
    base = float(predictors["majority_baseline"].iloc[0])
    ax.axvline(base, color="black", linestyle="--", linewidth=1.1)
    labels = [f"{p} (along the flow)" if c == "flow" else p for p, c in zip(predictors["predictor"], predictors["computed"])]
    ax.set_yticks(y, labels)
    ax.set_xlim(0, 1.02)
    ax.set_xlabel(f"cross-validated accuracy, drifts vs converges ({int(predictors['n_flows'].iloc[0])} flows)")
    ax.set_title(f"what predicts drift: quantities at init (blue) and read off the flow (orange); dashed: always "
                 f"guessing the majority class ({base:.2f})")


def plot_init_dependence(inputs, outputs, params=None, rule="plot_init_dependence"):
    """Three panels at text width, the predictors' accuracies under them."""
    apply_style()
    flows, classes = read_parquet(inputs["flows"]), read_parquet(inputs["classes"])
    predictors = read_parquet(inputs["predictors"])
    fig = figure("text", 5.4)
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.15, 1])  # own layouts: the long predictor names stay below
    axes = top.subplots(1, 3, width_ratios=[0.8, 1, 1])
    _fractions(axes[0], classes)
    _escape_times(axes[1], flows)
    _route(axes[2], flows)
    _predictors(bottom.subplots(), predictors)
    suptitle(fig, "Which torch-default inits drift: the $R_\\infty$ flow of the §6 model from "
             f"{len(flows)} consecutive init seeds",
             (params or {}).get("run"))
    save_figure(fig, outputs["pdf"], outputs["png"])
