"""The claims of a run, each a hypothesis test computed from the run's own tables (docs/experiments.md#claims).

A claim is a function of ``read(table)`` (a table under results/<run>/ as a DataFrame, or None when the run has no
such table) returning rows: the claim in one sentence, the tested quantity with its 95% interval, the prediction,
the test's p-value and verdict (:mod:`largeprompt.ledger.hypotheses`), the verdict after Holm's correction over the
whole ledger, why (the experiment's known limit, when the verdict is not ``agrees``), and the figure and table it
comes from. Each claim is of one kind: ``paper`` (a result the paper states), ``derived`` (this project's own
derivation, docs/theory.md) or ``finding`` (a fact of the run, descriptive or checked exactly). A claim whose table
is missing, or lacks the cell it reads (a smaller overlay), gives one ``not run`` row.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from largeprompt.ledger import hypotheses as h
from largeprompt.ledger import readings as r
from largeprompt.ledger import training_readings as tr
from largeprompt.ledger import verdicts as v

COLUMNS = ["claim_id", "label", "kind", "claim", "quantity", "value", "ci_low", "ci_high", "predicted",
           "predicted_value", "p_value", "p_holm", "verdict_unadjusted", "verdict", "rule", "why", "figure", "table"]
KINDS = ("paper", "derived", "finding")


@dataclass(frozen=True)
class Claim:
    claim_id: str
    label: str
    kind: str  # paper | derived | finding
    claim: str
    quantity: str
    predicted: str
    rule: str
    why: str  # the experiment's known limit, shown when the verdict is not `agrees`
    figure: str
    table: str
    measure: Callable  # (read, claim) -> list of (suffix, Outcome[, why])


def row(claim: Claim, suffix: str, outcome: h.Outcome, why: str | None = None) -> dict:
    """One ledger row (before Holm's correction); ``why`` replaces the claim's own known limit where one reading has
    another."""
    cid = f"{claim.claim_id}/{suffix}" if suffix else claim.claim_id
    sentence = claim.claim.replace("{suffix}", suffix).replace(" ( tokens)", "").replace(" ()", "")
    return {"claim_id": cid, "label": claim.label, "kind": claim.kind, "claim": sentence, "quantity": claim.quantity,
            "value": outcome.value, "ci_low": outcome.lo, "ci_high": outcome.hi,
            "predicted": claim.predicted.replace("{suffix}", suffix), "predicted_value": outcome.predicted,
            "p_value": outcome.p_value, "p_holm": np.nan, "verdict_unadjusted": outcome.verdict,
            "verdict": outcome.verdict, "rule": claim.rule, "why": why or claim.why, "figure": claim.figure,
            "table": claim.table}


def not_run(claim: Claim) -> dict:
    nothing = h.Outcome(np.nan, np.nan, np.nan, np.nan, np.nan, v.NOT_RUN)
    return row(claim, "", nothing) | {"why": f"the run has no {claim.table} cell for it"}


COEFFICIENT_RULE = ("two-sided z-test of Â/A₀ = 1 at 5% (bootstrap standard error over repetitions); inconclusive if "
                    "the 95% interval is wider than ±0.25")
EXPONENT_RULE = "two-sided z-test at 5%; inconclusive if the 95% interval is wider than ±0.1"
BRACKET_RULE = ("H0: raw exponent ≤ 1 ≤ floor-corrected exponent, each fitted as A_seed·L^−p(1 + b/L) with a seed "
                "bootstrap; rejected at 5% (Bonferroni over the two sides, Student t over the seeds); inconclusive if "
                "the bracket is wider than ±0.1 (it could not tell p = 1 from 0.9)")
CLAIMS = [
    Claim("R1", "R1", "derived", "Finite-prompt softmax attention approaches V∇K(Uz_q) with error² = C(t)/L + O(1/L²) "
          "({suffix} tokens)", "A/C(t) of L·E err² = A + B/L, pooled over the ray points in the CLT's regime "
          "(L ≥ 10·ρ(a)²), L ≥ 100", "1 (delta method: A = C(t))", COEFFICIENT_RULE,
          "the pooled ratio is read only where the CLT has set in; a ratio off 1 means the delta-method constant or "
          "its regime is wrong", "affine_limit", "affine_limit/leading_coefficients.parquet", r.ray_coefficient),
    Claim("R2.leading", "R2", "derived", "The outputs' mean squared error over random queries is A(c)/L at leading "
          "order ({suffix})", "Â/A(c) of L·E err² = A + B·L^−q over the upper half of the L grid",
          "1 (A(c) = E_q tr C, docs/theory.md#random-query-rate)", COEFFICIENT_RULE,
          "read where A(c) is finite, the correction exponent q ≥ 1/2 and a repetition's L·err² has finite variance "
          "(Gaussian c < 1/4; bounded tokens every c)", "output_concentration",
          "concentration/leading_coefficients.parquet", r.sweep_coefficients("output")),
    Claim("R3.U", "R3", "derived", "The gradient in U concentrates with its delta-method constant ({suffix})",
          "Â/A(c) of L·E‖J^U_L − J^U_∞‖² = A + B·L^−q", "1 (docs/theory.md#jacobians)", COEFFICIENT_RULE,
          "read where A(c) is finite and q ≥ 1/2", "gradient_concentration",
          "concentration/leading_coefficients.parquet", r.sweep_coefficients("grad_U")),
    Claim("R3.V", "R3", "derived", "The gradient in V concentrates with its delta-method constant ({suffix})",
          "Â/A(c) of L·E‖J^V_L − J^V_∞‖² = A + B·L^−q", "1 (docs/theory.md#jacobians)", COEFFICIENT_RULE,
          "read where A(c) is finite and q ≥ 1/2", "gradient_concentration",
          "concentration/leading_coefficients.parquet", r.sweep_coefficients("grad_V")),
    Claim("R2.bound", "R2", "paper", "The mean output error obeys Prop. 3.1's bound c₁ ln L/L^(c₂/σ²) with c₂ = 1/2 "
          "({suffix})", "fitted exponent of the mean output error (upper half of the L grid)",
          "≥ 1/(2c) − 1/ln L̄ (the bound's own slope over the fitted range)",
          "one-sided z-test at 5% (H0: exponent ≥ the bound's); rejected only if the exponent lies significantly below",
          "a one-sided bound, read at c > 1/2 (at c = 1/2 the mean has one more ln L than the bound's form): it can only "
          "be contradicted by a decay slower than the bound's", "rate_exponent",
          "concentration/exponents.parquet", r.bound_exponent),
    Claim("R2.large_tilt", "R2", "derived", "Beyond c = 1/2 the mean error's exponent over the fitted L range is the "
          "single-big-jump model's ({suffix})", "fitted exponent of the mean output error",
          "the model's exponent over the same L (→ (√(1+4/c) − 1)/2, docs/theory.md#random-query-rate)", EXPONENT_RULE,
          "the prediction is the project's own (large deviations over the query's κ), checked by a semi-analytic "
          "simulation; polylog factors make the finite-range exponent differ from its limit", "rate_exponent",
          "concentration/exponents.parquet", r.large_tilt_exponent),
    Claim("R2.fixed_query", "R2", "derived", "The fixed-query high-probability bound holds at every (κ, L, δ)",
          "largest exceedance fraction / δ over the cells", "≤ 1 in every cell",
          "exact binomial test of H0: P(exceed) ≤ δ in the worst cell, Bonferroni over the cells",
          "a proven bound: a rejection means a bug in the bound or the simulation", "fixed_query_bound",
          "fixed_query_bound/quantiles.parquet", r.fixed_query_bound),
    Claim("R2.delta_method", "R2", "derived", "At a fixed query the error's quantile is the δ-method limit law's "
          "({suffix})", "A of empirical / δ-method quantile of ‖T_L − T_∞‖ = A + B/√L over L ≥ 100·e^{3κ}, at the "
          "largest δ", "1 (the limit law N(0, C))", "two-sided Student t-test of A = 1 at 5% (Birge-scaled weighted "
          "fit); inconclusive if the 95% interval is wider than ±0.25",
          "the quantile converges at the Berry–Esseen rate e^{3κ/2}/√L, slower than the variance; the per-L "
          "intervals are treated as independent though the prompts are nested",
          "fixed_query_bound", "fixed_query_bound/quantiles.parquet", r.fixed_query_quantile),
    Claim("R4", "R4", "paper", "Finite-L training follows the infinite-prompt flow within O(1/L) ({suffix})",
          "the exponent p of the coupled distance sup_t‖θ_L − θ^c_∞‖ (docs/theory.md#coupled-limit), raw (shallow "
          "side) and minus its noise floor (steep side)",
          "1 within the bracket", BRACKET_RULE,
          "over L ≤ 160 (default) the local exponent is still rising towards 1 (0.79, 0.89, 0.91 for the largest "
          "gap), more slowly than the fit's 1/L² correction allows; the leading-coefficient test is not built yet; "
          "tables without the coupled columns are read on the distance to the flow and its floors",
          "trajectory_transfer", "trajectory_transfer/gaps.parquet",
          r.transfer_bracket("experiment", {"model": "softmax"})),
    Claim("R4.beyond", "R4", "paper", "Training transfers to the infinite-prompt flow beyond Gaussian covariates "
          "({suffix})", "the exponent p of the softmax sup-distance, raw and floor-corrected", "1 within the bracket",
          BRACKET_RULE, "as R4; at the default budget two seeds give no seed bootstrap", "beyond_gaussian",
          "beyond_gaussian/gaps.parquet", r.transfer_bracket("token_measure")),
    Claim("R5", "R5", "paper", "The infinite-prompt (A, b) flow reaches the Bayes point from every balanced start",
          "largest final / initial distance to the Bayes point", "0", "agrees if at most 0.01 at the horizon (a "
          "deterministic ODE: no p-value)", "convergence is linear with a slow direction set by the smallest "
          "eigenvalue of Σ", "balanced_flow", "infinite/balanced_flow.parquet", r.balanced_flow),
    Claim("R6.linear", "R6", "derived", "Trained linear attention ends on its finite-L optimum R(Γ*), up to SGD's "
          "stationary excess, at every L ≥ 20", "mean final test loss / R(Γ*) on the same test prompts, at the worst L "
          "(t-interval over ok runs)", "1 + η·tr Σ₁/(4B R(Γ*)) (docs/theory.md#sgd-stationary-excess)",
          "two-sided z-test per L at 5% (seed and Monte Carlo standard errors), Bonferroni over L",
          "the excess is SGD's leading order in the step at the run's final weights; the runs may not have reached "
          "their stationary law",
          "training_vs_prompt_length", "train/training_prompt_lengths.parquet", tr.linear_at_optimum),
    Claim("R6.softmax", "R6", "derived", "Trained softmax attention's excess over σ² is its leading-order f(α*)/L "
          "({suffix})", "A of r(L) = A + B/L, r = L·excess / leading-order L·excess, over the L where the expansion "
          "is valid (weighted least squares, Birge-scaled)", "1 (docs/theory.md#softmax-finite-prompt-optimum)",
          "two-sided Student t-test of A = 1 at 5% (L values − 2 degrees of freedom); inconclusive if the 95% interval "
          "is wider than ±0.25",
          "the expansion's remainder is o(1/L), modelled as B/L: a remainder decaying more slowly (B/√L) moves the fitted "
          "A towards 1; trained weights short of the valley's best scale would raise the excess, not lower it",
          "training_vs_prompt_length", "train/training_prompt_lengths.parquet", tr.softmax_leading_order),
    Claim("R6.beyond_linear", "R6", "derived", "Linear attention ends on its measure's R(Γ*) at every L ≥ 20 ({suffix})",
          "mean final test loss / R(Γ*), worst L", "1 + SGD's stationary excess / R(Γ*)", "as R6.linear",
          "as R6.linear", "beyond_gaussian",
          "beyond_gaussian/prompt_lengths.parquet", tr.linear_at_optimum),
    Claim("optimum.rademacher", "finding", "finding", "With Rademacher covariates softmax's L = ∞ optimum is attained "
          "at finite weights and equals σ²", "min over attention scales of min_v R∞(v, cI)", "σ², attained",
          "agrees if the quadrature profile attains σ² to 1e-6 (deterministic)", "the profile is on a grid of scales",
          "beyond_gaussian", "beyond_gaussian/optima.parquet", r.softmax_optimum("rademacher", attained=True)),
    Claim("optimum.uniform", "finding", "finding", "With uniform covariates softmax's L = ∞ infimum σ² is approached "
          "only as the attention scale → 0", "min_v R∞(v, cI) at the largest attention scale of the profile",
          "σ², not attained", "descriptive (true by construction of the profile)", "", "beyond_gaussian",
          "beyond_gaussian/optima.parquet", r.softmax_optimum("uniform", attained=False)),
    Claim("init_dependence", "finding", "finding", "The fraction of torch-default inits whose R∞ flow drifts",
          "drifting fraction (Wilson 95% CI)", "(a fact of the run)", "descriptive", "", "init_dependence",
          "init_dependence/classes.parquet", r.drifting_fraction),
]


def _rows(claim: Claim, read) -> list[dict]:
    try:
        measured = claim.measure(read, claim)
    except KeyError as missing:  # a table of a smaller run without the column the claim reads (e.g. no fit)
        return [not_run(claim) | {"why": f"{claim.table} has no column {missing} in this run"}]
    return [row(claim, *m) for m in measured] if measured else [not_run(claim)]


def family_wise(ledger: pd.DataFrame) -> pd.DataFrame:
    """Holm's correction over every row with a p-value: ``p_holm`` and the adjusted ``verdict``. A row that agreed
    unadjusted still agrees; a disagreement survives only if its adjusted p is below 5%, and one that does not becomes
    ``inconclusive`` (rejected alone, not over the family: neither verdict is earned)."""
    adjusted = h.holm(ledger["p_value"].to_numpy(np.float64))
    tested = np.isfinite(adjusted)
    verdict = ledger["verdict_unadjusted"].where(~tested, [h.verdict_of(p) for p in adjusted])
    demoted = (ledger["verdict_unadjusted"] == v.DISAGREES) & (verdict == v.AGREES)
    inconclusive = (ledger["verdict_unadjusted"] == v.INCONCLUSIVE) | demoted
    return ledger.assign(p_holm=adjusted, verdict=verdict.where(~inconclusive, v.INCONCLUSIVE))


def evaluate(read: Callable[[str], pd.DataFrame | None]) -> pd.DataFrame:
    """Every claim's rows for the tables ``read`` returns (docs/experiments.md#claims), one ``not run`` row for a
    claim whose inputs are missing, with Holm's correction across the ledger; ``why`` only where it disagrees or
    cannot tell."""
    rows = [x for claim in CLAIMS for x in _rows(claim, read)]
    ledger = family_wise(pd.DataFrame(rows, columns=COLUMNS))
    keep_why = ~ledger["verdict"].isin([v.AGREES, v.DESCRIPTIVE])
    return ledger.assign(why=ledger["why"].where(keep_why, ""))
