"""One seed against many (largeprompt.ledger.representative, docs/experiments.md#paper-seeds)."""
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from largeprompt.ledger.representative import prediction_interval, seed_against_reference


@pytest.mark.parametrize("n", [3, 8])
def test_prediction_interval_holds_one_more_draw_95_percent_of_the_time(n):
    """Monte Carlo: n draws make the interval, the (n+1)-th lands inside with probability 0.95 exactly (normal law);
    the tolerance is 4 binomial standard errors of the trial count."""
    rng = np.random.default_rng(0)
    trials = 20_000
    draws = rng.normal(3.0, 0.7, size=(trials, n + 1))
    inside = 0
    for row in draws:
        low, high = prediction_interval(row[:n])
        inside += low <= row[n] <= high
    assert abs(inside / trials - 0.95) < 4 * np.sqrt(0.95 * 0.05 / trials)


def test_prediction_interval_is_wider_than_the_mean_interval_by_sqrt_n_plus_one():
    values = np.array([1.0, 2.0, 4.0, 3.5])
    low, high = prediction_interval(values)
    half_mean = stats.t.ppf(0.975, 3) * values.std(ddof=1) / 2
    assert (high - low) / 2 == pytest.approx(half_mean * np.sqrt(5), rel=1e-12)
    assert np.isnan(prediction_interval([1.0])[0])


def _runs(values: dict[int, float], status: dict[int, str] | None = None, L: int = 100) -> pd.DataFrame:
    status = status or {}
    return pd.DataFrame([{"model": "softmax", "prompt_length": L, "seed": s, "stream": 0, "final_test_loss": v,
                          "status": status.get(s, "ok")} for s, v in values.items()])


def test_the_seed_is_judged_against_the_other_ok_seeds_only():
    others = {0: 1.0, 1: 1.1, 2: 0.9, 3: 1.05, 4: 0.95}
    runs = pd.concat([_runs({327: 1.02, **others, 5: 9.0}, {5: "trapped"}),
                      _runs({327: 1.0}).assign(stream=1)])  # a replicate on another stream: not one of the seeds
    table = seed_against_reference(runs, _runs({327: 1.01}), 327)
    row = table.iloc[0]
    assert row["n_other_ok"] == 5 and row["other_mean"] == pytest.approx(1.0)
    assert (row["pi_low"], row["pi_high"]) == pytest.approx(prediction_interval(list(others.values())))
    assert row["reference_within"] and row["now_within"]
    assert row["difference_in_sd"] == pytest.approx(0.01 / np.std(list(others.values()), ddof=1))
    far = seed_against_reference(runs, _runs({327: 2.0}), 327).iloc[0]
    assert not far["reference_within"] and far["now_within"]


def test_a_length_the_reference_lacks_is_not_within():
    runs = _runs({327: 1.0, 0: 1.0, 1: 1.2, 2: 0.8}, L=50)
    row = seed_against_reference(runs, _runs({327: 1.0}, L=100), 327).iloc[0]
    assert np.isnan(row["seed_reference"]) and not row["reference_within"] and row["status_reference"] is None
