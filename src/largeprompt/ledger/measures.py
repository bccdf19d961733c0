"""How each claim reads its run's tables (docs/experiments.md#claims): one function per claim kind, ``(read, claim)`` →
rows ``(suffix, value, lo, hi, predicted_value, verdict[, why])``, judged by :mod:`largeprompt.ledger.verdicts`.
The claims themselves, their sentences and rules, are :data:`largeprompt.ledger.claims.CLAIMS`."""
from __future__ import annotations

import numpy as np

from largeprompt.ledger import verdicts as v

SLOPE_MAX_WIDTH = 1.0  # a slope interval wider than this cannot tell −1 from 0: inconclusive
LINEAR_TOLERANCE = 0.03
R1_MIN_PROMPT_LENGTH = 100  # below it the 1/L² terms of the error still show  # docs/experiments.md#training_vs_prompt_length, criterion 6


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
