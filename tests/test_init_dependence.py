"""Init dependence of the R∞ flow (docs/experiments.md#init_dependence): the classifiers and the Wilson interval
against independent computations, and the stage against the single-seed flows that training reads."""
import numpy as np
import pytest
from scipy import stats

from largeprompt.icl.dynamics import full_model_flow
from largeprompt.icl.engine.runs import initial_parameters
from largeprompt.icl.flow_class import classify_flow
from largeprompt.icl.full_model_risk import full_model_risk
from largeprompt.icl.task import regression_task
from largeprompt.io.parquet_io import read_parquet
from largeprompt.maths.classifiers import fit_stump, logistic_cv_accuracy, stump_cv_accuracy, wilson_interval
from largeprompt.stages.simulate_init_dependence import simulate_init_dependence
from largeprompt.stages.summarize_init_dependence import summarize_init_dependence
from tolerance import gamma

ICL = {"dim": 5, "covariance_rho": 0.5, "task_variance": 0.2, "noise_variance": 0.1}


@pytest.mark.parametrize("k, n", [(0, 10), (3, 10), (36, 64), (64, 64), (1, 512)])
def test_wilson_interval_solves_its_defining_quadratic(k, n):
    """The Wilson endpoints are the p with (k/n − p)² = z² p(1 − p)/n: the roots of a quadratic, found independently."""
    z = stats.norm.ppf(0.975)
    phat = k / n
    roots = np.sort(np.roots([1 + z * z / n, -(2 * phat + z * z / n), phat * phat]).real)
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(max(roots[0], 0.0), abs=1e3 * gamma(1)) and hi == pytest.approx(min(roots[1], 1.0), abs=1e3 * gamma(1))


def test_wilson_interval_covers_at_its_level_on_average():
    """Exact binomial coverage, averaged over p in [0.05, 0.95], is within 2 points of 95% (it oscillates in p)."""
    n = 64
    ks = np.arange(n + 1)
    bounds = np.array([wilson_interval(int(k), n) for k in ks])
    coverage = [stats.binom.pmf(ks, n, p)[(bounds[:, 0] <= p) & (p <= bounds[:, 1])].sum() for p in np.linspace(0.05, 0.95, 181)]
    assert abs(np.mean(coverage) - 0.95) < 0.02 and min(coverage) > 0.85


def test_stump_finds_a_separating_threshold_and_scores_by_cross_validation():
    x = np.arange(20, dtype=float)
    y = x >= 12
    threshold, sign = fit_stump(x, y)
    assert sign == 1 and 11 < threshold < 12
    assert fit_stump(-x, y)[1] == -1  # the reversed rule
    assert stump_cv_accuracy(x, y, k=4) == 19  # only x = 12, held out, falls on its fold's threshold (11 + 13)/2
    gapped = np.r_[np.arange(10.0), np.arange(20.0, 30.0)]
    assert stump_cv_accuracy(gapped, gapped >= 20, k=4) == 20
    rng = np.random.default_rng(0)
    noise = rng.normal(size=400)
    labels = rng.random(400) < 0.5  # independent of x: chance level (binomial sd 10)
    assert abs(stump_cv_accuracy(noise, labels, k=8) - 200) < 5 * 10


def test_logistic_regression_learns_a_linear_boundary_and_not_noise():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) > 0.2
    assert logistic_cv_accuracy(X, y, k=5) >= 0.9 * 300
    labels = rng.random(300) < 0.5
    assert abs(logistic_cv_accuracy(X, labels, k=5) - 150) < 5 * np.sqrt(300 * 0.25)


@pytest.mark.slow
def test_stage_classes_match_the_training_flows(tmp_path):
    """The same seeds, integrated by the init-dependence stage and by full_model_flow (the training flows), get the
    same class; the class tables count every seed once."""
    params = {"seed": 20251211, "icl": ICL, "infinite": {"rtol": 1e-9, "atol": 1e-11},
              "init_dependence": {"n_seeds": 4, "horizon": 150.0, "n_folds": 2}}
    simulate_init_dependence({}, {"flows": tmp_path / "flows.parquet"}, params)
    summarize_init_dependence({"flows": tmp_path / "flows.parquet"},
                              {"classes": tmp_path / "c.parquet", "predictors": tmp_path / "p.parquet"}, params)
    flows, classes = read_parquet(tmp_path / "flows.parquet"), read_parquet(tmp_path / "c.parquet")
    task = regression_task(ICL)
    risk = full_model_risk(task)
    times = np.linspace(0.0, 150.0, 151)
    for seed in range(4):
        thetas, risks = full_model_flow(task, initial_parameters(20251211, seed, task.token_dim), times)
        kind, escape = classify_flow(times, risks, risk.readout_determinant(thetas), task.noise_variance)
        row = flows.set_index("seed").loc[seed]
        assert row["flow_class"] == kind and row["escape_time"] == escape
    assert classes["n_flows"].sum() == 4 and set(classes["flow_class"]) == {"converges", "drifts", "plateau"}
    assert (flows["flow_class"] == flows["flow_class_doubled_horizon"]).sum() >= 3
    predictors = read_parquet(tmp_path / "p.parquet")
    assert set(predictors["computed"]) == {"init", "flow"} and (predictors["n_correct"] <= predictors["n_flows"]).all()
