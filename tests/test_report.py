"""The HTML report opens on its figures, with readable captions (workflow/report/*.rst).

Without the pipeline: every caption and the landing page render with Snakemake's Jinja settings and
docutils for each shipped config, with no missing config key, no docutils error, no raw LaTeX and no
reference to the team's private notes; the landing page embeds every figure as a data URI, in the
order of the results, each followed by its caption.

With the pipeline (marked ``pipeline``; skipped only where no Chromium is installed): the smoke run's
report is opened in headless Chromium and its DOM read: every figure is there, in result order, its image
embedded and decoded by the browser (naturalWidth > 0), each with its readable caption, and the rule graph
below them. Layout and pixels are the browser's business and are not asserted.
"""
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from docutils.core import publish_parts
from jinja2 import Environment, StrictUndefined
from snakemake.utils import validate

from helpers import REPO, SMOKE, run, snakemake_cmd
from largeprompt.commands.report import data_uri, landing_page
from largeprompt.io.config import check_config

REPORT = REPO / "workflow" / "report"
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
CONFIGS = [None, "smoke.yaml", "paper.yaml"]
CAPTIONS = sorted(p for p in REPORT.glob("*.rst") if p.name != "workflow.rst")
ORDER = ["affine_limit", "output_concentration", "gradient_concentration", "rate_exponent", "fixed_query_bound",
         "trajectory_transfer", "balanced_flow", "training_vs_prompt_length", "init_dependence", "beyond_gaussian"]
CATEGORY = {"affine_limit": "R1 affine limit", "balanced_flow": "R5 balanced flow", "training_vs_prompt_length": "R6 training",
            "init_dependence": "R6 training", "trajectory_transfer": "R4 trajectory transfer"}
# Labels of the team's notes, not of the paper (first letters bracketed so that a grep for those labels finds none here).
PRIVATE = re.compile(r"\b[S]PEC\b|\b[T]HEORY\b|\bF[1-9]\b|§[A-Z]")
RAW_MATH = re.compile(r"[_^]\{|\\[A-Za-z]+|\{\{|\$|(?<![A-Za-z])[A-Za-zα-ωΑ-Ω]_[A-Za-z0-9]")  # T_{μ_L}, \sigma, z_q
# What the two training figures draw, as their captions must say it (src/largeprompt/plots/*.py).
DESCRIBES = {
    "training_vs_prompt_length": ["95% Student-t interval over the ok runs", "common random numbers", "open triangles",
                                  "trapped", "no readout", "worse equilibrium", "two modes", "Bayes risk", "R(Γ*)",
                                  "f(α*)", "L ≥ 200", "escape time", "O(1/L)", "drifting fraction"],
    "init_dependence": ["Wilson interval", "plateau", "drifts", "converges", "cross-validated accuracy", "majority class",
                        "at 2T", "escape times"],
    "trajectory_transfer": ["flow", "sharpness", "constant small step", "SGD-noise floor", "two independent batch streams",
                            "above 3× their floor", "reduced (v, A)", "slope −1"],
}
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = ("no Chromium found: install it with `apt-get install chromium` (Debian; `chromium-browser` on "
               "Ubuntu), or point $CHROMIUM at a Chromium/Chrome binary")


def config(overlay):
    """A shipped config as Snakemake sees it: config.yaml, the overlay, then the schema's defaults."""
    with open(REPO / "config" / "config.yaml") as fh:
        cfg = yaml.safe_load(fh)
    if overlay:
        with open(REPO / "config" / overlay) as fh:
            _merge(cfg, yaml.safe_load(fh) or {})
    check_config(cfg, SCHEMA)
    validate(cfg, str(SCHEMA))
    return cfg


def _merge(base, overlay):
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def render(template: str, **context) -> str:
    """Jinja as Snakemake's report sets it up (but a missing key fails), then docutils' HTML body; a docutils
    warning fails too."""
    text = Environment(trim_blocks=True, lstrip_blocks=True, undefined=StrictUndefined).from_string(template)
    settings = {"halt_level": 2, "report_level": 2, "warning_stream": False}
    return publish_parts(text.render(**context), writer="html", settings_overrides=settings)["html_body"]


class _Text(HTMLParser):
    """The text a reader sees (no <style> or <script> content)."""

    def __init__(self):
        super().__init__()
        self.parts, self._skip = [], 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("style", "script")

    def handle_endtag(self, tag):
        self._skip -= tag in ("style", "script")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def visible_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    return " ".join("".join(parser.parts).split())


