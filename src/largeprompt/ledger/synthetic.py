"""The synthetic data of the ledger's calibration (docs/experiments.md#claims): for each kind of test, tables drawn
from a known truth at the budget of a config (``default``: config/config.yaml, ``paper``: config/paper.yaml), and the
ledger's own reading of them (one :class:`~largeprompt.ledger.hypotheses.Outcome` per draw). The rates over many draws
are measured by :mod:`largeprompt.ledger.calibration`; the truths are described in its docstring."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from largeprompt.ledger import claims as ledger
from largeprompt.ledger import hypotheses as h
from largeprompt.ledger import readings as r
from largeprompt.ledger import training_readings as tr
from largeprompt.ledger import verdicts as v
from largeprompt.maths.leading_terms import coefficient_with_bootstrap
from largeprompt.maths.rates import loglog_exponent, percentile_ci, upper_half

# section `concentration` of config/config.yaml and config/paper.yaml: repetitions, largest log2 L, bootstrap resamples
CONCENTRATION = {"default": dict(reps=2000, log2_max=16, n_boot=400), "paper": dict(reps=20000, log2_max=20, n_boot=1000)}
LOG2_MIN, POINTS_PER_OCTAVE = 4, 2
# section `fixed_query_bound`: κ values, L = 2^4 … 2^max, prompts per κ, δ values
FIXED_QUERY = {"default": dict(kappas=4, log2_max=13, reps=4000), "paper": dict(kappas=4, log2_max=18, reps=20000)}
DELTAS = (0.1, 0.05, 0.01)
# section `trajectory_transfer` (R4, full model): seeds and prompt lengths
TRANSFER = {"default": dict(seeds=4, lengths=(20, 40, 80, 160)),
            "paper": dict(seeds=8, lengths=(20, 40, 80, 160, 320, 640, 1000))}
# section `train` (R6): the L where the claim is read, ok runs per L
SOFTMAX_TRAIN = {"default": dict(lengths=(200, 500, 1000), n_ok=8), "paper": dict(lengths=tuple(range(200, 1001, 100)), n_ok=5)}
LINEAR_TRAIN = {"default": dict(lengths=(20, 50, 100, 200, 500, 1000), n_ok=8, n_test=1000),
                "paper": dict(lengths=(20, 30, 40, 50, 60, 70, 80, 90, 100) + tuple(range(200, 1001, 100)), n_ok=5,
                              n_test=10000)}

# magnitudes of the paper run (docs/paper-run/tables): R4's full-model softmax gaps, R6's spread over ok runs
GAP_AMPLITUDE = (1.2, 0.7)  # L·Δ: log-normal median and log-sd over seeds (L·sup_distance ≈ 0.5–4 at L = 20)
COUPLED_NOISE = {"default": 2.8e-3, "paper": 1.0e-3}  # R4's coupled noise floor at L = 20 (default run: 2.8e-3 at batch
# 4096; the paper's batch 32 768 divides it by √8), falling like L^−1/2
NOISE_SPREAD = 0.3  # log-sd of the replicate's estimate of that floor about the truth
GAP_CORRECTION = 10.0  # b of Δ = A·L^−p(1 + b/L)
SOFTMAX_CORRECTION, SOFTMAX_RUN_SD = -20.0, 0.02  # r(L) = A + B/L; per-run sd of r (t half-widths 0.002–0.04)
LINEAR_RUN_SD = 5e-5  # per-run relative sd of linear attention's final test loss (t half-widths ≈ 6e-5 relative)
LINEAR_SGD_EXCESS = 4e-4  # SGD's stationary excess / R(Γ*) at lr 1e-3, batch 128 (measured 3e-4–5e-4 in the paper run)
COEFFICIENT_CORRECTION = 5.0  # b of err_L: L·E err² = A + b²·L^−q
BOUND_C = 1.0  # the tilt c of the R2.bound truth: the bound's exponent 1/(2c) − 1/ln L̄
BOUND_TAIL = 0.5  # α of the Pareto query scale of the R2.bound errors (e^κ at c = 1: P(e^κ > v) ≈ v^−1/(2c))
HOLM_SIZE = 30  # true nulls in the synthetic ledger


def concentration_lengths(budget: str) -> np.ndarray:
    """The fitted upper half of the L grid round(2^{k/2}), 2^4 … 2^max (largeprompt.maths.concentration)."""
    steps = np.arange(LOG2_MIN * POINTS_PER_OCTAVE, CONCENTRATION[budget]["log2_max"] * POINTS_PER_OCTAVE + 1)
    grid = np.array(sorted({int(round(2.0 ** (k / POINTS_PER_OCTAVE))) for k in steps}))
    return grid[upper_half(grid)]


def _increments(rng, shape, tail: str) -> np.ndarray:
    """Unit-variance, mean-zero increments: Gaussian, centred exponential (skewed) or Student t₅ (heavy-tailed)."""
    if tail == "gaussian":
        return rng.standard_normal(shape)
    if tail == "exponential":
        return rng.exponential(1.0, shape) - 1.0
    if tail == "student_t":
        return rng.standard_t(5, shape) / math.sqrt(5 / 3)
    raise ValueError(f"unknown tail {tail!r}")


def random_walk(rng, reps: int, lengths, tail: str = "gaussian") -> np.ndarray:
    """S_L [reps, P] at the nested L: a sum of L unit-variance tokens, independent increments between grid points."""
    steps = np.diff(np.concatenate([[0], lengths])).astype(np.float64)
    return np.cumsum(np.sqrt(steps) * _increments(rng, (reps, len(lengths)), tail), axis=1)


def bootstrap_means(errors: np.ndarray, n_boot: int, rng, block: int = 100) -> np.ndarray:
    """[n_boot, P] means of repetitions resampled with replacement (as counts of each repetition)."""
    reps = errors.shape[0]
    out = np.empty((n_boot, errors.shape[1]))
    for start in range(0, n_boot, block):
        k = min(block, n_boot - start)
        idx = rng.integers(0, reps, (k, reps)) + reps * np.arange(k)[:, None]
        counts = np.bincount(idx.ravel(), minlength=k * reps).reshape(k, reps)
        out[start:start + k] = counts @ errors / reps
    return out


# --- R1, R2.leading, R3: the leading coefficient ----------------------------------------------------------------------

def coefficient_errors(rng, budget: str, amplitude: float = 1.0, q: float = 1.0, tail: str = "gaussian",
                       correction: float = COEFFICIENT_CORRECTION) -> tuple[np.ndarray, np.ndarray]:
    """(L [P], squared errors [R, P]) with err_L = √A·S_L/L + b·L^{−(1+q)/2}: L·E err² = A + b²·L^{−q} exactly."""
    lengths = concentration_lengths(budget)
    walk = random_walk(rng, CONCENTRATION[budget]["reps"], lengths, tail)
    err = math.sqrt(amplitude) * walk / lengths + correction * lengths ** (-(1 + q) / 2)
    return lengths, err ** 2


def coefficient_outcome(rng, budget: str, amplitude: float = 1.0, q: float = 1.0, tail: str = "gaussian") -> h.Outcome:
    """R1/R2.leading/R3's test on one synthetic cell whose closed form is A₀ = 1."""
    lengths, errors = coefficient_errors(rng, budget, amplitude, q, tail)
    boot = bootstrap_means(errors, CONCENTRATION[budget]["n_boot"], rng)
    fit = coefficient_with_bootstrap(lengths, errors, boot, q)
    return r.ratio_outcome(fit["estimate"], fit["se"], 1.0, log_se=fit["log_se"])


