"""Size and power of the claims ledger's tests (docs/experiments.md#claims), measured on synthetic data from a known
truth: "a verdict is a statistical test, and is tested like one".

Each kind of test in use gets one generator of synthetic data at the budget of a config (``default``:
config/config.yaml, ``paper``: config/paper.yaml) under the null (the theory holds) and under stated alternatives;
the ledger's own code reads the data, unchanged, and the rate of ``disagrees`` over many draws is the test's size
(under a null) or power (under an alternative), with a Wilson 95% interval.

* ``coefficient`` (R1, R2.leading, R3): nested prompts, err_L = √A·S_L/L + b·L^{−(1+q)/2} with S_L a random walk over
  the tokens (independent increments between grid points), so L·E err² = A + b²·L^{−q} exactly; fitted by
  :func:`~largeprompt.maths.leading_terms.coefficient_with_bootstrap` over the upper half of the L grid and tested by
  :func:`~largeprompt.ledger.readings.ratio_outcome`.
* ``bound`` (R2.bound): a mean error L^{−bound} or c₁·ln L·L^{−1/(2c)} (at the bound) or L^{−0.8·bound} (slower),
  with a heavy-tailed query factor; its log–log exponent with a bootstrap percentile interval as in the rate tables,
  :func:`~largeprompt.ledger.hypotheses.at_least`.
* ``bracket`` (R4): a coupled-design gaps table Δ = A_seed·L^{−p}(1 + b/L) with its L^{−1/2} noise, read by
  :func:`largeprompt.ledger.readings._bracket`.
* ``fixed_query`` (R2.fixed_query): exceedance counts of every (κ, L, δ) cell, :func:`readings.fixed_query_bound`.
* ``softmax`` / ``linear`` (R6): train tables with t-intervals over ok runs, :func:`training_readings.softmax_leading_order`
  and :func:`training_readings.linear_at_optimum`.
* ``holm``: a ledger of m true nulls, :func:`largeprompt.ledger.claims.family_wise` against the unadjusted verdicts.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from largeprompt.ledger import hypotheses as h
from largeprompt.ledger import verdicts as v
from largeprompt.ledger.synthetic import (  # noqa: F401  (the synthetic tables, also read here by tests/test_calibration.py)
    COEFFICIENT_CORRECTION,
    HOLM_SIZE,
    bound_exponent,
    bound_outcome,
    bracket_outcome,
    coefficient_errors,
    coefficient_outcome,
    concentration_lengths,
    fixed_query_outcome,
    gaps_table,
    holm_outcome,
    linear_outcome,
    query_factor,
    softmax_outcome,
)

BUDGETS = ("default", "paper")
COLUMNS = ["test", "budget", "truth", "null", "draws", "disagree_rate", "lo", "hi", "inconclusive_rate"]


def wilson(k: int, n: int, z: float = h.Z) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k/n."""
    if n <= 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)


# --- the truths of each kind, and the measured rates --------------------------------------------------------------------

def _truths() -> dict[str, list[tuple[str, bool, Callable]]]:
    """kind → [(truth, is the null true, (rng, budget) → Outcome)]."""
    f = coefficient_outcome
    return {
        "coefficient": [("A = 1, Gaussian increments, q = 1", True, lambda g, b: f(g, b)),
                        ("A = 1, centred-exponential increments", True, lambda g, b: f(g, b, tail="exponential")),
                        ("A = 1, Student-t5 increments", True, lambda g, b: f(g, b, tail="student_t")),
                        ("A = 1, q = 1/2 (L^-3/2 term)", True, lambda g, b: f(g, b, q=0.5)),
                        ("A = 1.05", False, lambda g, b: f(g, b, 1.05)),
                        ("A = 1.10", False, lambda g, b: f(g, b, 1.10))],
        "bound": [("mean ~ L^-bound (c = 1)", True, lambda g, b: bound_outcome(g, b)),
                  ("mean ~ ln L / L^(1/2c), Prop. 3.1's law", True, lambda g, b: bound_outcome(g, b, None)),
                  ("mean ~ L^-(0.8 bound)", False, lambda g, b: bound_outcome(g, b, 0.8))],
        "bracket": [("p = 1, b = +10", True, lambda g, b: bracket_outcome(g, b)),
                    ("p = 1, b = −10", True, lambda g, b: bracket_outcome(g, b, correction=-10.0)),
                    ("p = 0.9", False, lambda g, b: bracket_outcome(g, b, 0.9)),
                    ("p = 1.1", False, lambda g, b: bracket_outcome(g, b, 1.1))],
        "fixed_query": [("P = delta in every cell", True, lambda g, b: fixed_query_outcome(g, b)),
                        ("P = 1.5 delta in every cell", False, lambda g, b: fixed_query_outcome(g, b, 1.5)),
                        ("P = 1.5 delta in one delta = 0.01 cell", False, lambda g, b: fixed_query_outcome(g, b, 1.5, "one"))],
        "softmax": [("A = 1", True, lambda g, b: softmax_outcome(g, b)),
                    ("A = 0.98", False, lambda g, b: softmax_outcome(g, b, 0.98)),
                    ("A = 0.95", False, lambda g, b: softmax_outcome(g, b, 0.95))],
        "linear": [("ratio 1", True, lambda g, b: linear_outcome(g, b)),
                   ("ratio 1 + one SGD-excess draw, k = 2", True, lambda g, b: linear_outcome(g, b, stiff=2)),
                   ("ratio 1 + one SGD-excess draw, k = 8", True, lambda g, b: linear_outcome(g, b, stiff=8)),
                   ("ratio 1.005 + one SGD-excess draw, k = 2", False, lambda g, b: linear_outcome(g, b, 1.005, 2)),
                   ("ratio 1.005", False, lambda g, b: linear_outcome(g, b, 1.005)),
                   ("ratio 1.02", False, lambda g, b: linear_outcome(g, b, 1.02)),
                   ("ratio 1.09 (loss at 0.9 Gamma*)", False, lambda g, b: linear_outcome(g, b, 1.09))],
        "holm": [(f"{HOLM_SIZE} true nulls, independent: Holm", True, lambda g, b: holm_outcome(g, b)),
                 (f"{HOLM_SIZE} true nulls, independent: unadjusted", True, lambda g, b: holm_outcome(g, b, adjusted=False)),
                 (f"{HOLM_SIZE} true nulls, correlation 0.5: Holm", True, lambda g, b: holm_outcome(g, b, 0.5)),
                 (f"{HOLM_SIZE} true nulls, correlation 0.5: unadjusted", True,
                  lambda g, b: holm_outcome(g, b, 0.5, adjusted=False))],
    }


