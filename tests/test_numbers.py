"""figures/<run>/numbers.tex (docs/architecture.md#numbers): a run's claims and figures' key numbers as LaTeX macros,
one ``\\newcommand`` a line, letters-only unique names, numbers that read back to the tables within their printed
precision, escaped text, and a file written atomically under a provenance header."""
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from largeprompt.io.parquet_io import ResultFileError, write_parquet
from largeprompt.io.repository import git_commit
from largeprompt.ledger.claims import COLUMNS
from largeprompt.ledger.numbers import (
    FIGURE_NUMBERS,
    Macro,
    escape,
    interval_decimals,
    macro_name,
    numbers_tex,
    render,
)
from largeprompt.stages.write_numbers import write_numbers

ROOT = Path(__file__).resolve().parents[1]
DEFINITION = re.compile(r"\\newcommand\{\\([A-Za-z]+)\}\{(.*)\}")
NUMBER = re.compile(r"(-?\d+)(?:\.(\d+))?(?:\\times10\^\{(-?\d+)\})?")
LATEX_ESCAPES = "\\{}#$%&_~^"
TRICKY = r"50% of a_b & {x} #1 costs $2 ~ 3^2 \ done"


def synthetic_claims(n=40, seed=0) -> pd.DataFrame:
    """A ledger with the real columns: values over many scales and signs, some intervals missing, every verdict."""
    rng = np.random.default_rng(seed)
    value = rng.choice([-1, 1], n) * 10.0 ** rng.uniform(-8, 7, n)
    half = np.abs(value) * 10.0 ** rng.uniform(-6, 0.5, n)
    half[::7] = np.nan  # no interval: printed to four significant digits
    verdicts = ["agrees", "disagrees", "inconclusive", "not run", "descriptive"]
    return pd.DataFrame({
        "claim_id": [f"R{i % 7}.part_{i}/c={rng.uniform(0, 4):.3g}" for i in range(n)],
        "label": "R1", "kind": "derived", "claim": "a claim", "quantity": "a quantity",
        "value": value, "ci_low": value - half, "ci_high": value + half,
        "predicted": [TRICKY if i == 3 else "1 (the theory)" for i in range(n)],
        "predicted_value": value * rng.uniform(0.5, 1.5, n),
        "p_value": 10.0 ** rng.uniform(-12, 0, n), "p_holm": np.where(rng.random(n) < 0.2, np.nan, rng.random(n)),
        "verdict_unadjusted": [verdicts[i % 5] for i in range(n)], "verdict": [verdicts[(i + 1) % 5] for i in range(n)],
        "rule": "z-test", "why": "", "figure": "affine_limit", "table": "affine_limit/bands.parquet",
    })[COLUMNS]


def synthetic_tables() -> dict[str, pd.DataFrame]:
    """The summary tables the file reads, with only the columns it reads (and a filtered-out row each)."""
    train = pd.DataFrame({"model": ["linear", "linear", "softmax", "softmax"], "prompt_length": [10, 1000, 10, 400],
                          "final_test_loss_mean": [0.4, 0.10595771, 0.5, 0.1185], "final_test_loss_lo": [0.3, 0.1059524, 0.4, 0.11839],
                          "final_test_loss_hi": [0.5, 0.1059629, 0.6, 0.11861], "bayes_risk": [0.18, 0.1003256, 0.18, 0.1008]})
    slopes = pd.DataFrame({"experiment": ["full_model", "reduced_model"], "model": ["softmax", "softmax"],
                           "slope": [-0.8587, -0.929], "slope_lo": [-0.8852, -0.962], "slope_hi": [-0.8322, -0.896],
                           "corrected_slope": [-0.9991, np.nan], "corrected_slope_lo": [-1.0308, np.nan],
                           "corrected_slope_hi": [-0.9675, np.nan]})
    exponents = pd.DataFrame({"token_measure": ["gaussian", "gaussian", "uniform"], "metric": ["output", "grad_U", "output"],
                              "c": [0.75, 0.75, 1.5], "statistic": ["mean", "mean", "mean"], "estimate": [0.7028, 0.52, 0.99],
                              "ci_low": [0.6432, 0.47, 0.98], "ci_high": [0.7563, 0.57, 1.01], "predicted": [0.7583, 0.75, 1.0],
                              "predicted_finite_range": [0.6723, np.nan, np.nan]})
    return {"train/training_prompt_lengths.parquet": train, "trajectory_transfer/slopes.parquet": slopes,
            "concentration/exponents.parquet": exponents}


def definitions(text: str) -> dict[str, str]:
    """Every definition of the file; asserts every line is a comment or one definition and no name repeats."""
    out = {}
    for line in text.splitlines():
        if line.startswith("%"):
            continue
        m = DEFINITION.fullmatch(line)
        assert m, line
        assert m[1] not in out, m[1]
        out[m[1]] = m[2]
    return out


