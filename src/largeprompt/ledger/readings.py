"""How each claim reads its run's tables (docs/experiments.md#claims): one function per kind of claim, ``(read, claim)``
→ rows ``(suffix, Outcome[, why])``, each Outcome a test of :mod:`largeprompt.ledger.hypotheses`. The claims
themselves, their sentences and rules, are :data:`largeprompt.ledger.claims.CLAIMS`. R6's readings, of trained runs
against their optima, are :mod:`largeprompt.ledger.training_readings`.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats

from largeprompt.core.seeding import stream_seed
from largeprompt.ledger import hypotheses as h
from largeprompt.ledger import verdicts as v
from largeprompt.maths.leading_terms import exponent_with_seed_bootstrap

COEFFICIENT_RESOLUTION = 0.25  # a leading-coefficient ratio known to ±25% or worse cannot be read: inconclusive
EXPONENT_RESOLUTION = 0.1  # an exponent known to ±0.1 or worse cannot tell 1 from 0.9: inconclusive
R4_BOOTSTRAP = 400


def se_of(lo, hi, dof: float | None = None) -> float:
    """The standard error behind a symmetric 95% interval [lo, hi]: a normal one, or Student's t with ``dof``."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return math.nan
    q = h.Z if dof is None else float(stats.t(dof).ppf(1 - h.ALPHA / 2))
    return (hi - lo) / (2 * q)


def ratio_outcome(estimate, se, predicted, resolution=COEFFICIENT_RESOLUTION, log_se=math.nan) -> h.Outcome:
    """Â/A₀ tested against 1 (a leading coefficient against its closed form). With ``log_se``, the bootstrap standard
    error of log Â, the test runs on log Â − log A₀, where the right-skewed sums of squared errors are near-symmetric."""
    if not (np.isfinite(predicted) and predicted > 0):
        return h.two_sided(math.nan, math.nan, 1.0)
    if not (np.isfinite(log_se) and log_se > 0 and estimate > 0):
        return h.two_sided(estimate / predicted, se / predicted, 1.0, resolution)
    log_test = h.two_sided(math.log(estimate / predicted), log_se, 0.0)
    ratio = estimate / predicted
    lo, hi = math.exp(log_test.lo), math.exp(log_test.hi)
    return h.Outcome(ratio, lo, hi, 1.0, log_test.p_value, h.resolved(log_test.verdict, (hi - lo) / 2, resolution))


# --- R1, R2, R3: leading coefficients --------------------------------------------------------------------------------

def ray_coefficient(read, claim):
    """R1: the pooled L·E err²/C(t) along the ray against 1, per token measure."""
    table = read(claim.table)
    if table is None:
        return []
    return [(r.token_measure, ratio_outcome(r.estimate, r.se, 1.0, log_se=getattr(r, "log_se", math.nan)))
            for r in table.itertuples()]


def sweep_coefficients(metric: str):
    """R2/R3: L·E err² at every (measure, c) in the theory's regime against its closed form A(c)."""
    def read_rows(read, claim):
        table = read(claim.table)
        if table is None:
            return []
        rows = table[table["metric"] == metric].sort_values(["token_measure", "c"])
        return [(f"{r.token_measure}/c={r.c:g}", ratio_outcome(r.estimate, r.se, r.predicted,
                                                                  log_se=getattr(r, "log_se", math.nan)))
                for r in rows.itertuples()]
    return read_rows


def _gaussian_mean_output_above_half(table):
    """The exponents rows the large-tilt claims read: Gaussian tokens, output metric, statistic mean, c > 1/2."""
    return table[(table["metric"] == "output") & (table["statistic"] == "mean") & (table["token_measure"] == "gaussian")
                 & (table["c"] > 0.5)].sort_values("c")


def bound_exponent(read, claim):
    """R2 (paper Prop. 3.1, a one-sided bound): the mean's fitted exponent at each Gaussian c > 1/2 is at least
    that of c₁ ln L / L^{c₂/σ²} with c₂ = 1/2 over the same L range, 1/(2c) − 1/ln L̄ (L̄ the fit's geometric middle).
    At c = 1/2 itself the mean carries (ln L)^{D/2+1}/L (docs/theory.md#random-query-rate): c₂ = 1/2 is the supremum of
    the admissible c₂, not admissible there, so c = 1/2 is not read."""
    table = read(claim.table)
    if table is None:
        return []
    out = []
    for r in _gaussian_mean_output_above_half(table).itertuples():
        middle = math.sqrt(r.fit_min_prompt_length * r.fit_max_prompt_length)
        bound = 1.0 / (2.0 * r.c) - 1.0 / math.log(middle)
        out.append((f"gaussian/c={r.c:g}", h.at_least(r.estimate, se_of(r.ci_low, r.ci_high), bound)))
    return out


