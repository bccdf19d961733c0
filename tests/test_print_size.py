"""Figures at print size (docs/architecture.md#print-size): every figure of the smoke run, drawn again from its
tables by its plot module, is saved exactly one of the paper's widths wide (within a pixel at the saved dpi), sets
no text below the font floor, keeps every text inside the canvas, and no two texts or legends overlap (titles,
axis labels, tick labels, annotations, legends: each as the box matplotlib draws it in), and fits a page. The figures
whose inputs the published paper run ships (docs/paper-run/tables) are drawn from those too: the paper's sizes
(three token measures, nine tilts, L to 2^20) must fit as well."""
import importlib
import os
from dataclasses import dataclass
from pathlib import Path

import matplotlib.text
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.legend import Legend
from matplotlib.transforms import Bbox
from PIL import Image

from helpers import REPO, SMOKE
from largeprompt.plots import style

FIGURES = sorted(path.stem.removeprefix("plot_") for path in (REPO / "workflow" / "scripts").glob("plot_*.py"))


def plot_inputs(work: Path, configfile: str) -> dict[str, dict]:
    """Figure name → the inputs Snakemake gives rule ``plot_<name>`` (input name → path, or list of paths) with
    ``configfile``, under the checkout ``work`` (a copy of REPO), as REPO's parsed workflow has them: nothing here
    repeats figures.smk. Parsing runs the Snakefile in this process; the working directory and environment are put
    back (as in helpers.workflow_rules)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

    def under_work(value):
        return [str(work / str(v)) for v in value] if isinstance(value, list) else str(work / str(value))

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    try:
        with SnakemakeApi(OutputSettings()) as api:
            workflow = api.workflow(ResourceSettings(), ConfigSettings(configfiles=[REPO / configfile]),
                                    snakefile=REPO / "Snakefile", workdir=REPO)._workflow  # as helpers.workflow_rules
            return {rule.name.removeprefix("plot_"): {key: under_work(value) for key, value in rule.input.items()}
                    for rule in workflow.rules if rule.name.startswith("plot_")}
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def draw(name: str, inputs: dict, out: Path, run: str):
    """Figure ``name`` drawn from ``inputs`` by its plot module into ``out``: (the Figure, as saved; the PNG path)."""
    module = importlib.import_module(f"largeprompt.plots.{name}")
    saved = []

    def keep(fig, pdf, png):
        style_save(fig, pdf, png)
        saved.append(fig)

    style_save = module.save_figure
    paths = {"pdf": str(out / f"{name}.pdf"), "png": str(out / f"{name}.png")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "save_figure", keep)
        getattr(module, f"plot_{name}")(inputs, paths, {"run": run})
    return saved[0], Path(paths["png"])


@dataclass
class Drawn:
    """One figure as saved, drawn once more at the saved dpi to read its texts."""

    png: Path
    width_in: float
    height_in: float
    canvas: Bbox  # the figure's box, pixels
    boxes: list  # (description, box in pixels) of each text drawn outside a legend and of each legend
    sizes: list  # (description, font size in points) of every text drawn, legends' included


def measure(fig, png: Path) -> Drawn:
    """What Text.draw and Legend.draw are called on when ``fig`` is drawn at the saved dpi: only ticks in view and
    axes that are on count, and a legend counts as one box (its texts are inside it)."""
    texts, legends = {}, {}
    text_draw, legend_draw = matplotlib.text.Text.draw, Legend.draw

    def record_text(self, renderer):
        text_draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            texts[id(self)] = self

    def record_legend(self, renderer):
        legend_draw(self, renderer)
        if self.get_visible():
            legends[id(self)] = self

    fig.set_dpi(style.DPI)
    canvas = FigureCanvasAgg(fig)  # pyplot leaves a closed figure a canvas that cannot draw
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.text.Text, "draw", record_text)
        mp.setattr(Legend, "draw", record_legend)
        canvas.draw()
    renderer = canvas.get_renderer()
    inside = {id(t) for legend in legends.values() for t in legend.findobj(matplotlib.text.Text)}
    free = [t for key, t in texts.items() if key not in inside] + list(legends.values())
    return Drawn(png=png, width_in=fig.get_figwidth(), height_in=fig.get_figheight(), canvas=fig.bbox.frozen(),
                 boxes=[(describe(a), a.get_window_extent(renderer)) for a in free],
                 sizes=[(describe(t), t.get_fontsize()) for t in texts.values()])


def overlap(a, b) -> bool:
    """Two boxes share an area (boxes that only touch do not; Bbox.overlaps counts touching)."""
    return min(a.x1, b.x1) > max(a.x0, b.x0) and min(a.y1, b.y1) > max(a.y0, b.y0)


def describe(artist) -> str:
    return f"{type(artist).__name__} {artist.get_text()!r}" if hasattr(artist, "get_text") else type(artist).__name__


PAPER_TABLES = REPO / "docs" / "paper-run" / "tables"


def published_inputs(names) -> dict[str, dict]:
    """Figure name → its paper-run inputs as published under docs/paper-run/tables, for the figures ``names``."""
    inputs = plot_inputs(Path("/run"), "config/paper.yaml")

    def published(value):
        return [published(v) for v in value] if isinstance(value, list) else PAPER_TABLES / Path(value).relative_to("/run/results/paper")

    return {name: {key: published(value) for key, value in inputs[name].items()} for name in names}


PAPER_FIGURES = ["affine_limit", "balanced_flow", "fixed_query_bound", "gradient_concentration", "init_dependence",
                 "output_concentration", "rate_exponent"]  # every input published in docs/paper-run/tables


@pytest.fixture(scope="module")
def figures(smoke_run, tmp_path_factory) -> dict[str, Drawn]:
    work, out = smoke_run[0], tmp_path_factory.mktemp("print_size")
    inputs = plot_inputs(work, SMOKE)
    assert sorted(inputs) == FIGURES  # a rule plot_F for every workflow/scripts/plot_F.py
    drawn = {name: measure(*draw(name, inputs[name], out, "smoke")) for name in FIGURES}
    paper = published_inputs(PAPER_FIGURES)
    missing = [str(p) for table in paper.values() for v in table.values() for p in (v if isinstance(v, list) else [v])
               if not p.is_file()]
    assert not missing, missing  # docs/paper-run/tables holds every input of these figures
    drawn |= {f"paper:{name}": measure(*draw(name, paper[name], out / "paper", "paper")) for name in PAPER_FIGURES}
    return drawn


ALL = FIGURES + [f"paper:{name}" for name in PAPER_FIGURES]


@pytest.mark.parametrize("name", ALL)
def test_saved_at_one_of_the_paper_widths(figures, name):
    with Image.open(figures[name].png) as image:
        width_px, dpi = image.size[0], image.info["dpi"][0]
    assert round(dpi) == style.DPI
    assert any(abs(width_px - inches * style.DPI) <= 1 for inches in style.WIDTHS_IN.values()), (name, width_px)
    assert figures[name].width_in in style.WIDTHS_IN.values()


@pytest.mark.parametrize("name", ALL)
def test_no_text_below_the_font_floor(figures, name):
    small = [(text, size) for text, size in figures[name].sizes if size < style.MIN_FONT_PT]
    assert not small, small


@pytest.mark.parametrize("name", ALL)
def test_every_text_and_legend_inside_the_canvas(figures, name):
    canvas = figures[name].canvas
    outside = [(text, box.bounds) for text, box in figures[name].boxes
               if box.x0 < canvas.x0 or box.y0 < canvas.y0 or box.x1 > canvas.x1 or box.y1 > canvas.y1]
    assert not outside, outside


@pytest.mark.parametrize("name", ALL)
def test_no_two_texts_or_legends_overlap(figures, name):
    boxes = figures[name].boxes
    clashes = [(a, b) for i, (a, box) in enumerate(boxes) for b, other in boxes[i + 1:] if overlap(box, other)]
    assert not clashes, clashes


@pytest.mark.parametrize("name", ALL)
def test_fits_a_page(figures, name):
    with Image.open(figures[name].png) as image:
        height_px = image.size[1]
    assert figures[name].height_in <= style.TEXT_HEIGHT_IN
    assert height_px <= style.TEXT_HEIGHT_IN * style.DPI + 1, (name, height_px)


def test_no_figure_taller_than_a_page_is_made():
    with pytest.raises(ValueError, match="does not fit a page"):
        style.figure("text", style.TEXT_HEIGHT_IN + 0.5)
    assert style.row_height(6, 1.9, 1.5) * 6 + 1.5 <= style.TEXT_HEIGHT_IN
    assert style.row_height(2, 1.9, 1.5) == 1.9