KINDS = tuple(_truths())
TEST_NAMES = {"coefficient": "R1/R2.leading/R3 coefficient", "bound": "R2.bound", "bracket": "R4 bracket",
              "fixed_query": "R2.fixed_query", "softmax": "R6.softmax", "linear": "R6.linear", "holm": "Holm"}


def size_and_power(kind: str, budget: str, n_draws: int, seed: int = 0, truths=None) -> pd.DataFrame:
    """The disagree rate of the ``kind`` test over ``n_draws`` synthetic draws per truth (``truths``: a subset of
    their names, default all): the false-disagree rate (size) under each null, the power under each alternative,
    each with its Wilson 95% interval, and the inconclusive rate."""
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; allowed {BUDGETS}")
    rows = []
    for k, (truth, null, draw) in enumerate(_truths()[kind]):
        if truths is not None and truth not in truths:
            continue
        rng = np.random.default_rng([seed, KINDS.index(kind), BUDGETS.index(budget), k])
        verdicts = [draw(rng, budget).verdict for _ in range(n_draws)]
        disagree, inconclusive = verdicts.count(v.DISAGREES), verdicts.count(v.INCONCLUSIVE)
        lo, hi = wilson(disagree, n_draws)
        rows.append({"test": TEST_NAMES[kind], "budget": budget, "truth": truth, "null": null, "draws": n_draws,
                     "disagree_rate": disagree / n_draws, "lo": lo, "hi": hi,
                     "inconclusive_rate": inconclusive / n_draws})
    return pd.DataFrame(rows, columns=COLUMNS)


# the share of n_draws each (kind, budget) gets in the table (measured on two shared cores): a draw of the paper-budget
# bootstrap (20 000 repetitions × 1000 resamples) costs ~0.5 s, one of R4's bracket (two seed bootstraps of 400
# nonlinear fits) ~5 s, against ~0.03 s for the default-budget bootstrap and ~2 ms for the R6 and Holm tests
DRAW_SHARE = {("coefficient", "default"): 0.5, ("coefficient", "paper"): 0.1, ("bound", "paper"): 0.15,
              ("fixed_query", "default"): 0.5, ("fixed_query", "paper"): 0.5,
              ("bracket", "default"): 0.025, ("bracket", "paper"): 0.025}
MIN_DRAWS = 10


def calibration_table(n_draws: int = 400, seed: int = 0, kinds=KINDS) -> pd.DataFrame:
    """Every test of ``kinds`` at both budgets (Holm once: it does not depend on the budget) as one tidy table; a
    costly (kind, budget) runs its ``DRAW_SHARE`` of ``n_draws`` (at least ``MIN_DRAWS``)."""
    parts = []
    for kind in kinds:
        for budget in (("default",) if kind == "holm" else BUDGETS):
            share = DRAW_SHARE.get((kind, budget), 1.0)
            parts.append(size_and_power(kind, budget, max(min(n_draws, MIN_DRAWS), round(n_draws * share)), seed))
    return pd.concat(parts, ignore_index=True)
