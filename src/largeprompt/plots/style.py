"""Shared figure style and saving (PDF for the paper, PNG for the report)."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from largeprompt.io import figure_provenance  # noqa: E402

REFERENCE_STYLE = dict(color="black", linestyle="--", linewidth=1.4)  # limits, predictions and optima the data is compared with


def apply_style() -> None:
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.1)
    plt.rcParams.update({"figure.dpi": 110, "savefig.dpi": 200, "savefig.bbox": "tight", "pdf.fonttype": 42})


PUBLISHED_RUNS = ("default", "paper")  # the configurations whose figures are results; any other run says so


def run_note(run: str | None) -> str:
    """'' for the default and paper runs; otherwise a line saying whose figure this is (README.md, "Runs")."""
    if run is None or run in PUBLISHED_RUNS:
        return ""
    return f"run '{run}': not the default or paper configuration, a test or overlay run (config/{run}.yaml)"


def suptitle(fig, text: str, run: str | None = None, **kwargs) -> None:
    """The figure's title, with :func:`run_note` on a line of its own in red when the run is not published."""
    note = run_note(run)
    fig.suptitle(text, **kwargs)
    if note:
        fig.text(0.5, 1.0, note, ha="center", va="bottom", color="tab:red", fontsize=9, fontweight="bold")


def layout(fig, title_inches: float = 0.5) -> None:
    """``tight_layout`` with ``title_inches`` kept free at the top for the suptitle (on tall figures plain
    tight_layout let the first row's titles run into it)."""
    fig.tight_layout(rect=(0, 0, 1, 1 - title_inches / fig.get_figheight()))


def short_number(value: float) -> str:
    """A tick label: plain for 0.01 ≤ |v| < 10⁴ ('0.2', '500'), else 'a×10ᵏ' in mathtext."""
    if value == 0 or 1e-2 <= abs(value) < 1e4:
        return f"{value:g}"
    exponent = math.floor(math.log10(abs(value)))
    return rf"${value / 10**exponent:g}\times10^{{{exponent}}}$"


def tidy_log_axis(axis) -> None:
    """Minor tick labels of a base-10 log axis, short and never running into each other: none when it spans 1.5
    decades or more (one decade for labels a×10ᵏ; the powers of ten are labelled), at 2 and 5 times a power of ten down to half a decade, and at
    2, 3, 4, 5, 6 and 8 times a power of ten on a shorter axis."""
    lo, hi = sorted(axis.get_view_interval())
    if lo <= 0 or getattr(axis.get_transform(), "base", 10) != 10:
        return
    decades = math.log10(hi / lo)
    wide = lo < 1e-2 or hi >= 1e4  # labels 'a×10ᵏ', wider than plain numbers
    if decades >= (1.0 if wide else 1.5):
        axis.set_minor_formatter(NullFormatter())
        return
    shown = (2.0, 5.0) if decades >= 0.5 else (2.0, 3.0, 4.0, 5.0, 6.0, 8.0)

    def label(value, _pos):
        leading = round(value / 10 ** math.floor(math.log10(value) + 1e-9), 6)
        return short_number(value) if leading in shown else ""

    axis.set_minor_formatter(FuncFormatter(label))
    axis.set_major_formatter(FuncFormatter(lambda value, _pos: short_number(value)))


def save_figure(fig, pdf_path: str | Path, png_path: str | Path) -> None:
    """Save ``fig`` as PDF and PNG with the running job's provenance (docs/architecture.md#figure-provenance) and no
    timestamps, so reruns on the same inputs give identical PDFs, with the minor labels of its log axes tidied
    (:func:`tidy_log_axis`)."""
    for ax in fig.axes:
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale == "log":
                tidy_log_axis(axis)
    Path(pdf_path).parent.mkdir(parents=True, exist_ok=True)
    record = figure_provenance.current()  # set by the job that runs this plot (io.runlog.run_stage)
    fig.savefig(pdf_path, metadata=figure_provenance.pdf_metadata(record))
    fig.savefig(png_path, metadata=figure_provenance.png_metadata(record))
    plt.close(fig)


def corrected_slope_text(fit) -> str:
    """"; floors subtracted: s [lo, hi]" of a slopes row (docs/theory.md#floor-corrected-gap), or "" where it has no
    floor-corrected fit."""
    if not math.isfinite(float(fit.get("corrected_slope", math.nan))):
        return ""
    return f"; floors subtracted: {fit['corrected_slope']:.2f} [{fit['corrected_slope_lo']:.2f}, {fit['corrected_slope_hi']:.2f}]"
