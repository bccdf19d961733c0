"""Rate fits (docs/theory.md#random-query-rate): estimators on exact power laws (rounding bounds from eps), and
the c ≤ 0.25 exponent from the real stage code (statistical margins)."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from largeprompt.io.pipeline import Runtime
from largeprompt.maths.concentration import ERROR_KEYS, prompt_length_grid
from largeprompt.maths.rate_tables import CURVE_POINTS, ERROR_METRICS, TABLES, in_memory_cells, rate_tables
from largeprompt.maths.rates import fit_paper_form, local_exponents, loglog_exponent, predicted_exponent, upper_half
from largeprompt.stages.collect_concentration_errors import collect_concentration_errors
from largeprompt.stages.estimate_concentration_rates import RateSettings, estimate_concentration_rates
from largeprompt.stages.simulate_concentration_errors import simulate_concentration_errors
from tolerance import assert_within, gamma

CPU = Runtime(device="cpu")
SWEEP = dict(dim=2, log2_min_prompt_length=5, log2_max_prompt_length=12, points_per_octave=1, n_repetitions=1000,
             repetition_block=500, chunk_size=2048)


def test_estimators_recover_exact_power_laws():
    lengths = np.asarray(prompt_length_grid(4, 12, 2), dtype=float)
    values = 3.0 * lengths ** -0.7
    n = len(lengths)
    x, y = np.log(lengths), np.log(values)
    # data: log of 3L^{−0.7} carries γ_4 (1 + 0.7|log L|) (pow's condition) + γ_1|y|; log L carries γ_1|x|
    dy = gamma(4) * (1 + 0.7 * np.abs(x)) + gamma(1) * np.abs(y)
    dx = gamma(1) * np.abs(x) + gamma(n + 2) * np.abs(x).mean()  # ... and centring adds the mean's error
    xc = x - x.mean()
    # slope −Σ(y − ȳ)x̃/Σx̃²: propagated data errors plus γ_{2n} on the |·| evaluation of the sums
    numer_err = ((dy + dy.mean()) @ np.abs(xc) + np.abs(y - y.mean()) @ dx
                 + gamma(2 * n) * (np.abs(y) + np.abs(y).mean()) @ np.abs(xc))
    slope_tol = (numer_err + 0.7 * (2 * np.abs(xc) @ dx + gamma(2 * n) * (xc @ xc))) / (xc @ xc)
    assert_within(loglog_exponent(lengths, values), 0.7, slope_tol, "least-squares exponent")
    # central differences on an uneven grid: weights ≤ 2/h_min each, applied to values ≤ |y| and abscissae ≤ |x|
    value_err = dy.max() + 0.7 * dx.max() + gamma(4) * (np.abs(y).max() + 0.7 * np.abs(x).max())
    diff_tol = 3 * (2 / np.diff(x).min()) * value_err
    assert_within(local_exponents(lengths, values), 0.7, diff_tol, "local exponents")
    assert upper_half(lengths).sum() == len(lengths) - len(lengths) // 2
    # (√(1 + 4/c) − 1)/2 capped at 1: 1, 1, (√5 − 1)/2, (√3 − 1)/2, a few roundings each
    predicted = np.array([1.0, 1.0, (np.sqrt(5.0) - 1) / 2, (np.sqrt(3.0) - 1) / 2])
    assert_within(predicted_exponent([0.1, 0.5, 1.0, 2.0]), predicted, gamma(8) * predicted, "predicted exponent")


def test_paper_form_fit_recovers_its_parameters():
    c1, c2 = 0.3, 0.45
    ls, s2 = np.meshgrid(2.0 ** np.arange(8, 17), [0.5, 1.0, 2.0, 4.0])
    values = c1 * np.log(ls) / ls ** (c2 / s2)
    est = fit_paper_form(ls.ravel(), s2.ravel(), values.ravel())
    # zero-residual least squares (Higham Thm 20.1): ‖δcoef‖ ≤ ‖X⁺‖‖δy‖ + 2κ(X)γ_{2N}‖coef‖, with δy the rounding
    # of log(c₁ ln L / L^{c₂/σ²}): γ_6(1 + |log c₁| + |log ln L| + (c₂/σ²) log L) per cell; c₁ = e^{coef₀}
    x = np.stack([np.ones(ls.size), -np.log(ls.ravel()) / s2.ravel()], -1)
    sv = np.linalg.svd(x, compute_uv=False)
    dy = gamma(6) * (1 + abs(np.log(c1)) + np.abs(np.log(np.log(ls.ravel()))) + c2 / s2.ravel() * np.log(ls.ravel()))
    coef_tol = np.linalg.norm(dy) / sv[-1] + 2 * (sv[0] / sv[-1]) * gamma(2 * ls.size) * np.hypot(np.log(c1), c2)
    assert_within(est, [c1, c2], [c1 * (coef_tol + gamma(2)), coef_tol], "(c₁, c₂)")


def _synthetic_errors(c_values, lengths, reps=20):
    """An error table with every metric c·n_r·L^{−0.6}, n_r a log-normal factor per repetition (Gaussian, σ² = c)."""
    rng = np.random.default_rng(3)
    frames = []
    for c in c_values:
        errors = c * rng.lognormal(size=(reps, 1)) * lengths ** -0.6  # [R, P]
        frames.append(pd.DataFrame({"token_measure": "gaussian", "c": c, "sigma_sq": c, "prompt_length": np.tile(lengths, reps),
                                    "repetition": np.repeat(np.arange(reps), len(lengths)),
                                    **{column: errors.ravel() for column in ERROR_METRICS.values()}}))
    return pd.concat(frames, ignore_index=True)


def test_figure_curves_are_rows_of_the_rate_tables():
    """The curves the figures draw are written by the stage (docs/experiments.md#output_concentration,
    docs/experiments.md#rate_exponent), checked against their closed forms (rounding bounds from eps)."""
    lengths = np.asarray(prompt_length_grid(4, 10, 1), dtype=float)
    cfg = RateSettings(dim=2, n_bootstrap=20, ci_level=0.95, paper_form_min_c=0.5)
    tables = rate_tables(*in_memory_cells(_synthetic_errors([0.25, 0.5, 1.0], lengths)), cfg, seed=1)
    assert set(tables) == set(TABLES)
    stats = tables["error_statistics"].set_index(["metric", "c", "statistic", "prompt_length"])["estimate"]
    assert pd.api.types.is_integer_dtype(tables["error_statistics"]["prompt_length"])
    guides, exponents = tables["rate_guides"], tables["exponents"].set_index(["metric", "c", "statistic"])
    assert len(guides) == 3 * 3 * 2 * (len(lengths) - len(lengths) // 2)  # metric × c × (mean, median) × fitted L
    for (metric, c, stat), guide in guides.groupby(["metric", "c", "statistic"]):
        guide = guide.sort_values("prompt_length")
        start = guide["prompt_length"].iloc[0]
        assert start == exponents.loc[(metric, c, stat), "fit_min_prompt_length"] == lengths[upper_half(lengths)][0]
        p = guide["predicted"].to_numpy()
        assert np.all(p == (float(predicted_exponent(c)) if stat == "mean" else 1.0))
        # statistic(L₀)·(L/L₀)^{−p} as exp(−p log(L/L₀)): the exponent's rounding is amplified by p·log(L/L₀)
        log_ratio = np.log(guide["prompt_length"].to_numpy() / start)
        expected = stats[(metric, c, stat, start)] * np.exp(-p * log_ratio)
        assert_within(guide["guide"], expected, gamma(6) * expected * (1 + p * log_ratio), f"guide {metric} c={c} {stat}")
    curves = tables["exponent_curves"]
    curve = curves[curves["curve"] == "predicted"].sort_values("c")
    grid = curve["c"].to_numpy()
    assert len(curve) == CURVE_POINTS and grid[0] == 0.25 * 0.8 and grid[-1] == 1.0 * 1.25 and np.all(np.diff(grid) > 0)
    expected = np.minimum(1.0, (np.sqrt(1 + 4 / grid) - 1) / 2)  # p(c), docs/theory.md#random-query-rate
    assert_within(curve["exponent"], expected, gamma(8) * expected, "predicted exponent curve")
    fits = tables["paper_form_fits"].set_index("metric")
    for metric in ERROR_METRICS:
        fit = fits.loc[metric]
        form = curves[(curves["curve"] == "paper_form") & (curves["metric"] == metric)].sort_values("c")
        assert fit["min_c"] == 0.5 and np.array_equal(form["c"].to_numpy(), grid[grid >= 0.9 * fit["min_c"]])
        for column, source in (("exponent", "c2"), ("ci_low", "c2_ci_low"), ("ci_high", "c2_ci_high"), ("predicted", "c2_predicted")):
            # ĉ₂/c, one division; predicted c₂ = 1/2
            assert_within(form[column] * form["c"], fit[source], 2 * gamma(1) * abs(fit[source]), f"{metric} {column}")


def rate_outputs(folder):
    return {name: str(folder / f"{name}.parquet") for name in TABLES}


def _simulate(folder, c_values, measure="gaussian"):
    """One simulate_concentration_errors job (one measure, every c on the same draws); its error file."""
    path = folder / f"{measure}.parquet"
    simulate_concentration_errors({}, {"errors": str(path)}, dict(seed=5, dtype="float64", token_measure=measure,
                                                                  concentration=dict(SWEEP, c_values=list(c_values))),
                                  runtime=CPU)
    return str(path)


def _sweep(tmp_path, c_values, measure="gaussian", n_bootstrap=100, paper_form_min_c=0.25):
    """The three concentration stages on ``c_values``: the rate tables by name and the error files."""
    jobs = [_simulate(tmp_path, c_values, measure)]
    out = {"output_errors": str(tmp_path / "o.parquet"), "gradient_errors": str(tmp_path / "g.parquet")}
    collect_concentration_errors({"jobs": jobs}, out, dict(seed=5))
    estimate_concentration_rates(out, rate_outputs(tmp_path), dict(seed=5, concentration=dict(
        dim=2, n_bootstrap=n_bootstrap, ci_level=0.95, paper_form_min_c=paper_form_min_c)))
    return {name: pd.read_parquet(path) for name, path in rate_outputs(tmp_path).items()}, jobs


@pytest.mark.slow
def test_small_tilt_mean_error_exponent_is_one(tmp_path):
    """For c ≤ 0.25 the fitted exponent of E‖T_L − T_∞‖² is within 0.1 of 1 (slope −1), from the stage code.

    The 0.1 and the 10% widening below are statistical/modelling margins (finite-L curvature of the log–log
    line, 1000 repetitions), not floating-point tolerances.
    """
    tables, jobs = _sweep(tmp_path, [0.1, 0.25])
    exps = tables["exponents"]
    exps = exps[(exps["metric"] == "output") & (exps["statistic"] == "mean")]
    assert len(exps) == 2
    assert np.all(np.abs(exps["estimate"] - 1.0) <= 0.1), exps[["c", "estimate", "ci_low", "ci_high"]]
    assert np.all(exps["ci_low"] <= exps["estimate"]) and np.all(exps["estimate"] <= exps["ci_high"])
    # L·E‖T_L − T_∞‖² at the largest L matches E_q tr C (docs/theory.md#fixed-query-fluctuations) within its
    # bootstrap CI widened by 10%.
    const = tables["asymptotic_constants"]
    assert np.all((const["predicted"] >= 0.9 * const["ci_low"]) & (const["predicted"] <= 1.1 * const["ci_high"]))
    # Same config and seed give bit-identical data.
    again = tmp_path / "again"
    again.mkdir()
    rerun = _simulate(again, [0.1, 0.25])
    pd.testing.assert_frame_equal(pd.read_parquet(jobs[0]), pd.read_parquet(rerun), check_exact=True)
    assert Path(rerun).read_bytes() == Path(jobs[0]).read_bytes()


def test_bounded_tokens_keep_rate_one_at_large_tilt(tmp_path):
    """Rademacher / uniform tokens: ρ(a) has every moment over queries, so even at c = 1 the mean rate is 1 (±0.1)."""
    exps = []
    for name in ("rademacher", "uniform"):
        folder = tmp_path / name
        folder.mkdir()
        tables, _ = _sweep(folder, [1.0], measure=name, n_bootstrap=50, paper_form_min_c=0.5)
        exps.append(tables["exponents"])
    exps = pd.concat(exps)
    exps = exps[(exps["metric"] == "output") & (exps["statistic"] == "mean")]
    assert len(exps) == 2 and np.all(exps["predicted"] == 1.0)
    assert np.all(np.abs(exps["estimate"] - 1.0) <= 0.1), exps[["token_measure", "estimate"]]


def test_slope_with_one_intercept_per_seed_recovers_a_common_slope():
    """log gap = a_seed − 0.9 log L exactly: the fit returns −0.9 to rounding, whatever the seeds' intercepts."""
    from largeprompt.maths.rates import loglog_slope_by_group

    lengths = np.array([20, 40, 80, 160] * 3, dtype=float)
    seeds = np.repeat([1, 2, 3], 4)
    gaps = np.exp(np.array([0.0, 1.5, -0.7])[seeds - 1]) * lengths**-0.9
    fit = loglog_slope_by_group(lengths, gaps, seeds)
    assert abs(fit["slope"] + 0.9) <= 64 * np.finfo(float).eps * np.log(160) * 12
    assert fit["n_groups"] == 3 and fit["n_fitted"] == 12
    # the 95% t-interval covers the true slope in 95% of noisy replications (binomial 5-sigma band over 2000)
    rng = np.random.default_rng(0)
    n, covered = 2000, 0
    for _ in range(n):
        fit = loglog_slope_by_group(lengths, gaps * np.exp(0.05 * rng.standard_normal(len(gaps))), seeds)
        covered += fit["slope_lo"] < -0.9 < fit["slope_hi"]
    assert abs(covered / n - 0.95) <= 5 * np.sqrt(0.95 * 0.05 / n)


def test_slope_by_group_without_spare_degrees_of_freedom_has_no_interval():
    from largeprompt.maths.rates import loglog_slope_by_group

    fit = loglog_slope_by_group([20, 40], [1.0, 0.5], [1, 1])
    assert fit["slope"] == pytest.approx(-1.0) and np.isnan(fit["slope_lo"])


def test_estimate_rates_reads_one_cell_at_a_time_and_matches_the_whole_table(tmp_path):
    """The stage reads the error tables cell by cell (filters, distinct keys): same rows as the table in memory."""
    from largeprompt.io.parquet_io import read_parquet, write_parquet

    lengths = np.asarray(prompt_length_grid(4, 9, 1), dtype=float)
    frame = _synthetic_errors([0.25, 1.0, 0.5], lengths)
    frame = pd.concat([frame, frame.assign(token_measure="rademacher")], ignore_index=True).sample(frac=1.0, random_state=3)
    frame = frame.assign(u=1.0, kappa=0.0)
    write_parquet(frame[ERROR_KEYS + ["output_sq_error"]], tmp_path / "out.parquet", {"rule": "test"})
    write_parquet(frame[ERROR_KEYS + ["grad_U_sq_error", "grad_V_sq_error"]].iloc[::-1], tmp_path / "grad.parquet",
                  {"rule": "test"})
    settings = dict(dim=2, n_bootstrap=20, ci_level=0.95, paper_form_min_c=0.5)
    estimate_concentration_rates({"output_errors": tmp_path / "out.parquet", "gradient_errors": tmp_path / "grad.parquet"},
                                 rate_outputs(tmp_path), {"concentration": settings, "seed": 4})
    whole = rate_tables(*in_memory_cells(frame), RateSettings(**settings), seed=4)
    for name in TABLES:
        streamed = read_parquet(tmp_path / f"{name}.parquet")
        assert len(streamed) == len(whole[name]), name
        pd.testing.assert_frame_equal(streamed.reset_index(drop=True), whole[name].reset_index(drop=True), check_exact=True)
    assert set(read_parquet(tmp_path / "exponents.parquet")["token_measure"]) == {"gaussian", "rademacher"}


@pytest.mark.parametrize("n_reps", [1, 2, 7, 128, 129, 1000])
def test_bootstrap_statistics_equal_explicit_resamples(n_reps):
    """Counts-based bootstrap against materialised resamples: order statistics exactly, means within γ_R."""
    from largeprompt.maths.rates import bootstrap_indices, bootstrap_statistics, statistic

    rng = np.random.default_rng(n_reps)
    errors = rng.chisquare(2.0, size=(n_reps, 5))
    errors[: n_reps // 3] = errors[0]  # ties
    idx = bootstrap_indices(n_reps, 70, rng)  # more than one block of 64
    got = bootstrap_statistics(errors, ("mean", "median", "q90"), idx)
    for name in ("median", "q90"):
        assert np.array_equal(got[name], np.stack([statistic(errors[i], name) for i in idx])), name
    explicit = np.stack([statistic(errors[i], "mean") for i in idx])
    assert_within(got["mean"], explicit, 2 * gamma(n_reps + 1) * errors.max())  # both orders of the same sum
    with pytest.raises(ValueError, match="unknown statistic"):
        bootstrap_statistics(errors, ("mode",), idx)
