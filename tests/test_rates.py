"""Rate fits (SPEC F4): estimators on exact power laws, and the c ≤ 0.25 exponent from the real stage code."""
import numpy as np
import pandas as pd
import pytest

from largeprompt.rates import fit_paper_form, local_exponents, loglog_exponent, predicted_exponent, upper_half
from largeprompt.stages.bounds import collect_errors, estimate_rates, prompt_length_grid, simulate_errors


def test_estimators_recover_exact_power_laws():
    lengths = np.asarray(prompt_length_grid(4, 12, 2), dtype=float)
    values = 3.0 * lengths ** -0.7
    assert loglog_exponent(lengths, values) == pytest.approx(0.7, abs=1e-12)
    assert np.allclose(local_exponents(lengths, values), 0.7)
    assert upper_half(lengths).sum() == len(lengths) - len(lengths) // 2
    np.testing.assert_allclose(predicted_exponent([0.1, 0.5, 1.0, 2.0]), [1.0, 1.0, 0.5, 0.25])


def test_paper_form_fit_recovers_its_parameters():
    c1, c2 = 0.3, 0.45
    ls, s2 = np.meshgrid(2.0 ** np.arange(8, 17), [0.5, 1.0, 2.0, 4.0])
    values = c1 * np.log(ls) / ls ** (c2 / s2)
    est = fit_paper_form(ls.ravel(), s2.ravel(), values.ravel())
    np.testing.assert_allclose(est, [c1, c2], rtol=1e-10)


def _sweep(tmp_path, c_values, **overrides):
    base = dict(seed=5, dtype="float64", device="cpu", measure="gaussian", dim=2, log2_min_prompt_length=5,
                log2_max_prompt_length=12, points_per_octave=1, n_repetitions=1000, repetition_block=500, chunk_size=2048)
    base.update(overrides)
    jobs = []
    for c in c_values:
        path = tmp_path / f"c{c:g}.parquet"
        simulate_errors({}, {"result": str(path)}, dict(base, c=c))
        jobs.append(str(path))
    out = {"output_errors": str(tmp_path / "o.parquet"), "gradient_errors": str(tmp_path / "g.parquet")}
    collect_errors({"jobs": jobs}, out, dict(seed=5))
    estimate_rates(out, {"rates": str(tmp_path / "rates.parquet")},
                   dict(seed=5, dim=2, n_bootstrap=100, ci_level=0.95, paper_form_min_c=0.25))
    return pd.read_parquet(tmp_path / "rates.parquet"), jobs


def test_small_tilt_mean_error_exponent_is_one(tmp_path):
    """For c ≤ 0.25 the fitted exponent of E‖T_L − T_∞‖² is within 0.1 of 1 (slope −1), from the stage code."""
    rates, jobs = _sweep(tmp_path, [0.1, 0.25])
    exps = rates[(rates["quantity"] == "exponent") & (rates["metric"] == "output") & (rates["statistic"] == "mean")]
    assert len(exps) == 2
    assert np.all(np.abs(exps["estimate"] - 1.0) <= 0.1), exps[["c", "estimate", "ci_low", "ci_high"]]
    assert np.all(exps["ci_low"] <= exps["estimate"]) and np.all(exps["estimate"] <= exps["ci_high"])
    # L·E‖T_L − T_∞‖² at the largest L matches E_q tr C (SPEC F2) within its bootstrap CI widened by 10%.
    const = rates[rates["quantity"] == "asymptotic_constant"]
    assert np.all((const["predicted"] >= 0.9 * const["ci_low"]) & (const["predicted"] <= 1.1 * const["ci_high"]))
    # Same config and seed give bit-identical data.
    again = tmp_path / "again"
    again.mkdir()
    _, jobs2 = _sweep(again, [0.1])
    pd.testing.assert_frame_equal(pd.read_parquet(jobs[0]), pd.read_parquet(jobs2[0]))


def test_bounded_tokens_keep_rate_one_at_large_tilt(tmp_path):
    """Rademacher / uniform tokens: ρ(a) has every moment over queries, so even at c = 1 the mean rate is 1 (±0.1)."""
    jobs = []
    base = dict(seed=5, dtype="float64", device="cpu", dim=2, log2_min_prompt_length=5, log2_max_prompt_length=12,
                points_per_octave=1, n_repetitions=1000, repetition_block=500, chunk_size=2048, c=1.0)
    for name in ("rademacher", "uniform"):
        path = tmp_path / f"{name}.parquet"
        simulate_errors({}, {"result": str(path)}, dict(base, measure=name))
        jobs.append(str(path))
    out = {"output_errors": str(tmp_path / "o.parquet"), "gradient_errors": str(tmp_path / "g.parquet")}
    collect_errors({"jobs": jobs}, out, dict(seed=5))
    estimate_rates(out, {"rates": str(tmp_path / "r.parquet")}, dict(seed=5, dim=2, n_bootstrap=50, ci_level=0.95, paper_form_min_c=0.5))
    rates = pd.read_parquet(tmp_path / "r.parquet")
    exps = rates[(rates["quantity"] == "exponent") & (rates["metric"] == "output") & (rates["statistic"] == "mean")]
    assert len(exps) == 2 and np.all(exps["predicted"] == 1.0)
    assert np.all(np.abs(exps["estimate"] - 1.0) <= 0.1), exps[["measure", "estimate"]]