def read_number(text: str) -> tuple[float, float]:
    """The number a macro prints and half its last printed digit (NaN for ``--``)."""
    if text == "--":
        return math.nan, 0.0
    inner = re.fullmatch(r"\\ensuremath\{(.*)\}", text)
    m = NUMBER.fullmatch(inner[1] if inner else text)
    assert m, text
    assert inner or not m[1].startswith("-"), f"{text}: a minus outside math mode"
    decimals, power = len(m[2] or ""), int(m[3] or 0)
    return float(f"{m[1]}.{m[2] or 0}") * 10.0 ** power, 0.5 * 10.0 ** (power - decimals)


def assert_reads_back(text: str, expected: float):
    got, tol = read_number(text)
    if not math.isfinite(expected):
        assert text == "--"
    else:
        assert abs(got - expected) <= tol * (1 + 1e-9) + 1e-300, (text, expected)


def unescape(text: str) -> str:
    text = text.replace(r"\textbackslash{}", "\0").replace(r"\textasciitilde{}", "~").replace(r"\textasciicircum{}", "^")
    return re.sub(r"\\([{}#$%&_])", r"\1", text).replace("\0", "\\")


def test_every_line_is_a_letters_only_newcommand_with_a_unique_name():
    claims = synthetic_claims()
    text = numbers_tex(claims, synthetic_tables(), run="my_run", commit="abc123", written="today")
    macros = definitions(text)
    assert all(re.fullmatch(r"lp[A-Za-z]+", name) for name in macros)
    # every claim, every field; the verdicts' counts add up to the ledger
    fields = ["Value", "Low", "High", "Predicted", "PredictedText", "PValue", "PHolm", "Verdict", "VerdictRaw"]
    assert {macro_name(c, f) for c in claims["claim_id"] for f in fields} <= set(macros)
    counts = [int(macros[macro_name("claims", v)]) for v in ("Agrees", "Disagrees", "Inconclusive", "NotRun", "Descriptive")]
    assert sum(counts) == int(macros["lpClaimsTotal"]) == len(claims)
    assert macros["lpRun"] == r"my\_run" and macros["lpCommit"] == "abc123"


def test_claim_numbers_read_back_within_their_printed_precision():
    claims = synthetic_claims(seed=1)
    macros = definitions(numbers_tex(claims, {}, run="r", commit="c", written="w"))
    columns = {"Value": "value", "Low": "ci_low", "High": "ci_high", "Predicted": "predicted_value",
               "PValue": "p_value", "PHolm": "p_holm"}
    for r in claims.to_dict("records"):
        for field, column in columns.items():
            assert_reads_back(macros[macro_name(r["claim_id"], field)], r[column])
        assert macros[macro_name(r["claim_id"], "Verdict")] == r["verdict"]
        assert macros[macro_name(r["claim_id"], "VerdictRaw")] == r["verdict_unadjusted"]


def test_the_figures_key_numbers_read_back_from_their_tables():
    tables = synthetic_tables()
    macros = definitions(numbers_tex(synthetic_claims(n=3), tables, run="r", commit="c", written="w"))
    train = tables["train/training_prompt_lengths.parquet"]
    for model, rows in train.groupby("model"):
        last = rows.loc[rows["prompt_length"].idxmax()]  # the largest L, whatever the row order
        key = f"R6.final_test_loss/{model}"
        assert macros[macro_name(key, "L")] == str(last["prompt_length"])
        for field, column in {"Value": "final_test_loss_mean", "Low": "final_test_loss_lo", "High": "final_test_loss_hi",
                              "BayesRisk": "bayes_risk"}.items():
            assert_reads_back(macros[macro_name(key, field)], last[column])
    for r in tables["trajectory_transfer/slopes.parquet"].to_dict("records"):
        key = f"R4.bracket/{r['experiment']}/{r['model']}"
        for side, prefix in (("Raw", ""), ("Corrected", "corrected_")):
            for field, suffix in (("Value", ""), ("Low", "_lo"), ("High", "_hi")):
                assert_reads_back(macros[macro_name(key, side + field)], r[f"{prefix}slope{suffix}"])
    exponents = tables["concentration/exponents.parquet"]
    read = exponents[exponents["metric"] == "output"]
    names = {n for n in macros if n.startswith(macro_name("R2.exponent"))}
    assert len(names) == 5 * len(read)  # the output rows only: Value, Low, High, Predicted, PredictedFiniteRange
    for r in read.to_dict("records"):
        key = f"R2.exponent/{r['token_measure']}/c={r['c']:g}"
        for field, column in {"Value": "estimate", "Low": "ci_low", "High": "ci_high", "Predicted": "predicted"}.items():
            assert_reads_back(macros[macro_name(key, field)], r[column])


