"""Shared figure style and saving (PDF for the paper, PNG for the report), at print size
(docs/architecture.md#print-size): every figure is :data:`TEXT_WIDTH_IN` or :data:`COLUMN_WIDTH_IN` wide, its fonts
at least :data:`MIN_FONT_PT`, and :func:`save_figure` wraps titles, axis labels and legend labels to the room they
have before it saves, so no text leaves the canvas."""
from __future__ import annotations

import math
import weakref
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.legend  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.layout_engine import ConstrainedLayoutEngine  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from largeprompt.io import figure_provenance  # noqa: E402

TEXT_WIDTH_IN = 6.75  # ICML: the full text width
COLUMN_WIDTH_IN = 3.25  # ICML: one column
TEXT_HEIGHT_IN = 9.0  # ICML: the text height, the tallest a figure can print
WIDTHS_IN = {"text": TEXT_WIDTH_IN, "column": COLUMN_WIDTH_IN}
MIN_FONT_PT = 7  # no text smaller, at the printed size: ticks, legends, notes
LABEL_FONT_PT = 8  # axis labels and panel titles
TITLE_FONT_PT = 9  # the figure's title
DPI = 300  # PNG pixels per inch: print quality
REFERENCE_STYLE = dict(color="black", linestyle="--", linewidth=1.2)  # limits, predictions and optima the data is compared with
NOTE_GID = "run-note"


def apply_style() -> None:
    """Seaborn's paper theme at the print sizes above; figures are saved at their own size (no tight bbox)."""
    sns.set_theme(context="paper", style="whitegrid")
    plt.rcParams.update({
        "font.size": LABEL_FONT_PT, "axes.titlesize": LABEL_FONT_PT, "axes.labelsize": LABEL_FONT_PT,
        "xtick.labelsize": MIN_FONT_PT, "ytick.labelsize": MIN_FONT_PT, "legend.fontsize": MIN_FONT_PT,
        "legend.title_fontsize": MIN_FONT_PT, "figure.titlesize": TITLE_FONT_PT, "figure.labelsize": LABEL_FONT_PT,
        "figure.dpi": DPI, "savefig.dpi": DPI, "savefig.bbox": None, "pdf.fonttype": 42,
    })


def figure(width: str, height: float):
    """A figure ``width`` ("text": :data:`TEXT_WIDTH_IN`, "column": :data:`COLUMN_WIDTH_IN`) wide and ``height`` inches
    tall (at most :data:`TEXT_HEIGHT_IN`: a page), laid out by constrained layout; add panels with ``fig.subplots`` or
    ``fig.subfigures``."""
    if height > TEXT_HEIGHT_IN:
        raise ValueError(f"a figure {height:.2f} in tall does not fit a page ({TEXT_HEIGHT_IN} in): give it fewer rows")
    return plt.figure(figsize=(WIDTHS_IN[width], height), layout="constrained")


def row_height(n_rows: int, most: float, fixed: float) -> float:
    """The height of each of ``n_rows`` rows of panels: ``most`` inches, or less where the rows and ``fixed`` inches
    (title, legend) would not fit a page (:data:`TEXT_HEIGHT_IN`)."""
    return min(most, (TEXT_HEIGHT_IN - fixed) / n_rows)


PUBLISHED_RUNS = ("default", "paper")  # the configurations whose figures are results; any other run says so


def run_note(run: str | None) -> str:
    """'' for the default and paper runs; otherwise a line saying whose figure this is (README.md, "Runs")."""
    if run is None or run in PUBLISHED_RUNS:
        return ""
    return f"run '{run}': not the default or paper configuration, a test or overlay run (config/{run}.yaml)"


def suptitle(fig, text: str, run: str | None = None, **kwargs) -> None:
    """The figure's title, with :func:`run_note` above it in red when the run is not published; :func:`save_figure`
    places both at the top and keeps the panels below them."""
    note = run_note(run)
    fig.suptitle(text, **kwargs)
    if note:
        fig.text(0.5, 1.0, note, ha="center", va="top", color="tab:red", fontsize=MIN_FONT_PT, fontweight="bold",
                 gid=NOTE_GID)


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


_SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a wrapped text's own words, so it rewraps


def _points(fig, pixels: float) -> float:
    return pixels * 72.0 / fig.dpi


def _text_width(fig, text: str, like: Text, renderer) -> float:
    """Width in points of ``text`` set in ``like``'s font."""
    probe = Text(0, 0, text, fontproperties=like.get_fontproperties())
    probe.set_figure(fig)
    return _points(fig, probe.get_window_extent(renderer).width) if text else 0.0


def _words(line: str) -> list[str]:
    """The words of a line, a mathtext group ``$...$`` kept whole."""
    words, group = [], []
    for word in line.split(" "):
        group.append(word)
        if " ".join(group).replace(r"\$", "").count("$") % 2 == 0:
            words.append(" ".join(group))
            group = []
    return words + ([" ".join(group)] if group else [])


def wrap_text(fig, text: str, width_pt: float, like: Text, renderer) -> str:
    """``text`` broken at spaces into lines at most ``width_pt`` points wide in ``like``'s font (a word wider than
    that keeps a line of its own); its own line breaks are kept."""
    lines = []
    for hard in text.split("\n"):
        line = ""
        for word in _words(hard):
            longer = f"{line} {word}" if line else word
            if line and _text_width(fig, longer, like, renderer) > width_pt:
                lines.append(line)
                line = word
            else:
                line = longer
        lines.append(line)
    return "\n".join(lines)


def _legend_room(legend, width_pt: float) -> tuple[float, float]:
    """(label, title) widths that keep ``legend`` within ``width_pt``: its borders, pads, handles and column
    spacing, in units of its font size as matplotlib lays it out, taken off."""
    size, ncols = legend._fontsize, legend._ncols
    inner = width_pt - 2 * (legend.borderpad + legend.borderaxespad) * size
    label = (inner - (ncols - 1) * legend.columnspacing * size) / ncols - (legend.handlelength + legend.handletextpad) * size
    return label, inner


def _managed(fig) -> list[tuple[Text, object]]:
    """Every text :func:`fit_text` wraps, each with what bounds it: the figure (its title, the run note), an
    Axes (its title and x label by width, its y label by height: ("height", ax)), or a legend."""
    out = [(t, fig) for t in [fig._suptitle, *fig.texts] if t is not None and (t is fig._suptitle or t.get_gid() == NOTE_GID)]
    for ax in fig.axes:
        out += [(ax.title, ax), (ax.xaxis.label, ax), (ax.yaxis.label, ("height", ax))]
    for legend in fig.findobj(matplotlib.legend.Legend):
        out += [(t, legend) for t in [*legend.get_texts(), legend.get_title()]]
    return [(t, bound) for t, bound in out if t.get_visible()]


def _room(fig, text: Text, bound) -> float:
    """The width in points ``text`` may take (see :func:`_managed`)."""
    if isinstance(bound, tuple):
        return _points(fig, bound[1].bbox.height)
    if isinstance(bound, matplotlib.legend.Legend):
        parent = bound.parent
        label, title = _legend_room(bound, _points(fig, parent.bbox.width))
        return title if text is bound.get_title() else label
    if bound is fig:
        return _points(fig, fig.bbox.width) - 2 * 72 * _pads(fig)[0]
    return _points(fig, bound.bbox.width)


def _pads(fig) -> tuple[float, float]:
    """(w_pad, h_pad) of the figure's constrained layout in inches (matplotlib's defaults without one)."""
    engine = fig.get_layout_engine()
    params = engine.get() if isinstance(engine, ConstrainedLayoutEngine) else {}
    return params.get("w_pad", 3 / 72), params.get("h_pad", 3 / 72)


