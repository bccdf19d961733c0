"""Figure `training_vs_prompt_length` (R6, docs/experiments.md#training_vs_prompt_length): final test MSE
against L for softmax and linear attention, every run, the theory over it, the modes of the ok runs, unconverged
and trapped runs, and escape times. Draws only: every number comes from results/<run>/train/training_*.parquet,
icl/bayes_risk.parquet and init_dependence/classes.parquet."""
from __future__ import annotations

import numpy as np

from largeprompt.io.parquet_io import read_parquet
from largeprompt.plots.style import MIN_FONT_PT, REFERENCE_STYLE, apply_style, figure, legend_below, save_figure, suptitle

COLORS = {"softmax": "tab:red", "linear": "tab:blue"}
OFFSET = {"softmax": 0.96, "linear": 1.04}  # runs of the two models side by side at each L
TRAPPED_MARKERS = {"no readout": "^", "worse equilibrium": "v"}
MAX_COUNT_LABELS = 3  # prompt lengths labelled with their ok counts at most (on a panel a third of the text width);
# beyond, the title gives the ranges
COUNT_OFFSETS = {"softmax": 2, "linear": 2 + 1.5 * MIN_FONT_PT}  # points above the axes: the two rows of counts apart
TITLE_PAD = COUNT_OFFSETS["linear"] + 1.5 * MIN_FONT_PT  # the loss panel's title above both rows


def _band(ax, table, column, color, label):
    t = table[table[f"{column}_mean"].notna()].sort_values("prompt_length")
    if t.empty:  # no ok run at any L: nothing to draw, no legend entry
        return
    ax.plot(t["prompt_length"], t[f"{column}_mean"], "-", color=color, label=label, linewidth=1.6)
    ax.fill_between(t["prompt_length"], t[f"{column}_lo"], t[f"{column}_hi"], color=color, alpha=0.25, linewidth=0)


def _runs(ax, runs, table, column, model):
    """ok runs as dots, unconverged runs as open diamonds, trapped runs as open triangles (one marker per reason, with
    the summary's counts of those on a drifting flow), diverged as crosses at the top."""
    color, shared, counts = COLORS[model], runs[runs["stream"] == 0], table[table["model"] == model]
    ok = shared[shared["status"] == "ok"]
    if len(ok):
        ax.scatter(ok["prompt_length"] * OFFSET[model], ok[column], s=10, color=color, alpha=0.6, linewidth=0,
                   label=f"{model}: ok runs ({len(ok)})")
    moving = shared[shared["status"] == "unconverged"]
    if len(moving):
        ax.scatter(moving["prompt_length"] * OFFSET[model], moving[column], s=26, marker="D", facecolors="none",
                   edgecolors=color, linewidth=0.9, label=f"{model}: unconverged, still moving at T ({len(moving)}; not averaged)")
    for reason, marker in TRAPPED_MARKERS.items():
        trapped = shared[(shared["status"] == "trapped") & (shared["trap_reason"] == reason)]
        if len(trapped):
            drifting = int(counts[f"n_trapped_{reason.replace(' ', '_')}_drifting"].sum())
            ax.scatter(trapped["prompt_length"] * OFFSET[model], trapped[column], s=26, marker=marker, facecolors="none",
                       edgecolors=color, linewidth=0.9,
                       label=f"{model}: trapped, {reason} ({len(trapped)}; flow drifts: {drifting})")
    bad = shared[shared["status"] == "diverged"]
    if len(bad):
        ax.scatter(bad["prompt_length"] * OFFSET[model], np.full(len(bad), ax.get_ylim()[1]), marker="x", s=40,
                   color=color, clip_on=False, label=f"{model}: diverged ({len(bad)})")


def _modes(ax, table, model):
    """Where the ok runs split into two modes: a bar at each mode's mean, labelled with its number of runs (below the
    lower bar, above the upper one: never on each other)."""
    split = table[table["n_modes"] == 2]
    for r in split.itertuples():
        for mean, n, va in ((r.lower_mode_mean, r.lower_mode_runs, "top"), (r.upper_mode_mean, r.upper_mode_runs, "bottom")):
            ax.plot([r.prompt_length * 0.88, r.prompt_length * 1.12], [mean, mean], color=COLORS[model], linewidth=2.4)
            ax.annotate(f"{n}", (r.prompt_length * 1.13, mean), fontsize=MIN_FONT_PT, color=COLORS[model], va=va)
    if len(split):
        ax.plot([], [], color=COLORS[model], linewidth=2.4, label=f"{model}: the two modes of the ok runs (runs each)")


