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

import pandas as pd

from largeprompt.ledger import verdicts as v
from largeprompt.ledger.measures import (
    drifting_fraction,
    exponent_at,
    linear_at_optimum,
    r1_affine_limit,
    r2_fixed_query,
    r5_balanced_flow,
    slope_rows,
    softmax_excess_falls,
    softmax_optimum,
)

COLUMNS = ["claim_id", "label", "claim", "quantity", "value", "ci_low", "ci_high", "predicted", "predicted_value",
           "verdict", "rule", "why", "figure", "table"]


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
