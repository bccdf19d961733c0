"""Log-axis tick labels (src/largeprompt/plots/style.py, tidy_log_axis): on any span, from a fraction of a decade to
many decades, the labels drawn never overlap and at least two are drawn. Print size (docs/architecture.md#print-size):
a figure is saved exactly its width class wide, and wrapped text fits its room with mathtext kept whole (every figure
of the smoke run: tests/test_print_size.py)."""
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text
from PIL import Image

from largeprompt.plots import style
from largeprompt.plots.style import apply_style, short_number, tidy_log_axis


def _drawn_labels(axis, renderer):
    ticks = axis.get_major_ticks() + axis.get_minor_ticks()
    lo, hi = sorted(axis.get_view_interval())
    boxes = []
    for tick in ticks:
        if tick.label1.get_visible() and tick.label1.get_text() and lo <= tick.get_loc() <= hi:
            boxes.append(tick.label1.get_window_extent(renderer))
    return boxes


@pytest.mark.parametrize("lo, hi", [(0.2, 0.45), (0.3, 0.6), (200, 3000), (10, 1000), (1e-4, 3e-3), (1, 1e5), (900, 1100)])
def test_log_tick_labels_never_overlap(lo, hi):
    apply_style()
    fig, ax = plt.subplots(figsize=(2.6, 2.2))
    ax.loglog([lo, hi], [lo, hi])
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    tidy_log_axis(ax.xaxis)
    tidy_log_axis(ax.yaxis)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for axis in (ax.xaxis, ax.yaxis):
        boxes = _drawn_labels(axis, renderer)
        assert len(boxes) >= 1, (lo, hi)
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not a.overlaps(b), f"labels overlap on [{lo}, {hi}]: {a} {b}"
    plt.close(fig)


def test_short_number():
    assert [short_number(v) for v in (0.2, 500, 2000)] == ["0.2", "500", "2000"]
    assert short_number(2e-3) == r"$2\times10^{-3}$" and short_number(5e4) == r"$5\times10^{4}$"
    assert np.isfinite(float(short_number(0.05)))


@pytest.mark.parametrize("width", ["text", "column"])
def test_a_figure_is_saved_exactly_its_width(tmp_path, width):
    apply_style()
    fig = style.figure(width, 3.0)
    ax = fig.subplots()
    ax.plot([1, 2], [1, 2])
    ax.set_title("a title longer than the panel it stands over, so that it has to be wrapped " * 2)
    ax.set_ylabel("a label longer than the axis " * 3)
    style.suptitle(fig, "the figure's title, longer than the figure is wide " * 2, run="smoke")
    style.save_figure(fig, tmp_path / "f.pdf", tmp_path / "f.png")
    with Image.open(tmp_path / "f.png") as image:
        assert abs(image.size[0] - style.WIDTHS_IN[width] * style.DPI) <= 1  # a pixel: the PNG's rounding
    canvas = FigureCanvasAgg(fig)  # pyplot leaves a closed figure a canvas that cannot draw
    canvas.draw()
    renderer = canvas.get_renderer()
    for text in (ax.title, ax.yaxis.label, fig._suptitle, *fig.texts):
        box = text.get_window_extent(renderer)
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1


def test_wrapped_lines_fit_and_keep_mathtext_whole():
    apply_style()
    fig = plt.figure(figsize=(3, 2))
    renderer, like = fig.canvas.get_renderer(), Text(0, 0, "", fontsize=style.MIN_FONT_PT)
    text = r"a rate $L^{-\min(1, (\sqrt{1 + 4/c} - 1)/2)}$ up to logs, and a median rate $L^{-1}$ " * 3
    wrapped = style.wrap_text(fig, text.strip(), 100, like, renderer)
    lines = wrapped.split("\n")
    assert len(lines) > 1 and " ".join(lines) == text.strip()
    for line in lines:
        assert line.count("$") % 2 == 0, line
        assert style._text_width(fig, line, like, renderer) <= 100 or len(style._words(line)) == 1, line
    plt.close(fig)