def _theory(ax, table, bayes):
    """Bayes risk, R(Γ*), the softmax leading-order optimum where valid, and σ²; a legend entry only if drawn."""
    ax.plot(bayes["prompt_length"], bayes["bayes_risk"], color="black", linewidth=1.2, label="Bayes (ridge) risk")
    ref = table.drop_duplicates("prompt_length").sort_values("prompt_length")
    ax.plot(ref["prompt_length"], ref["optimal_linear_attention_test_risk"], color="tab:blue", linestyle="--",
            linewidth=1.1, label=r"best linear attention $R(\Gamma^*)$")
    valid = ref[ref["softmax_theory_valid"]]
    if len(valid):
        ax.plot(valid["prompt_length"], valid["softmax_leading_order_test_risk"], color="tab:red", linestyle="--",
                linewidth=1.1, label=r"softmax optimum $\sigma^2 + f(\alpha^*)/L$ (leading order)")
    ax.axhline(float(table["noise_variance"].iloc[0]), label=r"noise floor $\sigma^2$", **REFERENCE_STYLE)


def _loss_panel(ax, runs, table, bayes):
    lo = min(float(table["noise_variance"].iloc[0]), float(bayes["bayes_risk"].min()), float(table["final_test_loss_lo"].min()))
    hi = max(float(runs["final_test_loss"].max()), float(table["final_test_loss_hi"].max()), float(bayes["bayes_risk"].max()))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(0.9 * lo, 1.25 * hi)  # every band, run and curve inside the axes
    for model in COLORS:
        t = table[table["model"] == model]
        if len(t):
            _band(ax, t, "final_test_loss", COLORS[model], f"{model}: mean, 95% CI over ok runs")
            _runs(ax, runs[runs["model"] == model], t, "final_test_loss", model)
            _modes(ax, t, model)
    _theory(ax, table, bayes)
    note, labelled = _count_note(ax, table)
    ax.set_title(f"final test loss; {note} (red: softmax, blue: linear)", pad=TITLE_PAD if labelled else None)
    ax.set_xlabel("prompt length $L$")
    ax.set_ylabel("final test MSE")


def _span(counts) -> str:
    lo, hi = int(counts.min()), int(counts.max())
    return str(lo) if lo == hi else f"{lo}–{hi}"


def _count_note(ax, table) -> tuple[str, bool]:
    """ok runs / seeds at the top of the axes, only at the (model, L) where some run is not ok: with 19 prompt
    lengths (the paper run) a count at every L ran into its neighbours, so beyond MAX_COUNT_LABELS such lengths the
    title gives each model's range of ok runs instead. The note for the title, and whether counts were drawn."""
    partial = table[table["n_ok"] < table["n_seeds"]]
    seeds = sorted(set(table["n_seeds"].astype(int)))
    per_l = f"{seeds[0]} seed{'s' if seeds[0] > 1 else ''} per $L$" if len(seeds) == 1 else "seeds per $L$"
    if partial["prompt_length"].nunique() > MAX_COUNT_LABELS:  # labels at most L would overlap: ranges instead
        ranges = [f"{m} {_span(g['n_ok'])}" for m, g in table.groupby("model", sort=False)]
        return f"ok runs / {per_l}: " + ", ".join(ranges), False
    for r in partial.itertuples():
        ax.annotate(f"{int(r.n_ok)}/{int(r.n_seeds)}", (r.prompt_length, ax.get_ylim()[1]), fontsize=MIN_FONT_PT,
                    color=COLORS[r.model], ha="center", va="bottom", xytext=(0, COUNT_OFFSETS[r.model]),
                    textcoords="offset points", annotation_clip=False)
    if partial.empty:
        return f"every run ok ({per_l})", False
    return f"at the top: ok runs / {per_l} where not every run is ok", True


