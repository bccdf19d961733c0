"""The size and power of the claims ledger's tests on synthetic data from a known truth
(largeprompt.ledger.calibration, docs/experiments.md#claims): "a verdict is a statistical test, and is tested like one".

Allowance. Under a true null the false-disagree rate over n draws must be at most 5% plus three binomial standard
errors, ``rate ≤ 0.05 + 3·sqrt(0.05·0.95/n)`` (:func:`allowance`): a test of exact size 5% fails this about once in
700 runs, a test of size 10% fails it almost surely once n ≥ 400. Every draw is seeded, so each test is deterministic.
Power floors are stated where the test is meant to have power (mostly at the paper budget).
"""
import math

import numpy as np
import pytest

from largeprompt.commands import cli
from largeprompt.ledger import calibration as cal


def allowance(n: int, level: float = 0.05) -> float:
    """The most a test of size ``level`` may show over n draws: level + 3 binomial standard errors."""
    return level + 3 * math.sqrt(level * (1 - level) / n)


def rates(kind, budget, n, truths=None, seed=0):
    frame = cal.size_and_power(kind, budget, n, seed, truths)
    return dict(zip(frame["truth"], frame["disagree_rate"])), frame


def assert_size(kind, budget, n, truths=None, seed=0):
    measured, frame = rates(kind, budget, n, truths, seed)
    nulls = frame[frame["null"]]
    assert not nulls.empty
    worst = nulls.loc[nulls["disagree_rate"].idxmax()]
    assert worst["disagree_rate"] <= allowance(n), (
        f"{kind} at the {budget} budget: false-disagree rate {worst['disagree_rate']:.3f} "
        f"[{worst['lo']:.3f}, {worst['hi']:.3f}] over {n} draws under '{worst['truth']}', above {allowance(n):.3f}")
    return measured


# --- the machinery: Wilson intervals, the synthetic truths --------------------------------------------------------------

def test_wilson_interval():
    lo, hi = cal.wilson(20, 400)
    assert lo == pytest.approx(0.0327, abs=5e-4) and hi == pytest.approx(0.0759, abs=5e-4)
    assert cal.wilson(0, 50)[0] == pytest.approx(0.0, abs=1e-12) and cal.wilson(50, 50)[1] == pytest.approx(1.0)
    assert all(math.isnan(x) for x in cal.wilson(0, 0))


def test_coefficient_truth_is_exact():
    """L·E err² = A + b²·L^−q: the mean over many repetitions is within 4 standard errors at every fitted L."""
    rng = np.random.default_rng(1)
    for q, tail in ((1.0, "gaussian"), (0.5, "exponential"), (1.0, "student_t")):
        lengths, errors = cal.coefficient_errors(rng, "default", 1.3, q, tail)
        scaled = lengths * errors
        expected = 1.3 + cal.COEFFICIENT_CORRECTION ** 2 * lengths ** (-q)
        se = scaled.std(axis=0) / math.sqrt(len(scaled))
        assert np.all(np.abs(scaled.mean(axis=0) - expected) < 4 * se)
    assert cal.concentration_lengths("default")[[0, -1]].tolist() == [1024, 65536]
    assert cal.concentration_lengths("paper")[[0, -1]].tolist() == [4096, 2 ** 20]


def test_bound_truth_is_exact():
    """The heavy-tailed query factor has mean 1 at every L (in closed form), so the mean error is the stated law."""
    rng = np.random.default_rng(2)
    lengths = np.array([10.0, 1e3, 1e5])
    factor = cal.query_factor(rng, 400_000, lengths)
    assert np.allclose(factor.mean(axis=0), 1.0, atol=0.05)
    assert cal.bound_exponent("default") == pytest.approx(0.5 - 1 / math.log(2 ** 13))  # c = 1, L̄ = √(2^10·2^16)


def test_gaps_table_follows_the_bracket_model():
    rng = np.random.default_rng(3)
    frame = cal.gaps_table(rng, "paper")
    assert len(frame) == 8 * 7 and set(frame["status"]) == {"ok"}
    assert (frame["coupled_corrected_distance"] <= frame["coupled_distance"]).all()
    assert frame.groupby("prompt_length")["coupled_floor_threshold"].nunique().eq(1).all()


def test_size_and_power_table_shape():
    frame = cal.size_and_power("holm", "default", 20, seed=1)
    assert list(frame.columns) == cal.COLUMNS and frame["draws"].eq(20).all()
    assert ((frame["lo"] <= frame["disagree_rate"]) & (frame["disagree_rate"] <= frame["hi"])).all()
    with pytest.raises(ValueError, match="budget"):
        cal.size_and_power("holm", "huge", 5)


