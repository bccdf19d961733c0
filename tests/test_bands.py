"""largeprompt.maths.bands: the mean and percentile band the R1 figure draws."""
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from largeprompt.maths.bands import percentile_bands


def test_bands_match_numpy_percentiles_per_group():
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"g": np.repeat(["a", "b"], 101), "v": rng.standard_normal(202)})
    out = percentile_bands(frame, ["g"], "v", 0.9).set_index("g")
    for g, part in frame.groupby("g"):
        assert out.loc[g, "v_mean"] == pytest.approx(part["v"].mean(), rel=1e-12)
        assert out.loc[g, "v_lo"] == pytest.approx(np.percentile(part["v"], 5), rel=1e-12)
        assert out.loc[g, "v_hi"] == pytest.approx(np.percentile(part["v"], 95), rel=1e-12)
        assert out.loc[g, "n"] == 101


def test_the_band_of_normal_draws_approaches_the_normal_quantiles():
    """Monte Carlo: 200 000 N(0, 1) draws; the sample quantile's standard error at 5% is √(p(1−p)/n)/φ(z) ≈ 0.0047,
    so 5 of them bound the deviation."""
    n = 200_000
    frame = pd.DataFrame({"g": 0, "v": np.random.default_rng(1).standard_normal(n)})
    row = percentile_bands(frame, ["g"], "v", 0.9).iloc[0]
    z = stats.norm.ppf(0.95)
    se = np.sqrt(0.05 * 0.95 / n) / stats.norm.pdf(z)
    assert abs(row["v_hi"] - z) < 5 * se and abs(row["v_lo"] + z) < 5 * se


def test_level_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match="level must be in"):
        percentile_bands(pd.DataFrame({"g": [0], "v": [1.0]}), ["g"], "v", 1.0)