# --- R2.bound: a one-sided bound on the exponent ----------------------------------------------------------------------

def bound_exponent(budget: str, c: float = BOUND_C) -> float:
    """The bound's exponent over the fitted L, 1/(2c) − 1/ln L̄ (:func:`readings.bound_exponent`)."""
    lengths = concentration_lengths(budget)
    return 1.0 / (2.0 * c) - 1.0 / math.log(math.sqrt(lengths[0] * lengths[-1]))


def query_factor(rng, reps: int, lengths, tail: float = BOUND_TAIL) -> np.ndarray:
    """[reps, P] unit-mean factors min(V/L, 1)/E min(V/L, 1) of a query with a Pareto(α) scale V (P(V > v) = v^−α):
    the heavy query tail of a tilt c ≥ 1/2, whose share of the mean error changes with L (a factor common to every L
    would cancel from the slope and leave the exponent unrealistically sharp)."""
    scale = rng.uniform(size=(reps, 1)) ** (-1.0 / tail)
    mean = (lengths ** (-tail) - tail / lengths) / (1.0 - tail)  # E min(V/L, 1), exactly
    return np.minimum(scale / lengths, 1.0) / mean


def bound_errors(rng, budget: str, exponent: float | None = None, c: float = BOUND_C):
    """(L, errors [R, P]) with mean L^{−exponent} exactly, or c₁·ln L·L^{−1/(2c)} (Prop. 3.1's law) where
    ``exponent`` is None: the mean times a heavy-tailed query factor and S_L²/L (mean 1, nested over L)."""
    lengths = concentration_lengths(budget)
    reps = CONCENTRATION[budget]["reps"]
    mean = np.log(lengths) * lengths ** (-0.5 / c) if exponent is None else lengths ** (-exponent)
    return lengths, mean * query_factor(rng, reps, lengths) * random_walk(rng, reps, lengths) ** 2 / lengths