def test_calibrate_command(monkeypatch, capsys):
    monkeypatch.setattr(cal, "calibration_table", lambda n, seed: cal.size_and_power("holm", "default", n, seed))
    assert cli.main(["calibrate", "--draws", "10", "--seed", "3", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| test | budget | truth |") and "Holm" in out


# --- the tests' size and power --------------------------------------------------------------------------------------------

def test_coefficient_size_default():
    assert_size("coefficient", "default", 200, ["A = 1, Gaussian increments, q = 1"])


@pytest.mark.slow
def test_coefficient_size_heavy_tails_and_power_default():
    """~1 min: 300 draws of every null (the log-scale test: 4.8% [3.4%, 6.9%] over 600 draws, docs/experiments.md#claims)."""
    measured = assert_size("coefficient", "default", 300, [t for t, null, _ in cal._truths()["coefficient"] if null] + ["A = 1.10"])
    assert measured["A = 1.10"] >= 0.9  # a 10% error in the closed form is seen at the default budget


@pytest.mark.slow
def test_coefficient_size_and_power_paper():
    measured = assert_size("coefficient", "paper", 20, ["A = 1, Gaussian increments, q = 1", "A = 1.05"])
    assert measured["A = 1.05"] >= 0.9  # 5% is three standard errors at 20 000 repetitions


def test_bound_size_default():
    assert_size("bound", "default", 150, ["mean ~ L^-bound (c = 1)"])


@pytest.mark.slow
def test_bound_size_and_power_paper():
    measured = assert_size("bound", "paper", 30)
    assert measured["mean ~ L^-(0.8 bound)"] >= 0.6  # 0.75 [0.66, 0.82] over 100 draws


def test_fixed_query_size_and_power():
    assert_size("fixed_query", "default", 120, ["P = delta in every cell"])
    paper, _ = rates("fixed_query", "paper", 30, ["P = 1.5 delta in one delta = 0.01 cell"])
    assert paper["P = 1.5 delta in one delta = 0.01 cell"] >= 0.9  # one failing cell among 180 is found


@pytest.mark.slow
def test_fixed_query_size_paper():
    assert_size("fixed_query", "paper", 200, ["P = delta in every cell"])


def test_softmax_size_and_power():
    assert_size("softmax", "default", 1000, ["A = 1"])
    assert_size("softmax", "paper", 1000, ["A = 1"])
    measured, _ = rates("softmax", "paper", 300, ["A = 0.98"])
    # the Birge-scaled t-test pays for weights estimated from five runs per L: a 2% error is found more often than not
    assert measured["A = 0.98"] >= 0.5


def test_linear_size_and_power():
    """One SGD-excess draw shared by the seeds (k = 2 stiff directions: the worst case R6.linear's test allows for),
    at the paper budget; the rest of its nulls in the slow test below."""
    assert_size("linear", "paper", 300, ["ratio 1 + one SGD-excess draw, k = 2"])
    measured, _ = rates("linear", "paper", 50, ["ratio 1.005 + one SGD-excess draw, k = 2"])
    assert measured["ratio 1.005 + one SGD-excess draw, k = 2"] >= 0.9  # the §6 runs resolve a 0.5% excess risk


@pytest.mark.slow
def test_linear_size_and_power_every_null():
    """Without and with an SGD-excess column, at both budgets (~1.5 min)."""
    nulls = ["ratio 1", "ratio 1 + one SGD-excess draw, k = 2"]
    assert_size("linear", "default", 1000, nulls)
    assert_size("linear", "paper", 1000, nulls)
    measured, _ = rates("linear", "paper", 200, ["ratio 1.005", "ratio 1.02", "ratio 1.005 + one SGD-excess draw, k = 2"])
    assert min(measured.values()) >= 0.99


@pytest.mark.slow
def test_bracket_size_default():
    """~5 s a draw (two seed bootstraps of 400 nonlinear fits): a coarse check, 8 draws."""
    assert_size("bracket", "default", 8, ["p = 1, b = +10", "p = 1, b = −10"])


@pytest.mark.slow
def test_bracket_size_paper():
    """~1 min: the bracket's size at the paper budget, 5 draws."""
    assert_size("bracket", "paper", 5, ["p = 1, b = +10", "p = 1, b = −10"])


@pytest.mark.slow
def test_bracket_power_paper():
    """~1 min. With the coupled design (docs/theory.md#coupled-limit) the bracket says disagrees against a decay L^−0.9
    at the paper budget (measured: 6 of 6). Against L^−1.1 its power is lower (2 of 6): the raw side, which carries
    the noise, is the one that must exceed 1 (docs/experiments.md#claims)."""
    measured, _ = rates("bracket", "paper", 6, ["p = 0.9"])
    assert measured["p = 0.9"] >= 0.5


def test_holm_controls_the_family_wise_rate():
    measured, _ = rates("holm", "default", 500)
    for dependence in ("independent", "correlation 0.5"):
        holm = measured[f"{cal.HOLM_SIZE} true nulls, {dependence}: Holm"]
        unadjusted = measured[f"{cal.HOLM_SIZE} true nulls, {dependence}: unadjusted"]
        assert holm <= allowance(500) and unadjusted >= 0.4, (dependence, holm, unadjusted)
    assert measured[f"{cal.HOLM_SIZE} true nulls, independent: unadjusted"] == pytest.approx(1 - 0.95 ** 30, abs=0.05)