def _ratio_title(table) -> str:
    """Measured over predicted L·excess at the largest L, with the interval of the measured mean (none from one run)."""
    last = table[table["prompt_length"] == table["prompt_length"].max()]
    parts, single = [], False
    for r in last.itertuples():
        if (r.model == "softmax" and not r.softmax_theory_valid) or np.isnan(r.scaled_excess_over_theory_mean):
            continue
        lo, hi = r.scaled_excess_over_theory_lo, r.scaled_excess_over_theory_hi
        single |= not (np.isfinite(lo) and np.isfinite(hi))
        parts.append(f"{r.model} {r.scaled_excess_over_theory_mean:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if np.isfinite(lo) and np.isfinite(hi) else ""))
    L = int(last["prompt_length"].iloc[0])
    return f"at L = {L}, measured / leading-order L·excess:\n" + ("; ".join(parts) if parts else "no prediction") + \
        (" (one run each: no interval)" if single else "")


def _excess_panel(ax, runs, table):
    ok = runs[(runs["status"] == "ok") & (runs["stream"] == 0)]
    ref = table.drop_duplicates("prompt_length").sort_values("prompt_length")
    valid = ref[ref["softmax_theory_valid"]]
    values = [ok["scaled_excess_risk"], table["scaled_excess_risk_lo"], table["scaled_excess_risk_hi"],
              ref["linear_theory_scaled_excess"], valid["softmax_theory_scaled_excess"]]
    lo, hi = np.nanmin([v.min() for v in values if len(v)]), np.nanmax([v.max() for v in values if len(v)])
    pad = 0.08 * (hi - lo)
    ax.set_xscale("log")
    ax.set_ylim(min(0.0, lo - pad), hi + pad)  # every band inside the axes, no clipping
    for model in COLORS:
        t = table[table["model"] == model]
        if len(t):
            _band(ax, t, "scaled_excess_risk", COLORS[model], f"{model}: mean, 95% CI over ok runs")
            r = ok[ok["model"] == model]
            ax.scatter(r["prompt_length"] * OFFSET[model], r["scaled_excess_risk"], s=10, color=COLORS[model], alpha=0.6,
                       linewidth=0)
    ax.plot(ref["prompt_length"], ref["linear_theory_scaled_excess"], color="tab:blue", linestyle="--", linewidth=1.1,
            label=r"$L\,(R(\Gamma^*) - $Bayes$)$")
    if len(valid):
        ax.plot(valid["prompt_length"], valid["softmax_theory_scaled_excess"], color="tab:red", linestyle="--",
                linewidth=1.1, label=r"$L\,(\sigma^2 + f(\alpha^*)/L - $Bayes$)$")
    ax.set_xlabel("prompt length $L$")
    ax.set_ylabel(r"$L\,\cdot$ (test MSE $-$ Bayes risk), ok runs")
    ax.set_title(f"flat in $L$ = excess risk $O(1/L)$; {_ratio_title(table)}")


def _escape_panel(ax, runs):
    shared = runs[(runs["stream"] == 0) & (runs["status"] != "diverged") & runs["escape_time"].notna()]
    for model, color in COLORS.items():
        r = shared[shared["model"] == model]
        for status, reason, marker in (("ok", None, "o"), ("unconverged", None, "D"), *(("trapped", k, m) for k, m in
                                                                                   TRAPPED_MARKERS.items())):
            g = r[(r["status"] == status) & ((r["trap_reason"] == reason) if reason else True)]
            if len(g):  # the loss panel's marks, named in the legend once
                ax.scatter(g["prompt_length"] * OFFSET[model], g["escape_time_ratio"], s=14, marker=marker,
                           facecolors=color if status == "ok" else "none", edgecolors=color)
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1, label="escapes when its $L=\\infty$ flow does")
    if shared.empty:
        ax.text(0.5, 0.7, "no run left the plateau within the horizon", transform=ax.transAxes, ha="center")
    ax.set_xscale("log")
    ratio = shared["escape_time_ratio"]
    if len(ratio) and ratio.max() / ratio.min() > 3:  # a log axis shows no label between 1 and 2 (paper run: 1-1.3)
        ax.set_yscale("log")
    ax.set_xlabel("prompt length $L$")
    ax.set_ylabel("run's escape time / its flow's")
    ax.set_title("escape from the initial plateau: each run against the $R_\\infty$ flow from its initial weights")


def _drift_note(table, classes) -> str:
    """The training seeds on a drifting flow (the summary's count, the same at every (model, L)) beside the drifting
    fraction of torch-default inits."""
    drifting, n = int(table["n_drifting_flows"].max()), int(table["n_seeds"].max())
    d = classes[classes["flow_class"] == "drifts"].iloc[0]
    return (f"drifting $R_\\infty$ flows: {drifting} of {'the ' if n > 1 else ''}{n} training seed{'s' if n > 1 else ''}; "
            f"{int(d['n_flows'])}/{int(d['n_seeds'])} = {100 * d['fraction']:.0f}% "
            f"[{100 * d['fraction_lo']:.0f}, {100 * d['fraction_hi']:.0f}]% of torch-default inits (figure init_dependence)")


def plot_training_vs_prompt_length(inputs, outputs, params=None, rule="plot_training_vs_prompt_length"):
    """Three panels at text width; every entry of their legends, once, in one legend below them."""
    apply_style()
    runs, table = read_parquet(inputs["runs"]), read_parquet(inputs["summary"])
    bayes = read_parquet(inputs["bayes_risk"]).sort_values("prompt_length")
    classes = read_parquet(inputs["init_classes"])
    fig = figure("text", 5.5)
    axes = fig.subplots(1, 3)
    _loss_panel(axes[0], runs, table, bayes)
    _excess_panel(axes[1], runs, table)
    _escape_panel(axes[2], runs)
    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    legend_below(fig, list(entries.values()), list(entries))
    suptitle(fig, "R6: trained softmax attention approaches linear attention as the prompt grows\n"
             + _drift_note(table, classes),
             (params or {}).get("run"))
    save_figure(fig, outputs["pdf"], outputs["png"])