@pytest.mark.parametrize("overlay", CONFIGS, ids=["default", "smoke", "paper"])
@pytest.mark.parametrize("caption", CAPTIONS, ids=[p.stem for p in CAPTIONS])
def test_caption_renders_readably_for_every_shipped_config(caption, overlay, capsys):
    source = caption.read_text()
    html = render(source, snakemake=SimpleNamespace(config=config(overlay)))
    assert "Unrecognized" not in capsys.readouterr().err  # docutils' LaTeX-to-HTML converter understood every formula
    text = visible_text(html)
    assert not RAW_MATH.search(text), f"raw LaTeX in {caption.name}: {RAW_MATH.search(text).group()!r}"
    assert not PRIVATE.search(source), f"{caption.name} cites {PRIVATE.search(source).group()!r}"
    assert f"docs/experiments.md#{caption.stem}" in text
    assert text.startswith("R") and len(text) > 400  # opens with its result label R1–R6
    missing = [phrase for phrase in DESCRIBES.get(caption.stem, []) if phrase not in text]
    assert not missing, f"{caption.name} does not describe {missing}"


def test_landing_page_embeds_every_figure_with_its_caption_in_result_order(tmp_path, monkeypatch):
    """Records shaped like Snakemake's report results (path, name, target, category, rendered caption)."""
    monkeypatch.chdir(tmp_path)
    landing_page("workflow/report/workflow.rst")
    records = []
    for i, name in enumerate(reversed(ORDER + ["extra_figure", "table"])):  # any order in, result order out
        path = Path("figures") / "smoke" / f"{name}.{'csv' if name == 'table' else 'png'}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([0x89, 80, 78, 71, i]) * 50)
        records.append(SimpleNamespace(path=path, name=path.name, target=path.name,
                                       category=SimpleNamespace(name=CATEGORY.get(name, "R2-R3 concentration")),
                                       caption=f"<p>caption of <em>{name}</em></p>"))
    links = "".join(f"\n.. _{r.target}: javascript:app.showResultInfo('{r.path}')\n" for r in records)
    source = (REPORT / "workflow.rst").read_text()
    html = render(source + links, snakemake=SimpleNamespace(config=config("smoke.yaml")), categories={}, files=records)
    figures = re.findall(r'<img alt="figure (\w+)" src="(data:image/png;base64,[^"]+)"', html)
    assert [name for name, _ in figures] == ORDER + ["extra_figure"]  # a non-image result is not drawn
    starts = [html.index(f'id="fig-{name}"') for name, _ in figures] + [len(html)]
    for (name, uri), start, end in zip(figures, starts, starts[1:]):
        assert uri == data_uri(Path("figures") / "smoke" / f"{name}.png")
        block = html[start:end]  # heading, image, caption, before the next figure
        assert block.index(uri) < block.index(f"caption of <em>{name}</em>")
    text = visible_text(html)
    assert not RAW_MATH.search(text) and not PRIVATE.search(source)
    assert "run smoke" in text and "docs/experiments.md#results" in text


def test_landing_page_opens_with_the_claims_ledger(tmp_path, monkeypatch):
    """docs/experiments.md#claims: the ledger's table comes before the first figure; without a ledger, the command."""
    from largeprompt.io.parquet_io import write_parquet
    from largeprompt.ledger.claims import evaluate

    monkeypatch.chdir(tmp_path)
    landing_page("workflow/report/workflow.rst")
    figure = Path("figures") / "smoke" / "affine_limit.png"
    figure.parent.mkdir(parents=True)
    figure.write_bytes(bytes([0x89, 80, 78, 71]) * 50)
    records = [SimpleNamespace(path=figure, name=figure.name, target=figure.name,
                               category=SimpleNamespace(name="R1 affine limit"), caption="<p>c</p>")]
    links = f"\n.. _{figure.name}: javascript:app.showResultInfo('{figure}')\n"
    source = (REPORT / "workflow.rst").read_text() + links
    context = dict(snakemake=SimpleNamespace(config=config("smoke.yaml")), categories={}, files=records)
    assert "snakemake --cores 2 results/smoke/claims/claims.parquet" in visible_text(render(source, **context))
    ledger = evaluate(lambda name: None)
    write_parquet(ledger, Path("results/smoke/claims/claims.parquet"), {"rule": "evaluate_claims", "params": {}})
    html = render(source, **context)
    assert html.index('class="dataframe lp-ledger"') < html.index('id="fig-affine_limit"')
    assert f"Claims: {len(ledger)} rows, {len(ledger)} not run" in html
    for claim_id in ledger["claim_id"]:
        assert f"<td>{claim_id}</td>" in html


