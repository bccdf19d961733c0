"""The Snakemake report's landing page (workflow/report/workflow.rst) opens with the run's claims ledger, then shows
every figure with its caption.

Snakemake renders workflow.rst with docutils. Its own ``embeddedimage`` directive (snakemake 9) leaves
the file path as the image source instead of a data URI, so a report opened anywhere but the workflow
directory would show broken images. :func:`landing_page` registers ``embedded-result``, an ``image``
directive whose source is the file's base64 data URI: the single HTML file carries its figures.
"""
from __future__ import annotations

import base64
import mimetypes
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from docutils.parsers.rst.directives.images import Image

DIRECTIVE = "embedded-result"
LEDGER_DIRECTIVE = "claims-ledger"
CSS_PX_PER_IN = 96  # CSS pixels to the inch
LEDGER_COLUMNS = ["claim_id", "kind", "verdict", "verdict_unadjusted", "p_holm", "value", "ci_low", "ci_high", "predicted",
                  "claim", "why", "figure"]


def data_uri(path: str | Path) -> str:
    """``data:<mime>;base64,...`` of a file (mime type from its suffix)."""
    mime = mimetypes.guess_type(str(path))[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(Path(path).read_bytes()).decode('ascii')}"


def printed_width(path: str | Path) -> str | None:
    """The width a PNG prints at (its pixels over its dpi: docs/architecture.md#print-size) in CSS px, 96 to the
    inch, such as ``"648px"`` for the text width; None for another file, or a PNG without a dpi or unreadable (the
    page's own width then applies)."""
    if Path(path).suffix.lower() != ".png":
        return None
    from PIL import Image as Picture  # the report page only

    try:
        with Picture.open(path) as picture:
            dpi, width = picture.info.get("dpi"), picture.size[0]
    except OSError:  # PIL.UnidentifiedImageError included
        return None
    return f"{round(width / dpi[0] * CSS_PX_PER_IN)}px" if dpi and dpi[0] else None


class EmbeddedResult(Image):
    """``.. embedded-result:: figures/<run>/name.png`` with the options of ``image`` (width, alt, target); a figure
    is shown at its printed width (:func:`printed_width`), whatever width the page asks for."""

    def run(self):
        path = directives.uri(self.arguments[0])
        self.options["width"] = printed_width(path) or self.options.get("width")
        if self.options["width"] is None:
            del self.options["width"]
        self.arguments[0] = data_uri(path)
        return super().run()


def ledger_html(path: str | Path) -> str:
    """The run's claims ledger (docs/experiments.md#claims) as an HTML table, or a line saying how to build it."""
    path = Path(path)
    if not path.is_file():
        return f"<p>No claims ledger yet: <code>snakemake --cores 2 {path}</code> builds it.</p>"
    import pandas as pd  # the report page only

    ledger = pd.read_parquet(path)[LEDGER_COLUMNS]
    counts = ", ".join(f"{n} {verdict}" for verdict, n in ledger["verdict"].value_counts().items())
    table = ledger.to_html(index=False, float_format=lambda x: f"{x:.4g}", na_rep="", classes="lp-ledger", border=0)
    return f"<h2 id=\"claims\">Claims: {len(ledger)} rows, {counts}</h2>\n{table}"


class ClaimsLedger(Directive):
    """``.. claims-ledger:: results/<run>/claims/claims.parquet``: the ledger table, raw HTML."""

    required_arguments = 1

    def run(self):
        return [nodes.raw("", ledger_html(self.arguments[0]), format="html")]


def landing_page(path: str) -> str:
    """Register the ``embedded-result`` and ``claims-ledger`` directives and return ``path``, for
    ``report: landing_page(...)``."""
    directives.register_directive(DIRECTIVE, EmbeddedResult)
    directives.register_directive(LEDGER_DIRECTIVE, ClaimsLedger)
    return path