def bound_outcome(rng, budget: str, factor: float | None = 1.0) -> h.Outcome:
    """R2.bound's test on errors whose mean falls as L^{−factor·bound} (``factor`` None: as c₁ ln L/L^{1/(2c)}): the
    mean's log–log exponent with the se of its bootstrap percentile interval, as the rate tables give them."""
    exponent = None if factor is None else factor * bound_exponent(budget)
    lengths, errors = bound_errors(rng, budget, exponent)
    boot = bootstrap_means(errors, CONCENTRATION[budget]["n_boot"], rng)
    lo, hi = percentile_ci(loglog_exponent(lengths, boot))
    return h.at_least(float(loglog_exponent(lengths, errors.mean(axis=0))), r.se_of(lo, hi), bound_exponent(budget))


# --- R4: the transfer bracket ------------------------------------------------------------------------------------------

def _lognormal(rng, median_sd: tuple[float, float], shape) -> np.ndarray:
    return median_sd[0] * np.exp(median_sd[1] * rng.standard_normal(shape))


def gaps_table(rng, budget: str, exponent: float = 1.0, correction: float = GAP_CORRECTION) -> pd.DataFrame:
    """A coupled-design gaps table (docs/theory.md#coupled-limit): Δ = A_seed·L^{−p}(1 + b/L) and a noise of size
    n(L) = n₂₀·(20/L)^{1/2} off its direction, coupled_distance = √((Δ + n g₁)² + (n g₂)²), the replicate's floor
    estimate n·e^{0.3 z}, the cut 3 × its median per L and the corrected distance (all Gaussian g, z i.i.d.)."""
    seeds, lengths = TRANSFER[budget]["seeds"], np.array(TRANSFER[budget]["lengths"], dtype=np.float64)
    amplitude = _lognormal(rng, GAP_AMPLITUDE, (seeds, 1))
    truth = amplitude * lengths ** (-exponent) * (1 + correction / lengths)  # [seeds, L]
    noise = np.broadcast_to(COUPLED_NOISE[budget] * np.sqrt(20.0 / lengths), truth.shape)
    g = rng.standard_normal((2, *truth.shape))
    sup = np.sqrt((truth + noise * g[0]) ** 2 + (noise * g[1]) ** 2)
    floor = np.broadcast_to(noise[0] * np.exp(NOISE_SPREAD * rng.standard_normal(len(lengths))), truth.shape)
    threshold = np.broadcast_to(3 * floor[0], truth.shape)
    return pd.DataFrame({"prompt_length": np.tile(lengths, seeds).astype(int), "seed": np.repeat(np.arange(seeds), len(lengths)),
                         "coupled_distance": sup.ravel(), "coupled_noise_floor": floor.ravel(),
                         "coupled_floor_threshold": threshold.ravel(), "coupled_corrected_distance": (sup - floor).ravel(),
                         "status": "ok"})


