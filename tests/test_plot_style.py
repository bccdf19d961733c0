"""Log-axis tick labels (src/largeprompt/plots/style.py, tidy_log_axis): on any span, from a fraction of a decade to
many decades, the labels drawn never overlap and at least two are drawn."""
import matplotlib.pyplot as plt
import numpy as np
import pytest

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
