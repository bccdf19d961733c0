"""Figures carry their provenance (docs/architecture.md#figure-provenance): the commit, the run, the rule, the params
fingerprint and the sha256 of each input table, in PNG text chunks and the PDF's Keywords, with no dates."""
import hashlib
import json

import matplotlib.pyplot as plt
import pytest

from largeprompt.commands import cli
from largeprompt.io import figure_provenance
from largeprompt.plots.style import save_figure


@pytest.fixture
def tables(tmp_path):
    paths = []
    for name, payload in (("a.parquet", b"first table"), ("b.parquet", b"second")):
        path = tmp_path / "results" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload)
        paths.append(path)
    return paths


def _draw(folder, record):
    figure_provenance.set_current(record)
    try:
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], [3, 1, 2])
        pdf, png = folder / "fig.pdf", folder / "fig.png"
        save_figure(fig, pdf, png)
    finally:
        figure_provenance.set_current(None)
    return pdf, png


def test_a_record_names_the_run_rule_params_and_each_input_hash(tables, tmp_path):
    record = figure_provenance.figure_record("plot_x", {"a": 1, "code": {"f": "abc"}},
                                             {"one": str(tables[0]), "many": [str(tables[1])]},
                                             tmp_path / "figures" / "myrun" / "x.png")
    assert record["run"] == "myrun" and record["rule"] == "plot_x"
    assert record["inputs"] == {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in tables}
    assert record["params_sha256"] != figure_provenance.figure_record(
        "plot_x", {"a": 2, "code": {"f": "abc"}}, [], tmp_path / "x.png")["params_sha256"]
    tables[0].write_bytes(b"changed")
    again = figure_provenance.figure_record("plot_x", {"a": 1, "code": {"f": "abc"}}, [str(p) for p in tables],
                                            tmp_path / "figures" / "myrun" / "x.png")
    assert again["inputs"][str(tables[0])] != record["inputs"][str(tables[0])]
    assert again["inputs"][str(tables[1])] == record["inputs"][str(tables[1])]


def test_png_and_pdf_carry_the_record_and_reruns_give_the_same_pdf(tables, tmp_path):
    record = figure_provenance.figure_record("plot_x", {"a": 1}, [str(p) for p in tables], tmp_path / "run1" / "x.png")
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    pdf, png = _draw(first, record)
    assert figure_provenance.read_figure_record(png) == record
    assert figure_provenance.read_figure_record(pdf) == record
    pdf2, _ = _draw(second, record)
    assert pdf.read_bytes() == pdf2.read_bytes()  # no creation date
    assert b"CreationDate" not in pdf.read_bytes()


def test_a_figure_without_a_record_reads_none_and_inspect_says_how_to_fix_it(tmp_path, capsys):
    pdf, png = _draw(tmp_path, None)
    assert figure_provenance.read_figure_record(png) is None and figure_provenance.read_figure_record(pdf) is None
    assert cli.main(["inspect", str(png)]) == 2
    assert "carries no provenance record" in capsys.readouterr().err


def test_pdf_strings_with_escapes_are_read_back(tables, tmp_path):
    record = {"run": "r", "note": "a (bracketed) back\\slash"}
    pdf, _ = _draw(tmp_path, record)
    assert figure_provenance.read_figure_record(pdf) == record


def test_inspect_prints_a_figures_record(tables, tmp_path, capsys):
    record = figure_provenance.figure_record("plot_x", {"a": 1}, [str(p) for p in tables], tmp_path / "r" / "x.png")
    _, png = _draw(tmp_path, record)
    assert cli.main(["inspect", str(png)]) == 0
    out = capsys.readouterr().out
    assert json.loads(out.split("## provenance", 1)[1]) == record