def bracket_outcome(rng, budget: str, exponent: float = 1.0, correction: float = GAP_CORRECTION) -> h.Outcome:
    """R4's bracket on one synthetic gaps table (the rows ``transfer_bracket`` keeps: ok, positive distance)."""
    frame = gaps_table(rng, budget, exponent, correction)
    frame = frame[(frame["status"] == "ok") & (frame["coupled_distance"] > 0)]
    return r._bracket(frame, f"calibration/{int(rng.integers(2 ** 62))}", r.COUPLED_DESIGN)


# --- R2.fixed_query: the binomial bound, Bonferroni over the cells ---------------------------------------------------

def exceedance_table(rng, budget: str, factor: float = 1.0, cells: str = "all") -> pd.DataFrame:
    """A quantiles table: one row per (κ, L, δ), the exceedances of the three δ of one (κ, L) nested (one prompt
    exceeds the δ = 0.01 bound only if it exceeds the δ = 0.05 one); P(exceed) = factor·δ in every cell
    (``cells="all"``) or only at δ = 0.01 of one (κ, L) (``cells="one"``), δ elsewhere."""
    cfg = FIXED_QUERY[budget]
    groups = cfg["kappas"] * (cfg["log2_max"] - 4 + 1)
    probs = np.tile(np.array(sorted(DELTAS)), (groups, 1))  # [groups, 3] P(exceed δ) for δ ascending
    probs = probs * factor if cells == "all" else probs
    if cells == "one":
        probs[0, 0] *= factor
    bins = np.column_stack([probs[:, :1], np.diff(probs, axis=1), 1 - probs[:, -1:]])
    counts = np.cumsum(np.stack([rng.multinomial(cfg["reps"], p) for p in bins])[:, :3], axis=1)  # [groups, 3]
    return pd.DataFrame({"delta": np.tile(sorted(DELTAS), groups), "n_repetitions": cfg["reps"],
                         "exceed_fraction": counts.ravel() / cfg["reps"]})


def fixed_query_outcome(rng, budget: str, factor: float = 1.0, cells: str = "all") -> h.Outcome:
    table = exceedance_table(rng, budget, factor, cells)
    return r.fixed_query_bound(lambda _: table, _claim("R2.fixed_query"))[0][1]


# --- R6 ----------------------------------------------------------------------------------------------------------------

