"""How the R6 claims read their run's training tables (docs/experiments.md#claims): trained linear attention against
R(Γ*) plus SGD's stationary excess, and trained softmax's excess against its leading order; ``(read, claim)`` → rows
``(suffix, Outcome[, why])`` as :mod:`largeprompt.ledger.readings`, whose helpers they use."""
from __future__ import annotations

import math

import numpy as np

from largeprompt.ledger import hypotheses as h
from largeprompt.ledger.readings import COEFFICIENT_RESOLUTION, intercept_test, se_of

LINEAR_MIN_PROMPT_LENGTH = 20  # R6.linear is read at L ≥ 20 (docs/experiments.md#training_vs_prompt_length)
TEST_SET_VARIANCE_PER_EXCESS = 4.0  # Var of the test set's first-order term = 4·excess·R/n_test, with Σ₁ ≈ 2R·H (docs/theory.md#sgd-test-set-term)


def linear_at_optimum(read, claim):
    """R6: trained linear attention's mean final test loss over ok runs against R(Γ*) on the same test prompts plus
    SGD's predicted stationary excess η·tr Σ₁/(4B) (docs/theory.md#sgd-stationary-excess) where the table has it, as a
    ratio to R(Γ*), at every L ≥ 20 (t and Monte Carlo standard errors; the worst L, Bonferroni over L), per token
    measure where the table has them."""
    table = read(claim.table)
    if table is None:
        return []
    key = "token_measure" if "token_measure" in table else None
    out = []
    for name, frame in (table.groupby(key, sort=True) if key else [("", table)]):
        lin = frame[(frame["model"] == "linear") & (frame["prompt_length"] >= LINEAR_MIN_PROMPT_LENGTH)
                    & (frame["n_ok"] > 1)]
        if lin.empty:
            continue
        tests = [_linear_test(r) for r in lin.to_dict("records")]
        worst = min(tests, key=lambda t: (t.p_value if np.isfinite(t.p_value) else 2.0))
        p = min(1.0, worst.p_value * len(tests)) if np.isfinite(worst.p_value) else math.nan
        why = ("this table has no SGD-excess column: R(Γ*) alone is predicted" if "sgd_excess_mean" not in lin else
               "this table has no n_test_prompts column: the test set's first-order term is left out"
               if "n_test_prompts" not in lin else None)
        out.append((name, h.Outcome(worst.value, worst.lo, worst.hi, worst.predicted, p, h.verdict_of(p)), why))
    return out


def _linear_test(r: dict) -> h.Outcome:
    """One L of R6.linear: measured / R(Γ*) against 1 + SGD's stationary excess / R(Γ*). Every seed trains on the
    same batch stream, so the seeds end on one draw of SGD's stationary law, not on independent ones: that draw's
    excess is a non-negative quadratic form of mean e, tested with the law of :func:`hypotheses.shifted_by_one_draw`
    beside the seeds' Student t (n_ok − 1 degrees of freedom), the Monte Carlo error of e and the test set's
    first-order term, of variance 4·excess/n_test in these units (docs/theory.md#sgd-test-set-term)."""
    ref = r["optimal_linear_attention_test_risk"]
    excess, excess_se = r.get("sgd_excess_mean", 0.0), r.get("sgd_excess_se", 0.0)
    if not np.isfinite(excess):
        excess, excess_se = 0.0, 0.0
    n_test = r.get("n_test_prompts", math.nan)
    test_variance = TEST_SET_VARIANCE_PER_EXCESS / n_test if np.isfinite(n_test) and n_test > 0 else 0.0
    se = math.hypot(se_of(r["final_test_loss_lo"], r["final_test_loss_hi"], r["n_ok"] - 1), excess_se) / ref
    return h.shifted_by_one_draw(r["final_test_loss_mean"] / ref, se, r["n_ok"] - 1, excess / ref, 1.0,
                                 COEFFICIENT_RESOLUTION, test_variance)


def softmax_leading_order(read, claim):
    """R6: softmax's L·(final test loss − σ²-side reference) over its leading-order constant, r(L) = A + B/L fitted
    over the L where the leading-order theory is valid (:func:`intercept_test`: weights from each L's t-interval over a
    few runs); H0: A = 1."""
    table = read(claim.table)
    if table is None or "scaled_excess_over_theory_mean" not in table:
        return []
    soft = table[(table["model"] == "softmax") & table["softmax_theory_valid"].astype(bool) & (table["n_ok"] > 1)]
    soft = soft.sort_values("prompt_length")
    if len(soft) < 3:
        return []
    lengths = soft["prompt_length"].to_numpy(np.float64)
    se = np.array([se_of(lo, hi) for lo, hi in zip(soft["scaled_excess_over_theory_lo"], soft["scaled_excess_over_theory_hi"])])
    if not np.all(np.isfinite(se) & (se > 0)):
        return []
    test = intercept_test(1.0 / lengths, soft["scaled_excess_over_theory_mean"].to_numpy(), se)
    return [(f"L={int(lengths[0])}..{int(lengths[-1])}", test)]