def large_tilt_exponent(read, claim):
    """R2 beyond c = 1/2 (the project's derivation): the mean's fitted exponent against the finite-range exponent of
    the semi-analytic model over the same L, its Monte Carlo error added to the data's."""
    table = read(claim.table)
    if table is None or "predicted_finite_range" not in table:
        return []
    out = []
    for r in _gaussian_mean_output_above_half(table).itertuples():
        se = math.hypot(se_of(r.ci_low, r.ci_high), getattr(r, "predicted_finite_range_se", 0.0) or 0.0)
        out.append((f"gaussian/c={r.c:g}", h.two_sided(r.estimate, se, r.predicted_finite_range, EXPONENT_RESOLUTION)))
    return out


# --- R2 at a fixed query ---------------------------------------------------------------------------------------------

def fixed_query_bound(read, claim):
    """The rigorous bound: exceedances ≤ δ in every (κ, L, δ) cell, the worst cell's exact binomial p-value times
    the number of cells (Bonferroni over cells)."""
    q = read(claim.table)
    if q is None or q.empty:
        return []
    tests = [h.binomial_at_most(int(round(r.exceed_fraction * r.n_repetitions)), int(r.n_repetitions), r.delta)
             for r in q.itertuples()]
    worst = min(tests, key=lambda t: t.p_value)
    p = min(1.0, worst.p_value * len(tests))
    value = max(t.value for t in tests)
    return [("", h.Outcome(value, math.nan, math.nan, 1.0, p, h.verdict_of(p)))]


DELTA_METHOD_REGIME = 100.0  # the δ-method quantile is read where L ≥ 100·e^{3κ} (Berry–Esseen, docs/experiments.md#claims)


def fixed_query_quantile(read, claim):
    """The δ-method quantile of ‖N(0, C)‖/√L against the empirical one at the largest δ (the best-resolved
    quantile), one row per κ: their ratio over the L ≥ 100·e^{3κ} (where Berry–Esseen's e^{3κ/2}/√L is below 1/10)
    is fitted as A + B/√L, the Edgeworth correction, and A = 1 is tested (:func:`intercept_test`)."""
    q = read(claim.table)
    if q is None or q.empty:
        return []
    cells = q[q["delta"] == q["delta"].max()]
    out = []
    for kappa, cell in cells.groupby("kappa", sort=True):
        cell = cell[cell["prompt_length"] >= DELTA_METHOD_REGIME * math.exp(3 * kappa)].sort_values("prompt_length")
        if len(cell) < 3:
            continue
        ratio = (cell["empirical_quantile"] / cell["delta_method_quantile"]).to_numpy()
        se = np.array([se_of(lo, hi) for lo, hi in zip(cell["quantile_ci_low"], cell["quantile_ci_high"])])
        se = se / cell["delta_method_quantile"].to_numpy()
        out.append((f"kappa={kappa:g}", intercept_test(cell["prompt_length"].to_numpy(np.float64) ** -0.5, ratio, se)))
    return out


def intercept_test(correction, ratio, se, resolution=COEFFICIENT_RESOLUTION) -> h.Outcome:
    """H0: A = 1 in ratio ≈ A + B·correction, by least squares weighted by 1/se² (se from a few runs or an
    order-statistic interval each): the standard error is scaled by the Birge ratio max(1, √(χ²/ν)) and the test is
    Student's t with ν = points − 2, so that a misfit of the model widens the interval instead of rejecting."""
    design = np.stack([np.ones_like(correction), correction], axis=-1) / se[:, None]
    coef, *_ = np.linalg.lstsq(design, ratio / se, rcond=None)
    dof = len(ratio) - 2
    birge = max(1.0, math.sqrt(float(np.sum((ratio / se - design @ coef) ** 2)) / dof))
    coef_se = birge * math.sqrt(np.linalg.inv(design.T @ design)[0, 0])
    return h.two_sided(coef[0], coef_se, 1.0, resolution, dof=dof)


# --- R4: the transfer exponent, bracketed ------------------------------------------------------------------------------

FLOW_DESIGN = ("sup_distance", "floor_threshold", "corrected_distance", "floor")
COUPLED_DESIGN = ("coupled_distance", "coupled_floor_threshold", "coupled_corrected_distance", "coupled_noise_floor")


