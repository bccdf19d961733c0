"""The claims of a run, each computed from the run's own tables (docs/experiments.md#claims).

A claim is a function of ``read(table)`` (a table under results/<run>/ as a DataFrame, or None when the run has no
such table) returning rows: the claim in one sentence, the measured quantity with its 95% interval, the prediction,
the verdict by the claim's stated rule (:mod:`largeprompt.ledger.verdicts`), why (the experiment's known limit,
when the verdict is not ``agrees``), and the figure and table it comes from. A claim whose table is missing, or
whose table lacks the cell it reads (a smaller overlay), gives one ``not run`` row.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from largeprompt.ledger import verdicts as v

COLUMNS = ["claim_id", "label", "claim", "quantity", "value", "ci_low", "ci_high", "predicted", "predicted_value",
           "verdict", "rule", "why", "figure", "table"]
SLOPE_MAX_WIDTH = 1.0  # a slope interval wider than this cannot tell −1 from 0: inconclusive
LINEAR_TOLERANCE = 0.03
R1_MIN_PROMPT_LENGTH = 100  # below it the 1/L² terms of the error still show  # docs/experiments.md#training_vs_prompt_length, criterion 6


@dataclass(frozen=True)
class Claim:
    claim_id: str
    label: str
    claim: str
    quantity: str
    predicted: str
    rule: str
    why: str  # the experiment's known limit, shown when the verdict is not `agrees`
    figure: str
    table: str
    measure: Callable  # (read, claim) -> list of (suffix, value, lo, hi, predicted_value, verdict[, why])


def row(claim: Claim, suffix: str, value, lo, hi, predicted_value, verdict: str, why: str | None = None) -> dict:
    """One ledger row; ``why`` replaces the claim's own known limit where one measure has another."""
    cid = f"{claim.claim_id}/{suffix}" if suffix else claim.claim_id
    sentence = claim.claim.format(suffix=suffix).replace(" ( tokens)", "").replace(" ()", "")
    return {"claim_id": cid, "label": claim.label, "claim": sentence, "quantity": claim.quantity,
            "value": _f(value), "ci_low": _f(lo), "ci_high": _f(hi), "predicted": claim.predicted.format(suffix=suffix),
            "predicted_value": _f(predicted_value), "verdict": verdict,
            "rule": claim.rule, "why": "" if verdict == v.AGREES else (why or claim.why), "figure": claim.figure,
            "table": claim.table}


def _f(x) -> float:
    return float("nan") if x is None else float(x)


def not_run(claim: Claim) -> dict:
    return row(claim, "", None, None, None, None, v.NOT_RUN) | {"why": f"the run has no {claim.table} cell for it"}


# --- R1 -------------------------------------------------------------------------------------------------------------

def log_slope_with_ci(errors: np.ndarray, lengths: np.ndarray, n_boot: int = 400, seed: int = 0):
    """Slope of log(mean error) against log L and its 95% bootstrap interval over prompts; errors [n_L, n_prompts]."""
    x = np.log(lengths.astype(float))
    def slope(mean):
        return np.polyfit(x, np.log(mean), 1)[0]
    rng = np.random.default_rng(seed)
    n = errors.shape[1]
    boot = [slope(errors[:, rng.integers(0, n, n)].mean(1)) for _ in range(n_boot)]
    return slope(errors.mean(1)), *np.quantile(boot, [0.025, 0.975])


R1_BOUNDED_WHY = ("the squared error has a 1/L² term (the self-normalised ratio's bias and second-order variance) "
                  "besides its 1/L term, so over a finite range of L the fitted slope is a little steeper than −1; "
                  "with many prompts the interval resolves that")


def r1_affine_limit(read, claim):
    outputs = read(claim.table)
    if outputs is None:
        return []
    out = []
    for measure, frame in outputs[outputs["prompt_length"] >= R1_MIN_PROMPT_LENGTH].groupby("token_measure", sort=True):
        if frame["prompt_length"].nunique() < 2:
            continue
        sq = (frame["finite_prompt_output"] - frame["infinite_prompt_output"]) ** 2
        per_prompt = frame.assign(sq=sq).groupby(["prompt_length", "prompt"])["sq"].mean().unstack("prompt")
        slope, lo, hi = log_slope_with_ci(per_prompt.to_numpy(), per_prompt.index.to_numpy())
        why = None if measure == "gaussian" else R1_BOUNDED_WHY
        out.append((measure, slope, lo, hi, -1.0, v.interval(lo, hi, -1.0, SLOPE_MAX_WIDTH), why))
    return out


# --- R2, R3 ---------------------------------------------------------------------------------------------------------