def _t_interval(runs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and 95% t-interval over the ok runs (axis 1), as the train tables give them."""
    n = runs.shape[1]
    mean, half = runs.mean(axis=1), stats.t.ppf(0.975, n - 1) * runs.std(axis=1, ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half


def softmax_table(rng, budget: str, leading: float = 1.0) -> pd.DataFrame:
    """A train table whose softmax runs have r(L) = A + B/L + N(0, sd²) each, ok at every valid L."""
    cfg = SOFTMAX_TRAIN[budget]
    lengths = np.array(cfg["lengths"], dtype=np.float64)
    runs = leading + SOFTMAX_CORRECTION / lengths[:, None] + SOFTMAX_RUN_SD * rng.standard_normal((len(lengths), cfg["n_ok"]))
    mean, lo, hi = _t_interval(runs)
    return pd.DataFrame({"model": "softmax", "prompt_length": lengths.astype(int), "n_ok": cfg["n_ok"],
                         "softmax_theory_valid": True, "scaled_excess_over_theory_mean": mean,
                         "scaled_excess_over_theory_lo": lo, "scaled_excess_over_theory_hi": hi})


def softmax_outcome(rng, budget: str, leading: float = 1.0) -> h.Outcome:
    table = softmax_table(rng, budget, leading)
    rows = tr.softmax_leading_order(lambda _: table, _claim("R6.softmax"))
    return rows[0][1] if rows else h.two_sided(math.nan, math.nan, 1.0)


def linear_table(rng, budget: str, ratio: float = 1.0, stiff: int | None = None) -> pd.DataFrame:
    """A train table whose linear runs end at ratio·R(Γ*)·(1 + N(0, sd²)) at every L; with ``stiff`` = k, plus SGD's
    stationary excess: one draw x per L shared by every seed (one batch stream), e·χ²_k/k with mean e, and the test
    set's first-order term N(0, 4·x·R(Γ*)/n_test) of that draw (docs/theory.md#sgd-test-set-term), with the columns
    sgd_excess_mean = e (its Monte Carlo se 1% of it) and n_test_prompts that R6.linear then reads."""
    cfg = LINEAR_TRAIN[budget]
    lengths = np.array(cfg["lengths"], dtype=np.float64)
    optimum = 0.1 + 3.2 / lengths  # R(Γ*) of the §6 task, roughly (0.42 at L = 10, 0.103 at L = 1000)
    runs = ratio * optimum[:, None] * (1 + LINEAR_RUN_SD * rng.standard_normal((len(lengths), cfg["n_ok"])))
    excess = LINEAR_SGD_EXCESS * optimum
    if stiff:
        draw = excess * rng.chisquare(stiff, len(lengths)) / stiff
        test_term = np.sqrt(tr.TEST_SET_VARIANCE_PER_EXCESS * draw * optimum / cfg["n_test"]) * rng.standard_normal(len(lengths))
        runs = runs + (draw + test_term)[:, None]
    mean, lo, hi = _t_interval(runs)
    table = pd.DataFrame({"model": "linear", "prompt_length": lengths.astype(int), "n_ok": cfg["n_ok"],
                          "optimal_linear_attention_test_risk": optimum, "final_test_loss_mean": mean,
                          "final_test_loss_lo": lo, "final_test_loss_hi": hi})
    if not stiff:
        return table
    return table.assign(sgd_excess_mean=excess, sgd_excess_se=0.01 * excess, n_test_prompts=cfg["n_test"])


def linear_outcome(rng, budget: str, ratio: float = 1.0, stiff: int | None = None) -> h.Outcome:
    table = linear_table(rng, budget, ratio, stiff)
    return tr.linear_at_optimum(lambda _: table, _claim("R6.linear"))[0][1]


# --- Holm over the ledger ----------------------------------------------------------------------------------------------

def null_ledger(rng, m: int = HOLM_SIZE, rho: float = 0.0) -> pd.DataFrame:
    """m true nulls: two-sided p-values of z-scores with pairwise correlation ``rho`` (uniform p-values at rho = 0)."""
    z = math.sqrt(rho) * rng.standard_normal() + math.sqrt(1 - rho) * rng.standard_normal(m)
    p = 2 * stats.norm.sf(np.abs(z))
    return pd.DataFrame({"p_value": p, "verdict_unadjusted": [h.verdict_of(x) for x in p]})


def holm_outcome(rng, budget: str, rho: float = 0.0, adjusted: bool = True) -> h.Outcome:
    """Whether the ledger of true nulls says ``disagrees`` anywhere, after Holm (or unadjusted)."""
    corrected = ledger.family_wise(null_ledger(rng, HOLM_SIZE, rho))
    column = "verdict" if adjusted else "verdict_unadjusted"
    any_rejection = bool((corrected[column] == v.DISAGREES).any())
    return h.Outcome(math.nan, math.nan, math.nan, math.nan, math.nan, v.DISAGREES if any_rejection else v.AGREES)


def _claim(claim_id: str):
    return next(c for c in ledger.CLAIMS if c.claim_id == claim_id)