def transfer_bracket(key: str, keep: dict | None = None):
    """R4: the exponent p of the gap ≈ A_seed·L^{−p}(1 + b/L), fitted on the raw gaps (floors added: the shallow side)
    and on the floor-corrected gaps (floors subtracted: the steep side) over the points above the floor cut, each with
    a seed bootstrap; H0: raw exponent ≤ 1 ≤ corrected exponent (docs/theory.md#floor-corrected-gap). The gap is that
    of the coupled design where the table has it (docs/theory.md#coupled-limit: its only floor falls with L), else the
    distance to the flow. Without measured floors the steep side is the fit with a constant floor f ≥ 0 beside the
    power law, A_seed·L^{−p}(1 + b/L) + f over every point: it removes the largest constant the data allow."""
    def read_rows(read, claim):
        table = read(claim.table)
        if table is None:
            return []
        for column, value in (keep or {}).items():
            table = table[table[column] == value]
        coupled = "coupled_distance" in table and table["coupled_distance"].notna().any()
        design = COUPLED_DESIGN if coupled else FLOW_DESIGN
        out = []
        for name, frame in table.groupby(key, sort=True):
            frame = frame[(frame["status"] == "ok") & (frame[design[0]] > 0)]
            out.append((str(name), _bracket(frame, f"r4/{claim.claim_id}/{name}", design)))
        return out
    return read_rows


def _bracket(frame, stream: str, design=FLOW_DESIGN) -> h.Outcome:
    distance, threshold, corrected_distance, floor = design
    rng = np.random.default_rng(stream_seed(0, stream))
    if not frame[floor].notna().any():
        if frame["prompt_length"].nunique() < 4:
            return h.two_sided(math.nan, math.nan, 1.0)
        raw = exponent_with_seed_bootstrap(frame, distance, rng, R4_BOOTSTRAP)
        fitted = exponent_with_seed_bootstrap(frame, distance, rng, R4_BOOTSTRAP, floor=True)
        return h.bracket((raw["exponent"], raw["se"]), (fitted["exponent"], fitted["se"]), 1.0, EXPONENT_RESOLUTION)
    above = frame[frame[distance] > frame[threshold]]
    corrected = above[above[corrected_distance] > 0]
    if corrected["prompt_length"].nunique() < 3:
        return h.two_sided(math.nan, math.nan, 1.0)
    raw = exponent_with_seed_bootstrap(above, distance, rng, R4_BOOTSTRAP)
    steep = exponent_with_seed_bootstrap(corrected, corrected_distance, rng, R4_BOOTSTRAP)
    return h.bracket((raw["exponent"], raw["se"]), (steep["exponent"], steep["se"]), 1.0, EXPONENT_RESOLUTION,
                     dof=frame["seed"].nunique() - 1)  # a bootstrap over few seeds: t quantiles


# --- R5 ----------------------------------------------------------------------------------------------------------------

def balanced_flow(read, claim):
    """R5 (a deterministic ODE, no sampling): the largest final/initial distance to the Bayes point, at most 0.01."""
    flow = read(claim.table)
    if flow is None or flow.empty:
        return []
    ends = flow.sort_values("time").groupby("alpha")["distance_to_bayes"].agg(["first", "last"])
    worst = float((ends["last"] / ends["first"]).max())
    return [("", h.Outcome(worst, math.nan, math.nan, 0.0, math.nan, v.at_most(worst, 0.01)))]


# --- findings: facts of the run, not theorems ------------------------------------------------------------------------

def drifting_fraction(read, claim):
    """Descriptive: the fraction of drifting R∞ flows with its Wilson interval (no hypothesis)."""
    table = read(claim.table)
    if table is None:
        return []
    drift = table[table["flow_class"] == "drifts"]
    if drift.empty:
        return []
    r = drift.iloc[0]
    return [("", h.Outcome(r["fraction"], r["fraction_lo"], r["fraction_hi"], math.nan, math.nan, v.DESCRIPTIVE))]


def softmax_optimum(measure_name: str, attained: bool):
    """A deterministic computation of the run (quadrature, no sampling): whether the profile of min_v R∞(v, cI)
    attains σ² (to 1e-6) is checked where it should (``attained``); where it should not, the value is descriptive."""
    def read_rows(read, claim):
        table = read(claim.table)
        if table is None or measure_name not in set(table["token_measure"]):
            return []
        r = table[table["token_measure"] == measure_name].iloc[0]
        if not attained:
            return [("", h.Outcome(r["profile_max_risk"], math.nan, math.nan, r["infimum"], math.nan, v.DESCRIPTIVE))]
        ok = bool(r["attained"]) and abs(r["profile_min_risk"] - r["infimum"]) <= 1e-6
        return [("", h.Outcome(r["profile_min_risk"], math.nan, math.nan, r["infimum"], math.nan,
                               v.AGREES if ok else v.DISAGREES))]
    return read_rows

