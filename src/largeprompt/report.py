"""The Snakemake report's landing page (workflow/report/workflow.rst) shows every figure with its caption.

Snakemake renders workflow.rst with docutils. Its own ``embeddedimage`` directive (snakemake 9) leaves
the file path as the image source instead of a data URI, so a report opened anywhere but the workflow
directory would show broken images. :func:`landing_page` registers ``embedded-result``, an ``image``
directive whose source is the file's base64 data URI: the single HTML file carries its figures.
"""
from __future__ import annotations

import base64
import mimetypes
from pathlib import Path

from docutils.parsers.rst import directives
from docutils.parsers.rst.directives.images import Image

DIRECTIVE = "embedded-result"


def data_uri(path: str | Path) -> str:
    """``data:<mime>;base64,...`` of a file (mime type from its suffix)."""
    mime = mimetypes.guess_type(str(path))[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(Path(path).read_bytes()).decode('ascii')}"


class EmbeddedResult(Image):
    """``.. embedded-result:: figures/<run>/name.png`` with the options of ``image`` (width, alt, target)."""

    def run(self):
        self.arguments[0] = data_uri(directives.uri(self.arguments[0]))
        return super().run()


def landing_page(path: str) -> str:
    """Register the ``embedded-result`` directive and return ``path``, for ``report: landing_page(...)``."""
    directives.register_directive(DIRECTIVE, EmbeddedResult)
    return path
