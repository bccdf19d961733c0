r"""A run's headline numbers as LaTeX macros (docs/architecture.md#numbers), so that a paper's text cites the run
instead of copying from it: every claim's value, 95% interval, prediction, p-values and verdicts from the claims
ledger, the verdicts' counts, and a few figures' key numbers from the summary tables, one ``\newcommand`` a line.

Names (:func:`macro_name`): ``\lp``, then the key spelled in letters, then the field. A run of letters keeps its
case with its first letter raised; each digit is its English word (2: ``Two``); a point between two digits is
``Point``, ``..`` is ``To``, a minus before a digit ``Minus``; every other character only separates words. Claim
``R6.softmax/L=200..1000``, field ``Value``: ``\lpRSixSoftmaxLTwoZeroZeroToOneZeroZeroZeroValue``. Two keys that
differ only in punctuation would share a name: :func:`render` refuses them.

Numbers are plain text (no siunitx): a number with an interval is printed to the decimal of the second significant
digit of the interval's half-width, one without to four significant digits, a p-value to two; a negative number or
one in powers of ten sits in ``\ensuremath``; a missing one is ``--``. Text is escaped (:func:`escape`).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pandas as pd

from largeprompt.ledger import verdicts as v

PREFIX = "lp"
DIGITS = ("Zero", "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine")
SPELLED = {"point": "Point", "to": "To", "minus": "Minus"}
TOKEN = re.compile(r"(?P<point>(?<=\d)\.(?=\d))|(?P<to>\.\.)|(?P<minus>-(?=\d))|(?P<digit>\d)|(?P<word>[A-Za-z]+)"
                   r"|(?P<other>.)", re.S)
MISSING = "--"
LATEX_ESCAPES = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "#": r"\#", "$": r"\$", "%": r"\%", "&": r"\&",
                 "_": r"\_", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
FIXED_EXPONENTS = range(-3, 6)  # |x| in [0.001, 10⁶) is printed in fixed point, else in powers of ten
MAX_DECIMALS = 15  # float64 carries no more


@dataclass(frozen=True)
class Macro:
    """One definition: ``key`` (a claim id or a figure's number) and ``field`` make the name; ``value`` is LaTeX."""

    key: str
    field: str
    value: str

    @property
    def name(self) -> str:
        return macro_name(self.key, self.field)


def macro_name(key: str, field: str = "") -> str:
    """The macro's name without its backslash (the naming rule of docs/architecture.md#numbers): letters only."""
    words = []
    for m in TOKEN.finditer(f"{key} {field}"):
        kind, text = m.lastgroup, m.group()
        if kind == "digit":
            words.append(DIGITS[int(text)])
        elif kind == "word":
            words.append(text[0].upper() + text[1:])
        elif kind in SPELLED:
            words.append(SPELLED[kind])
    return PREFIX + "".join(words)


def escape(text) -> str:
    """``text`` with LaTeX's special characters escaped and line breaks made spaces (one definition a line)."""
    return re.sub(r"[\\{}#$%&_~^]", lambda m: LATEX_ESCAPES[m.group()], " ".join(str(text).splitlines()))


def _float(x) -> float:
    """``x`` as a float, NaN where it is no number (None, text, pandas' NA)."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _finite(*xs) -> bool:
    return all(math.isfinite(_float(x)) for x in xs)


def _exponent(x: float) -> int:
    return math.floor(math.log10(abs(x))) if x != 0 else 0


def interval_decimals(lo, hi) -> int | None:
    """Decimals that show the half-width of [lo, hi] to two significant digits; None without a finite interval."""
    if not _finite(lo, hi) or hi <= lo:
        return None
    return min(MAX_DECIMALS, max(0, 1 - _exponent((hi - lo) / 2)))


def significant_decimals(x, digits: int) -> int:
    """Decimals that show ``x`` to ``digits`` significant digits."""
    return digits - 1 - (_exponent(_float(x)) if _finite(x) else 0)


def _math(text: str) -> str:
    """``text`` in math mode, in running text or in a formula alike."""
    return r"\ensuremath{" + text + "}"


def format_number(x, decimals: int) -> str:
    """``x`` rounded to ``decimals`` decimals, in fixed point or (far from 1) powers of ten; ``--`` if missing."""
    x, decimals = _float(x), min(MAX_DECIMALS, decimals)
    if not math.isfinite(x):
        return MISSING if math.isnan(x) else _math("-" * (x < 0) + r"\infty")
    if x == 0 or _exponent(x) in FIXED_EXPONENTS:
        text = f"{x:.{max(0, decimals)}f}"
        text = text.lstrip("-") if float(text) == 0 else text  # no "-0.00"
        return _math(text) if text.startswith("-") else text
    mantissa, power = f"{x:.{max(0, _exponent(x) + decimals)}e}".split("e")
    return _math(mantissa + r"\times10^{" + str(int(power)) + "}")


def format_integer(n) -> str:
    if not _finite(n):
        return MISSING
    n = int(_float(n))
    return str(n) if n >= 0 else _math(str(n))


def with_interval(key: str, prefix: str, value, lo, hi, **more) -> list[Macro]:
    """``<prefix>Value``, ``<prefix>Low``, ``<prefix>High`` (and each of ``more``, e.g. a prediction) to the interval's
    decimals, or each to four significant digits without an interval."""
    decimals = interval_decimals(lo, hi)
    numbers = {"Value": value, "Low": lo, "High": hi, **more}
    return [Macro(key, prefix + field, format_number(x, significant_decimals(x, 4) if decimals is None else decimals))
            for field, x in numbers.items()]


def p_value(x) -> str:
    return format_number(x, significant_decimals(x, 2))


# --- the claims ledger -------------------------------------------------------------------------------------------------

def claim_macros(claims: pd.DataFrame) -> list[Macro]:
    """Per claim row: ``Value``, ``Low``, ``High``, ``Predicted`` (the number) and ``PredictedText`` (the sentence),
    ``PValue`` and ``Verdict`` (Holm-adjusted where the ledger has ``p_holm``), ``PHolm`` and ``VerdictRaw`` (before
    Holm's correction) where it has them (docs/experiments.md#claims)."""
    out = []
    for r in claims.to_dict("records"):
        key = str(r["claim_id"])
        more = {"Predicted": r["predicted_value"]} if "predicted_value" in r else {}
        out += with_interval(key, "", r["value"], r["ci_low"], r["ci_high"], **more)
        if "predicted" in r:
            out.append(Macro(key, "PredictedText", escape(r["predicted"])))
        out.append(Macro(key, "PValue", p_value(r.get("p_value"))))
        if "p_holm" in r:
            out.append(Macro(key, "PHolm", p_value(r["p_holm"])))
        out.append(Macro(key, "Verdict", escape(r["verdict"])))
        if "verdict_unadjusted" in r:
            out.append(Macro(key, "VerdictRaw", escape(r["verdict_unadjusted"])))
    return out


def verdict_counts(claims: pd.DataFrame) -> list[Macro]:
    """``\\lpClaimsTotal`` and the number of rows of each (Holm-adjusted) verdict: ``\\lpClaimsAgrees``, …"""
    counts = claims["verdict"].value_counts()
    return [Macro("claims", "Total", format_integer(len(claims)))] + [
        Macro("claims", verdict.title().replace(" ", ""), format_integer(counts.get(verdict, 0))) for verdict in v.VERDICTS]


# --- the figures' key numbers ------------------------------------------------------------------------------------------

def final_losses(table: pd.DataFrame) -> list[Macro]:
    """R6 (training_vs_prompt_length): each model's mean final test loss over its ok runs at the largest L, with its
    interval, the Bayes risk there and that L (key ``R6.final_test_loss/<model>``)."""
    out = []
    for model, rows in table.groupby("model", sort=True):
        r = rows.loc[rows["prompt_length"].idxmax()]
        key = f"R6.final_test_loss/{model}"
        out += with_interval(key, "", r["final_test_loss_mean"], r["final_test_loss_lo"], r["final_test_loss_hi"],
                             BayesRisk=r["bayes_risk"])
        out.append(Macro(key, "L", format_integer(r["prompt_length"])))
    return out


def bracket_sides(table: pd.DataFrame) -> list[Macro]:
    """R4 (trajectory_transfer): the two sides of the bracket, the slope of the distance to the flow fitted on the raw
    gaps (``Raw…``) and on the floor-corrected gaps (``Corrected…``), with their intervals (key
    ``R4.bracket/<experiment>/<model>``; slopes as the figure shows them, ≈ −1 for O(1/L))."""
    out = []
    for r in table.sort_values(["experiment", "model"]).to_dict("records"):
        key = f"R4.bracket/{r['experiment']}/{r['model']}"
        out += with_interval(key, "Raw", r["slope"], r["slope_lo"], r["slope_hi"])
        out += with_interval(key, "Corrected", r["corrected_slope"], r["corrected_slope_lo"], r["corrected_slope_hi"])
    return out


def rate_exponents(table: pd.DataFrame) -> list[Macro]:
    """R2 (rate_exponent): the fitted exponent of the mean output error per token measure and c, with its interval and
    the predicted exponent (key ``R2.exponent/<token_measure>/c=<c>``)."""
    rows = table[(table["metric"] == "output") & (table["statistic"] == "mean")]
    out = []
    for r in rows.sort_values(["token_measure", "c"]).to_dict("records"):
        more = {"Predicted": r["predicted"]}
        if "predicted_finite_range" in r:
            more["PredictedFiniteRange"] = r["predicted_finite_range"]
        out += with_interval(f"R2.exponent/{r['token_measure']}/c={r['c']:g}", "", r["estimate"], r["ci_low"],
                             r["ci_high"], **more)
    return out


# each summary table (under results/<run>/) and the numbers read from it; rule write_numbers lists the same tables
FIGURE_NUMBERS: dict[str, Callable[[pd.DataFrame], list[Macro]]] = {
    "train/training_prompt_lengths.parquet": final_losses,
    "trajectory_transfer/slopes.parquet": bracket_sides,
    "concentration/exponents.parquet": rate_exponents,
}


def figure_macros(tables: dict[str, pd.DataFrame | None]) -> list[Macro]:
    """The key numbers of every table of :data:`FIGURE_NUMBERS` the run has; a table missing, empty or without a
    column read (an older or smaller run) gives none."""
    out = []
    for name, numbers in FIGURE_NUMBERS.items():
        table = tables.get(name)
        if table is None or table.empty:
            continue
        try:
            out += numbers(table)
        except KeyError:
            continue
    return out


# --- the file ----------------------------------------------------------------------------------------------------------

def render(macros: Iterable[Macro], header: Iterable[str] = ()) -> str:
    """The file: ``header`` as comment lines, then one ``\\newcommand{\\name}{value}`` a line, a comment naming each
    key before its macros. Raises ValueError if two macros share a name."""
    macros = list(macros)
    seen: dict[str, Macro] = {}
    for m in macros:
        if m.name in seen:
            first = seen[m.name]
            raise ValueError(f"numbers.tex: {first.key!r} {first.field!r} and {m.key!r} {m.field!r} are both \\{m.name}"
                             " (docs/architecture.md#numbers: keys must differ in letters or digits)")
        seen[m.name] = m
    lines = ["% " + " ".join(h.splitlines()) for h in header]
    key = None
    for m in macros:
        if m.key != key:
            key = m.key
            lines.append(f"% {' '.join(key.splitlines())}")
        lines.append(f"\\newcommand{{\\{m.name}}}{{{m.value}}}")
    return "\n".join(lines) + "\n"


def numbers_tex(claims: pd.DataFrame, tables: dict[str, pd.DataFrame | None], run: str, commit: str,
                written: str) -> str:
    """figures/<run>/numbers.tex of a run (docs/architecture.md#numbers): a provenance header (run, commit, date),
    ``\\lpRun`` and ``\\lpCommit``, the verdicts' counts, every claim's numbers and the figures' key numbers."""
    header = [f"numbers.tex of run {run}: its headline numbers as LaTeX macros (docs/architecture.md#numbers)",
              f"run: {run}", f"git commit: {commit}", f"written: {written}",
              f"use: \\input{{figures/{run}/numbers.tex}}, then e.g. \\lpClaimsAgrees{{}}; generated, do not edit"]
    macros = [Macro("run", "", escape(run)), Macro("commit", "", escape(commit)), *verdict_counts(claims),
              *claim_macros(claims), *figure_macros(tables)]
    return render(macros, header)