def exponent_at(which: str, metric: str, measures: tuple[str, ...] | None = None):
    """The mean's fitted exponent at the smallest or largest c of each measure, against its prediction."""
    def measure(read, claim):
        table = read(claim.table)
        if table is None:
            return []
        rows = table[(table["metric"] == metric) & (table["statistic"] == "mean")]
        out = []
        for name, frame in rows.groupby("token_measure", sort=True):
            if measures and name not in measures:
                continue
            r = frame.loc[frame["c"].idxmin() if which == "smallest" else frame["c"].idxmax()]
            out.append((f"{name}/c={r['c']:g}", r["estimate"], r["ci_low"], r["ci_high"], r["predicted"],
                        v.interval(r["ci_low"], r["ci_high"], r["predicted"])))
        return out
    return measure


def r2_fixed_query(read, claim):
    q = read(claim.table)
    if q is None or q.empty:
        return []
    ratio = (q["exceed_fraction"] / q["delta"]).max()
    return [("", ratio, None, None, 1.0, v.AGREES if bool(q["bound_holds"].all()) else v.DISAGREES)]


# --- R4 -------------------------------------------------------------------------------------------------------------

def slope_rows(key: str, keep: dict | None = None, fit: str = "slope"):
    """Fitted sup-distance slopes over L against −1, one row per value of ``key``; ``fit`` = ``corrected_slope``
    reads the floor-corrected fit (docs/theory.md#floor-corrected-gap), only where floors were measured."""
    def measure(read, claim):
        table = read(claim.table)
        if table is None:
            return []
        for column, value in (keep or {}).items():
            table = table[table[column] == value]
        if fit != "slope":
            table = table[table["n_corrected_points"] > 0]
        return [(str(r[key]), r[fit], r[f"{fit}_lo"], r[f"{fit}_hi"], -1.0,
                 v.interval(r[f"{fit}_lo"], r[f"{fit}_hi"], -1.0, SLOPE_MAX_WIDTH)) for _, r in table.iterrows()]
    return measure


# --- R5 -------------------------------------------------------------------------------------------------------------

def r5_balanced_flow(read, claim):
    flow = read(claim.table)
    if flow is None or flow.empty:
        return []
    ends = flow.sort_values("time").groupby("alpha")["distance_to_bayes"].agg(["first", "last"])
    worst = (ends["last"] / ends["first"]).max()
    return [("", worst, None, None, 0.0, v.at_most(worst, 0.01))]


# --- R6 -------------------------------------------------------------------------------------------------------------

def linear_at_optimum(read, claim):
    table = read(claim.table)
    if table is None:
        return []
    key = "token_measure" if "token_measure" in table else None
    out = []
    for name, frame in (table.groupby(key, sort=True) if key else [("", table)]):
        lin = frame[(frame["model"] == "linear") & (frame["prompt_length"] >= 20)]
        if lin.empty:
            continue
        ref = lin["optimal_linear_attention_test_risk"]
        worst = ((lin["final_test_loss_mean"] - ref).abs() / ref).max()
        out.append((name, worst, None, None, 0.0, v.at_most(worst, LINEAR_TOLERANCE)))
    return out


def softmax_excess_falls(read, claim):
    table = read(claim.table)
    if table is None:
        return []
    soft = table[(table["model"] == "softmax") & (table["n_ok"] > 0)].sort_values("prompt_length")
    if len(soft) < 2:
        return []
    ref = soft["optimal_linear_attention_test_risk"]
    lo, hi = soft["final_test_loss_lo"] - ref, soft["final_test_loss_hi"] - ref
    first, last = soft.index[0], soft.index[-1]
    value = soft.loc[last, "final_test_loss_mean"] - ref[last]
    return [(f"L={soft.loc[last, 'prompt_length']}", value, lo[last], hi[last], 0.0,
             v.decreases((lo[last], hi[last]), (lo[first], hi[first])))]


# --- init dependence, beyond Gaussian -----------------------------------------------------------------------------

def drifting_fraction(read, claim):
    table = read(claim.table)
    if table is None:
        return []
    drift = table[table["flow_class"] == "drifts"]
    if drift.empty:
        return []
    r = drift.iloc[0]
    return [("", r["fraction"], r["fraction_lo"], r["fraction_hi"], None,
             v.AGREES if r["fraction_lo"] > 0 else v.INCONCLUSIVE)]


