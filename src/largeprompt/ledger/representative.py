"""Is one seed representative of many (docs/experiments.md#paper-seeds): a single-seed run's value at each (model, L)
against the spread of a multi-seed run's ok runs at the same (model, L).

The rule: the other ok seeds' values v₁…vₙ (shared batch stream, the seed itself left out) give the 95% prediction
interval of one more seed, v̄ ± t₀.₉₇₅,ₙ₋₁ · s · √(1 + 1/n); the single-seed value is *within seed noise* when it lies
inside. The same seed of the multi-seed run is checked against the same interval, and their difference is given in
units of s.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from largeprompt.maths.rates import t_interval

KEYS = ("model", "prompt_length")
COLUMNS = ["model", "prompt_length", "n_other_ok", "other_mean", "pi_low", "pi_high", "seed_now", "status_now",
           "seed_reference", "status_reference", "reference_within", "now_within", "difference_in_sd"]


def prediction_interval(values, level: float = 0.95) -> tuple[float, float]:
    """The Student-t interval that holds one more independent draw with probability ``level`` (NaN for n < 2)."""
    mean, _, high = t_interval(values, level)  # the mean's interval, half-width t·s/√n: × √(n + 1) for one more draw
    half = (high - mean) * np.sqrt(len(values) + 1)
    return float(mean - half), float(mean + half)


def _one(group: pd.DataFrame, reference: pd.Series | None, seed: int, value: str) -> dict:
    shared = group[group["stream"] == 0]
    others = shared[(shared["seed"] != seed) & (shared["status"] == "ok")][value].to_numpy(np.float64)
    low, high = prediction_interval(others)
    own = shared[shared["seed"] == seed]
    now = float(own[value].iloc[0]) if len(own) else float("nan")
    ref = float(reference[value]) if reference is not None else float("nan")
    sd = float(np.std(others, ddof=1)) if len(others) > 1 else float("nan")
    return {"n_other_ok": len(others), "other_mean": float(np.mean(others)) if len(others) else float("nan"),
            "pi_low": low, "pi_high": high, "seed_now": now, "status_now": own["status"].iloc[0] if len(own) else None,
            "seed_reference": ref, "status_reference": None if reference is None else reference["status"],
            "reference_within": bool(low <= ref <= high), "now_within": bool(low <= now <= high),
            "difference_in_sd": (now - ref) / sd if sd > 0 else float("nan")}


def seed_against_reference(runs: pd.DataFrame, reference: pd.DataFrame, seed: int,
                           value: str = "final_test_loss") -> pd.DataFrame:
    """One row per (model, L) of ``runs`` (a training_runs table of many seeds): ``seed``'s value in ``reference``
    (a single-seed run's training_runs table) and in ``runs``, against the other ok seeds' prediction interval."""
    ref = reference[(reference["seed"] == seed) & (reference["stream"] == 0)].set_index(list(KEYS))
    rows = []
    for key, group in runs.groupby(list(KEYS)):
        row = dict(zip(KEYS, key))
        row |= _one(group, ref.loc[key] if key in ref.index else None, seed, value)
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)
