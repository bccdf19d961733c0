"""Shared figure style and saving (PDF for the paper, PNG for the report)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

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


def save_figure(fig, pdf_path: str | Path, png_path: str | Path) -> None:
    """Save ``fig`` as PDF and PNG (metadata without timestamps, so reruns give identical PDFs)."""
    Path(pdf_path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(pdf_path, metadata={"CreationDate": None, "ModDate": None})
    fig.savefig(png_path)
    plt.close(fig)