def softmax_optimum(measure_name: str, attained: bool):
    def measure(read, claim):
        table = read(claim.table)
        if table is None or measure_name not in set(table["token_measure"]):
            return []
        r = table[table["token_measure"] == measure_name].iloc[0]
        ok = bool(r["attained"]) == attained and (not attained or abs(r["profile_min_risk"] - r["infimum"]) <= 1e-6)
        value = r["profile_min_risk"] if attained else r["profile_max_risk"]
        return [("", value, None, None, r["infimum"], v.AGREES if ok else v.DISAGREES)]
    return measure


SLOPE_RULE = "agrees if the 95% interval of the slope contains −1, disagrees if it excludes it; inconclusive if " \
             "there is no interval or it is wider than 1"
EXPONENT_RULE = "agrees if the 95% bootstrap interval of the fitted exponent contains the prediction, disagrees if not"

CLAIMS = [
    Claim("R1", "R1", "Finite-prompt softmax attention approaches its infinite-prompt limit V∇K(Uz_q) ({suffix} tokens)",
          "slope of log mean squared error over log L ≥ 100 (95% bootstrap CI over prompts)", "−1 (CLT: error² ∝ 1/L)",
          SLOPE_RULE, "at the ray's ends the Gaussian tilt leaves an effective prompt length Le^{−κ} of a few tokens "
          "even at L = 10⁴, so the error there is pre-asymptotic", "affine_limit", "affine_limit/outputs.parquet",
          r1_affine_limit),
    Claim("R2.small_c", "R2", "At small tilt the outputs' mean squared error falls like L^−1 ({suffix})",
          "fitted exponent of the mean output error (95% CI)", "min(1, 1/(2c))", EXPONENT_RULE,
          "the exponent is a heuristic with polylogarithmic factors, approached slowly; for c ≥ 1/4 the mean is driven "
          "by rare queries and its bootstrap CI is optimistic", "output_concentration", "concentration/exponents.parquet",
          exponent_at("smallest", "output")),
    Claim("R2.large_c", "R2", "At the largest tilt the outputs' rate slows to min(1, 1/(2c)) ({suffix})",
          "fitted exponent of the mean output error (95% CI)", "min(1, 1/(2c))", EXPONENT_RULE,
          "over a finite L range the fitted slope of the mean lies between the prediction and 1 (the exponent is "
          "approached slowly); the median and the local exponent are the robust readings", "rate_exponent",
          "concentration/exponents.parquet", exponent_at("largest", "output", ("gaussian",))),
    Claim("R3", "R3", "The gradient in U concentrates at the rate of the outputs ({suffix})",
          "fitted exponent of the mean ∇U error (95% CI)", "min(1, 1/(2c))", EXPONENT_RULE,
          "the U-error carries the extra factor ‖z_q‖², so its mean has an even heavier query tail than the output's",
          "gradient_concentration", "concentration/exponents.parquet", exponent_at("smallest", "grad_U")),
    Claim("R2.fixed_query", "R2", "The fixed-query high-probability bound holds at every (κ, L, δ)",
          "largest exceedance fraction / δ", "≤ 1 at every (κ, L, δ)",
          "agrees if the bound holds at every (κ, L, δ) (column bound_holds), disagrees otherwise",
          "the bound is a constant factor above the empirical quantile", "fixed_query_bound",
          "fixed_query_bound/quantiles.parquet", r2_fixed_query),
    Claim("R4", "R4", "Finite-L training follows the infinite-prompt flow within O(1/L) ({suffix})",
          "slope of the sup-distance to the flow over L (95% CI)", "−1", SLOPE_RULE,
          "the O(1/L) transfer is not uniform in time; SGD adds an Euler error and a noise floor, and only gaps above "
          "the floor are fitted", "trajectory_transfer", "transfer/trajectory_slopes.parquet",
          slope_rows("experiment", {"model": "softmax"})),
    Claim("R4.floor_corrected", "R4", "Finite-L training follows the flow within O(1/L) once its floors are "
          "subtracted ({suffix})", "slope of sup-distance − noise floor − Euler floor over L (95% CI)", "−1", SLOPE_RULE,
          "the corrected distance is a lower bound of the part that falls with L, the raw one (claim R4) an upper "
          "bound (docs/theory.md#floor-corrected-gap)", "trajectory_transfer", "transfer/trajectory_slopes.parquet",
          slope_rows("experiment", {"model": "softmax"}, fit="corrected_slope")),
    Claim("R5", "R5", "The infinite-prompt (A, b) flow reaches the Bayes point from every balanced start",
          "largest final / initial distance to the Bayes point", "0", "agrees if at most 0.01 at the horizon",
          "convergence is linear with a slow direction set by the smallest eigenvalue of Σ: at the horizon the "
          "distance is small, not machine precision", "balanced_flow", "infinite/balanced_flow.parquet",
          r5_balanced_flow),
    Claim("R6.linear", "R6", "Trained linear attention ends on its finite-L optimum R(Γ*) at every L ≥ 20",
          "largest |mean final test loss − R(Γ*)| / R(Γ*) over L ≥ 20", "0",
          "agrees if at most 0.03 (criterion 6 of training_vs_prompt_length)",
          "about half the torch-default inits drift and are excluded by the status rule; the means are over ok runs",
          "training_vs_prompt_length", "train/training_prompt_lengths.parquet", linear_at_optimum),
    Claim("R6.softmax", "R6", "Trained softmax attention approaches linear attention's optimum as L grows ({suffix})",
          "softmax's final test loss − R(Γ*) at the largest L (95% t-interval over ok runs)",
          "→ 0: below its value at the smallest L",
          "agrees if the interval at the largest L lies below the one at the smallest L, disagrees if above",
          "the ok runs can form two modes; the interval is over ok runs only", "training_vs_prompt_length",
          "train/training_prompt_lengths.parquet", softmax_excess_falls),
    Claim("init_dependence", "finding", "A positive fraction of torch-default inits have a drifting R∞ flow",
          "drifting fraction (Wilson 95% CI)", "> 0 (a finding of this project, not a theorem)",
          "agrees if the interval's lower end is above 0",
          "no quantity at init predicts the class much better than chance", "init_dependence",
          "init_dependence/classes.parquet", drifting_fraction),
    Claim("R4.beyond", "R4", "Training transfers to the infinite-prompt flow beyond Gaussian covariates ({suffix})",
          "slope of the softmax sup-distance over L (95% CI)", "−1", SLOPE_RULE,
          "the O(1/L) transfer is approached from above over this range of L, as for the Gaussian §6 model; at the "
          "default budget (two transfer seeds) the intervals rest on few points",
          "beyond_gaussian", "beyond_gaussian/slopes.parquet", slope_rows("token_measure")),
    Claim("R4.beyond_floor_corrected", "R4", "Beyond Gaussian covariates too, once the floors are subtracted "
          "({suffix})", "slope of the softmax sup-distance − noise floor − Euler floor over L (95% CI)", "−1",
          SLOPE_RULE, "a lower bound of the part that falls with L (docs/theory.md#floor-corrected-gap)",
          "beyond_gaussian", "beyond_gaussian/slopes.parquet", slope_rows("token_measure", fit="corrected_slope")),
    Claim("R6.beyond_linear", "R6", "Linear attention ends on its measure's R(Γ*) at every L ≥ 20 ({suffix})",
          "largest |mean final test loss − R(Γ*)| / R(Γ*) over L ≥ 20", "0",
          "agrees if at most 0.03 (criterion 6 of training_vs_prompt_length)",
          "about half the torch-default inits drift and are excluded by the status rule",
          "beyond_gaussian", "beyond_gaussian/prompt_lengths.parquet", linear_at_optimum),
    Claim("optimum.rademacher", "R6", "With Rademacher covariates softmax's L = ∞ optimum is attained at finite "
          "weights and equals σ²", "min over attention scales of min_v R∞(v, cI)", "σ², attained",
          "agrees if the profile attains the infimum σ² (to 1e-6)",
          "the profile is on a grid of attention scales", "beyond_gaussian", "beyond_gaussian/optima.parquet",
          softmax_optimum("rademacher", attained=True)),
    Claim("optimum.uniform", "R6", "With uniform covariates softmax's L = ∞ infimum σ² is not attained at any "
          "attention scale", "min_v R∞(v, cI) at the largest attention scale of the profile", "σ², not attained",
          "agrees if the profile does not attain σ² (the minimiser sits at scale → 0)",
          "the uniform flows do not reach their infimum on any finite horizon", "beyond_gaussian",
          "beyond_gaussian/optima.parquet", softmax_optimum("uniform", attained=False)),
]


def evaluate(read: Callable[[str], pd.DataFrame | None]) -> pd.DataFrame:
    """Every claim's rows for the tables ``read`` returns (docs/experiments.md#claims), one ``not run`` row for a
    claim whose inputs are missing."""
    rows = []
    for claim in CLAIMS:
        try:
            measured = claim.measure(read, claim)
        except KeyError as missing:  # a table of a smaller run without the column the claim reads (e.g. no fit)
            rows.append(not_run(claim) | {"why": f"{claim.table} has no column {missing} in this run"})
            continue
        rows += [row(claim, *m) for m in measured] if measured else [not_run(claim)]
    return pd.DataFrame(rows, columns=COLUMNS)