def test_precision_follows_the_interval_width():
    """Two significant digits of the half-width, the value to the same decimal; without an interval four significant
    digits of the value."""
    claims = synthetic_claims(seed=2)
    macros = definitions(numbers_tex(claims, {}, run="r", commit="c", written="w"))
    for r in claims.to_dict("records"):
        text = macros[macro_name(r["claim_id"], "Value")]
        _, tol = read_number(text)
        half = (r["ci_high"] - r["ci_low"]) / 2
        if math.isfinite(half):
            decimals = min(15, max(0, 1 - math.floor(math.log10(half))))  # no decimal finer than float64's
            # finer only for a value far below its half-width, in powers of ten with a one-digit mantissa
            assert tol == pytest.approx(0.5 * 10.0 ** -decimals, rel=1e-9) or (tol < 0.5 * 10.0 ** -decimals
                                                                               and "times10" in text and "." not in text)
        else:
            assert tol == pytest.approx(0.5 * 10.0 ** (math.floor(math.log10(abs(r["value"]))) - 3), rel=1e-9)
    assert interval_decimals(0.98195, 1.044929) == 3 and interval_decimals(1.0, 1.0) is None


def test_latex_specials_are_escaped():
    macros = definitions(numbers_tex(synthetic_claims(), {}, run="r", commit="c", written="w"))
    text = macros[macro_name(synthetic_claims()["claim_id"][3], "PredictedText")]
    assert unescape(text) == TRICKY
    bare = re.sub(r"\\(textbackslash|textasciitilde|textasciicircum)\{\}|\\[{}#$%&_]", "", text)
    assert not set(bare) & set(LATEX_ESCAPES), bare
    assert escape("line one\nline two") == "line one line two"  # one definition a line


def test_the_naming_rule_spells_digits_and_punctuation_in_letters():
    assert macro_name("R6.softmax/L=200..1000", "Value") == "lpRSixSoftmaxLTwoZeroZeroToOneZeroZeroZeroValue"
    assert macro_name("R2.leading/rademacher/c=0.25") == "lpRTwoLeadingRademacherCZeroPointTwoFive"
    assert macro_name("x/c=-1", "Low") == "lpXCMinusOneLow"
    # a point between digits is a word of its own: 0.25 and 025 differ, as do 1.5 and 15
    assert len({macro_name(k) for k in ("c=0.25", "c=025", "c=1.5", "c=15", "c=1..5")}) == 5


def test_keys_that_differ_only_in_punctuation_are_refused():
    with pytest.raises(ValueError, match="lpROneA"):
        render([Macro("R1.a", "", "1"), Macro("R1/a", "", "2")])


def test_missing_tables_and_columns_give_no_figure_numbers():
    claims = synthetic_claims(n=5)
    plain = definitions(numbers_tex(claims, {}, run="r", commit="c", written="w"))
    tables = synthetic_tables()
    tables["trajectory_transfer/slopes.parquet"] = tables["trajectory_transfer/slopes.parquet"].drop(columns="slope")
    tables["concentration/exponents.parquet"] = None
    partial = definitions(numbers_tex(claims, tables, run="r", commit="c", written="w"))
    extra = set(partial) - set(plain)
    assert extra and all(n.startswith(macro_name("R6.final_test_loss")) for n in extra)


def test_the_rule_reads_the_tables_the_library_reads_and_the_default_target_asks_for_the_file():
    rules = (ROOT / "workflow" / "rules" / "claims.smk").read_text()
    block = rules[rules.index("rule write_numbers:"):]
    assert set(re.findall(r'results\("([^"]+)"\)', block)) == {"claims/claims.parquet", *FIGURE_NUMBERS}
    assert 'figures("numbers.tex")' in block
    default = (ROOT / "Snakefile").read_text().split("rule all:")[1]
    assert 'figures("numbers.tex")' in default


def _stage_files(tmp_path):
    results = tmp_path / "results" / "synthetic"
    inputs = {"claims": str(results / "claims" / "claims.parquet"), "tables": []}
    write_parquet(synthetic_claims(n=6), inputs["claims"], {"rule": "evaluate_claims"})
    for name, table in synthetic_tables().items():
        write_parquet(table, results / name, {"rule": "test"})
        inputs["tables"].append(str(results / name))
    return inputs, {"numbers": str(tmp_path / "figures" / "synthetic" / "numbers.tex")}


def test_the_stage_writes_the_file_atomically_under_a_provenance_header(tmp_path, monkeypatch):
    inputs, outputs = _stage_files(tmp_path)
    write_numbers(inputs, outputs, {"run": "synthetic"})
    out = Path(outputs["numbers"])
    text = out.read_text()
    header = text.split("\\newcommand")[0].splitlines()
    assert all(line.startswith("%") for line in header)
    assert "% run: synthetic" in header and f"% git commit: {git_commit()}" in header
    assert any(re.fullmatch(r"% written: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", line) for line in header)
    assert definitions(text)["lpRun"] == "synthetic"
    assert sorted(p.name for p in out.parent.iterdir()) == ["numbers.tex"]  # no temporary file left

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(ResultFileError, match="numbers.tex: could not be written"):
        write_numbers(inputs, outputs, {"run": "other"})
    assert out.read_text() == text  # the old file, whole
    assert sorted(p.name for p in out.parent.iterdir()) == ["numbers.tex"]