def _place_title(fig, renderer) -> None:
    """The run note at the top, the title under it, and the panels laid out below both (constrained layout's
    ``rect``; it keeps room only for a title it places itself, and none for a note)."""
    engine = fig.get_layout_engine()
    if not isinstance(engine, ConstrainedLayoutEngine):
        return
    top = 1 - _pads(fig)[1] / fig.get_figheight()
    for text in [t for t in fig.texts if t.get_gid() == NOTE_GID] + [fig._suptitle]:
        if text is not None and text.get_text():
            text.set_in_layout(False)  # placed here, not by constrained layout
            text.set_y(top)
            text.set_va("top")
            top -= text.get_window_extent(renderer).height / fig.bbox.height
    engine.set(rect=(0, 0, 1, top))


def fit_text(fig, passes: int = 6) -> None:
    """Wrap every text of :func:`_managed` to its room: laid out once with them empty (the panels at their largest),
    then wrapped and laid out again until no text changes (at most ``passes`` times)."""
    managed = _managed(fig)
    for text, _ in managed:
        _SOURCES.setdefault(text, text.get_text())
        text.set_text("")
    renderer = fig.canvas.get_renderer()
    for _ in range(passes):
        fig.draw_without_rendering()
        before = [text.get_text() for text, _ in managed]
        for text, bound in managed:
            text.set_text(wrap_text(fig, _SOURCES[text], _room(fig, text, bound), text, renderer))
        _place_title(fig, renderer)
        if before == [text.get_text() for text, _ in managed]:
            return


def legend_columns(container, labels, fontsize: float = MIN_FONT_PT, most: int = 6) -> int:
    """The number of columns that gives the shortest legend spanning ``container`` (a figure, subfigure or axes),
    its labels wrapped to the column width (ties: the fewer columns)."""
    fig = container.get_figure(root=True)
    renderer, like = fig.canvas.get_renderer(), Text(0, 0, "", fontsize=fontsize)
    probe = matplotlib.legend.Legend(container, [], [], fontsize=fontsize)
    best = (math.inf, 1)
    for ncols in range(1, min(most, len(labels)) + 1):
        probe._ncols = ncols
        room = _legend_room(probe, _points(fig, container.bbox.width))[0]
        lines = [wrap_text(fig, label, room, like, renderer).count("\n") + 1 for label in labels]
        per = -(-len(lines) // ncols)
        height = max(sum(lines[i:i + per]) for i in range(0, len(lines), per))
        best = min(best, (height, ncols))
    return best[1]


def legend_below(container, handles, labels, **kwargs):
    """A legend under the panels of ``container`` (a figure or subfigure), in :func:`legend_columns` columns;
    constrained layout keeps room for it."""
    kwargs.setdefault("ncols", legend_columns(container, labels))
    return container.legend(handles, labels, loc="outside lower center", frameon=False, **kwargs)


def legend_panel(ax, handles, labels, **kwargs):
    """A grid cell that holds a legend instead of a plot (no empty panels): the legend fills ``ax`` from its top
    and leaves the layout alone (the figure's height gives it room; tests/test_print_size.py checks it fits)."""
    ax.axis("off")
    legend = ax.legend(handles, labels, loc="upper left", mode="expand", borderaxespad=0, frameon=False, **kwargs)
    legend.set_in_layout(False)
    return legend


def save_figure(fig, pdf_path: str | Path, png_path: str | Path) -> None:
    """Save ``fig`` as PDF and PNG at its own size (docs/architecture.md#print-size) with the running job's
    provenance (docs/architecture.md#figure-provenance) and no timestamps, so reruns on the same inputs give
    identical PDFs, with the minor labels of its log axes tidied (:func:`tidy_log_axis`) and its texts wrapped to
    their room (:func:`fit_text`)."""
    for ax in fig.axes:
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale == "log":
                tidy_log_axis(axis)
    fit_text(fig)
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