# --- the smoke run's report in a real browser -------------------------------------------------------------

# The report in an iframe; once it has loaded (and its scripts have run), what it holds is written into the probe
# page's DOM, which Chromium dumps: per figure, its name, whether its image is embedded and decoded, its caption.
PROBE = """<!doctype html><html><head><meta charset="utf-8"></head>
<body><iframe id="report" src="{src}" style="width: 1400px; height: 3000px"></iframe><pre id="dom">pending</pre><script>
function read() {{
  const doc = document.getElementById("report").contentDocument;
  const figures = Array.from(doc.querySelectorAll(".lp-figure")).map((fig) => {{
    const img = fig.querySelector("img"), caption = fig.querySelector(".lp-caption");
    return {{name: img ? img.alt.replace("figure ", "") : null, complete: img ? img.complete : false,
            natural: img ? img.naturalWidth : 0, embedded: img ? img.src.startsWith("data:image/png;base64,") : false,
            caption: caption ? caption.innerText.trim() : null}};
  }});
  document.getElementById("dom").textContent = JSON.stringify({{figures: figures,
    rulegraph: doc.querySelectorAll("#rulegraph svg, #rulegraph canvas").length}});
}}
document.getElementById("report").addEventListener("load", () => setTimeout(read, 3000));
</script></body></html>"""


def chromium(*args, cwd):
    profile = Path(cwd) / "chromium-profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=180, check=True).stdout


@pytest.fixture(scope="module")
def report_dom(smoke_run, tmp_path_factory):
    """The smoke run's report.html (written outside the shared checkout) as the browser builds its DOM."""
    if not CHROMIUM:
        pytest.skip(NO_CHROMIUM)
    work = smoke_run[0]
    folder = tmp_path_factory.mktemp("report")
    html = folder / "report.html"
    run(snakemake_cmd("--report", str(html), "--configfile", SMOKE), cwd=work, timeout=600)
    probe = folder / "probe.html"
    probe.write_text(PROBE.format(src=html.as_uri()))
    dom = chromium("--allow-file-access-from-files", "--virtual-time-budget=20000", "--dump-dom", probe.as_uri(), cwd=folder)
    return json.loads(re.search(r'<pre id="dom">(.*?)</pre>', dom, flags=re.S).group(1))


@pytest.mark.pipeline
def test_landing_page_shows_every_figure_loaded(report_dom):
    figures = report_dom["figures"]
    assert [f["name"] for f in figures] == ORDER  # every figure of the run, in result order, nothing else
    for f in figures:
        assert f["embedded"], f  # a data URI: the single HTML file carries its figures
        assert f["complete"] and f["natural"] > 0, f  # decoded by the browser, not a broken image
    assert report_dom["rulegraph"] >= 1  # the rule graph is still there, below the figures


@pytest.mark.pipeline
def test_landing_page_captions_are_readable(report_dom):
    for name, f in zip(ORDER, report_dom["figures"]):
        text = f["caption"]
        assert text, f"{name} has no caption"
        assert text.startswith("R") and f"docs/experiments.md#{name}" in text, text[:200]
        assert not RAW_MATH.search(text), f"{name}: {RAW_MATH.search(text).group()!r}"
        assert not PRIVATE.search(text), f"{name}: {PRIVATE.search(text).group()!r}"


def test_a_figure_is_shown_at_its_printed_width(tmp_path):
    """printed_width: a PNG's pixels over its dpi, 96 CSS px to the inch (6.75 in → 648px); None for an unreadable PNG,
    a PNG without a dpi, or another file."""
    from PIL import Image

    from largeprompt.commands.report import printed_width

    Image.new("RGB", (2025, 10)).save(tmp_path / "text.png", dpi=(300, 300))
    Image.new("RGB", (975, 10)).save(tmp_path / "column.png", dpi=(300, 300))
    Image.new("RGB", (975, 10)).save(tmp_path / "no_dpi.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG" * 10)
    assert printed_width(tmp_path / "text.png") == "648px" and printed_width(tmp_path / "column.png") == "312px"
    assert printed_width(tmp_path / "no_dpi.png") is None and printed_width(tmp_path / "broken.png") is None
    assert printed_width(tmp_path / "figure.pdf") is None
