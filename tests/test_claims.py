"""The claims ledger (docs/experiments.md#claims): the hypothesis tests and Holm's correction, each claim on tables
built to agree or disagree, missing inputs as `not run`, and the `claims` and `compare` commands."""
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from largeprompt.commands import cli, reading
from largeprompt.io.parquet_io import write_parquet
from largeprompt.ledger import claims as ledger
from largeprompt.ledger import compare, readings
from largeprompt.ledger import hypotheses as h
from largeprompt.ledger import verdicts as v


@pytest.fixture(autouse=True)
def fewer_r4_resamples(monkeypatch):
    """R4's seed bootstrap at 100 resamples instead of 400: these tests check what the ledger does with its tables,
    not the bootstrap's precision (its size is measured in tests/test_calibration.py)."""
    monkeypatch.setattr(readings, "R4_BOOTSTRAP", 100)


def test_two_sided_test_and_its_resolution():
    assert h.two_sided(1.02, 0.01, 1.0).verdict == v.DISAGREES  # z = 2 → p = 0.0455, below 5%
    assert h.two_sided(1.019, 0.01, 1.0).verdict == v.AGREES  # z = 1.9 → p = 0.057
    assert h.two_sided(1.02, 0.01, 1.0).p_value == pytest.approx(2 * stats.norm.sf(2.0))
    assert h.two_sided(1.01, 0.01, 1.0).verdict == v.AGREES and h.two_sided(1.03, 0.01, 1.0).verdict == v.DISAGREES
    assert h.two_sided(1.0, 0.5, 1.0, resolution=0.25).verdict == v.INCONCLUSIVE  # cannot tell ±25%
    assert h.two_sided(2.0, 0.5, 1.0, resolution=0.25).verdict == v.DISAGREES  # but can still reject
    assert h.two_sided(math.nan, 0.1, 1.0).verdict == v.INCONCLUSIVE


@pytest.mark.parametrize("variance_per_excess", [0.0, 4e-4])
def test_one_draw_law_matches_its_monte_carlo(variance_per_excess):
    """shifted_by_one_draw's p-value against a Monte Carlo of its null law D = X + √(v·X)·Z + se·T, X = e·Exp(1):
    closed form over X (v = 0) and Gauss–Laguerre over X (v > 0), both tails, to the Monte Carlo p's binomial error."""
    rng = np.random.default_rng(7)
    n, e, se, dof = 2_000_000, 1.5e-4, 2e-5, 4
    x = e * rng.exponential(size=n)
    draws = x + np.sqrt(variance_per_excess * x) * rng.standard_normal(n) + se * rng.standard_t(dof, n)
    for d in (-3e-4, -1e-4, 0.0, 2e-4, 8e-4, 1.5e-3):
        tail = min((draws >= d).mean(), (draws <= d).mean())
        expected = 2 * tail
        got = h.shifted_by_one_draw(1 + d, se, dof, e, 1.0, None, variance_per_excess).p_value
        if expected == 0:
            assert got < 2 * 5 / n, (d, got)
            continue
        assert abs(got - expected) <= 2 * 4 * math.sqrt(tail * (1 - tail) / n) + 1e-3 * expected, (d, got, expected)


def test_one_draw_law_without_the_test_set_term_rejects_data_that_has_it():
    """Data with the test set's first-order term (the paper run's sizes): left out of the law, the test rejects far
    more often than 5%; in it, at about 5% (the same draws)."""
    rng = np.random.default_rng(3)
    e, v, se, dof, n = 1.5e-4, 4 / 10_000, 2e-5, 7, 400
    x = e * rng.exponential(size=n)
    d = x + np.sqrt(v * x) * rng.standard_normal(n) + se * rng.standard_t(dof, n)
    without = np.mean([h.shifted_by_one_draw(1 + di, se, dof, e, 1.0).p_value < h.ALPHA for di in d])
    with_term = np.mean([h.shifted_by_one_draw(1 + di, se, dof, e, 1.0, None, v).p_value < h.ALPHA for di in d])
    assert without > 0.3
    assert abs(with_term - h.ALPHA) <= 4 * math.sqrt(h.ALPHA * (1 - h.ALPHA) / n)


def test_one_sided_tests_reject_only_on_their_side():
    assert h.at_least(0.5, 0.05, 0.6).verdict == v.DISAGREES and h.at_least(5.0, 0.05, 0.6).verdict == v.AGREES
    assert h.at_most(5.0, 0.05, 0.6).verdict == v.DISAGREES and h.at_most(0.5, 0.05, 0.6).verdict == v.AGREES
    out = h.at_most(0.7, 0.1, 0.6)
    assert out.lo < 0.7 < out.hi and out.p_value == pytest.approx(stats.norm.sf(1.0))


def test_bracket_rejects_when_either_side_misses():
    assert h.bracket((0.9, 0.02), (1.05, 0.02), 1.0).verdict == v.AGREES
    assert h.bracket((1.1, 0.02), (1.2, 0.02), 1.0).verdict == v.DISAGREES  # even the shallow side is steeper
    assert h.bracket((0.7, 0.02), (0.8, 0.02), 1.0).verdict == v.DISAGREES  # even the steep side is shallower
    assert h.bracket((0.5, 0.2), (1.5, 0.2), 1.0, resolution=0.25).verdict == v.INCONCLUSIVE


def test_binomial_bound_is_the_exact_upper_tail():
    out = h.binomial_at_most(12, 1000, 0.01)
    assert out.p_value == pytest.approx(stats.binom.sf(11, 1000, 0.01)) and out.value == pytest.approx(1.2)
    assert h.binomial_at_most(30, 1000, 0.01).verdict == v.DISAGREES and h.binomial_at_most(0, 1000, 0.01).p_value == 1


def test_holm_matches_its_step_down_definition():
    p = np.array([0.01, 0.04, np.nan, 0.03, 0.5])
    adjusted = h.holm(p)  # sorted 0.01, 0.03, 0.04, 0.5 with m = 4: 0.04, 0.09, 0.09 (monotone), 0.5
    np.testing.assert_allclose(adjusted[[0, 3, 1, 4]], [0.04, 0.09, 0.09, 0.5])
    assert np.isnan(adjusted[2])


def _gaps(p_raw: float, p_corr: float, seeds: int = 4) -> pd.DataFrame:
    """A gaps table whose raw and floor-corrected gaps fall exactly like L^−p_raw and L^−p_corr (tiny noise)."""
    rng = np.random.default_rng(0)
    rows = []
    for s in range(seeds):
        for L in (20, 40, 80, 160, 320):
            raw = (1 + 0.2 * s) * L ** -p_raw * (1 + 0.01 * rng.standard_normal())
            corr = (1 + 0.2 * s) * L ** -p_corr * 0.5 * (1 + 0.01 * rng.standard_normal())
            rows.append({"experiment": "full_model", "model": "softmax", "prompt_length": L, "seed": s, "status": "ok",
                         "sup_distance": raw, "floor": 1e-5, "floor_threshold": 3e-5, "corrected_distance": corr})
    return pd.DataFrame(rows)


def _train(linear_offset: float, softmax_a: float) -> pd.DataFrame:
    """A train summary table: linear ends at (1 + linear_offset)·R(Γ*); softmax's L·excess ratio is A − 5/L."""
    rows = []
    for L in (20, 50, 100, 200, 400, 600, 800, 1000):
        ref = 0.1 + 1 / L
        rows.append({"model": "linear", "prompt_length": L, "n_ok": 6, "optimal_linear_attention_test_risk": ref,
                     "final_test_loss_mean": ref * (1 + linear_offset), "final_test_loss_lo": ref * (1 + linear_offset - 1e-3),
                     "final_test_loss_hi": ref * (1 + linear_offset + 1e-3), "softmax_theory_valid": L >= 200,
                     "scaled_excess_over_theory_mean": 1.0, "scaled_excess_over_theory_lo": 0.99,
                     "scaled_excess_over_theory_hi": 1.01})
        r = softmax_a - 5.0 / L
        rows.append({"model": "softmax", "prompt_length": L, "n_ok": 6, "optimal_linear_attention_test_risk": ref,
                     "final_test_loss_mean": 0.2, "final_test_loss_lo": 0.19, "final_test_loss_hi": 0.21,
                     "softmax_theory_valid": L >= 200, "scaled_excess_over_theory_mean": r,
                     "scaled_excess_over_theory_lo": r - 0.01, "scaled_excess_over_theory_hi": r + 0.01})
    return pd.DataFrame(rows)


def _tables(p_raw: float, linear_offset: float) -> dict[str, pd.DataFrame]:
    """Tables with the columns the claims read: p_raw > 1 makes R4 disagree, linear_offset ≥ 1% R6.linear."""
    return {"train/training_prompt_lengths.parquet": _train(linear_offset, 1.0),
            "trajectory_transfer/gaps.parquet": _gaps(p_raw, 1.05)}


def _by_id(frame):
    return frame.set_index("claim_id")


def test_claims_follow_their_tables_and_missing_inputs_are_not_run():
    good = _by_id(ledger.evaluate(_tables(0.95, 0.0).get))
    assert good.loc["R4/full_model", "verdict"] == v.AGREES and good.loc["R6.linear", "verdict"] == v.AGREES
    assert good.loc["R6.softmax/L=200..1000", "verdict"] == v.AGREES
    assert good.loc["R6.softmax/L=200..1000", "value"] == pytest.approx(1.0, abs=1e-9)
    bad = _by_id(ledger.evaluate(_tables(1.2, 0.01).get))
    assert bad.loc["R4/full_model", "verdict"] == v.DISAGREES and bad.loc["R6.linear", "verdict"] == v.DISAGREES
    assert bad.loc["R4/full_model", "why"] and not good.loc["R4/full_model", "why"]  # a disagreement says why
    for cid in ("R1", "R5", "init_dependence", "R4.beyond", "optimum.uniform", "R2.leading"):
        assert good.loc[cid, "verdict"] == v.NOT_RUN
    assert set(good["verdict"]) <= set(v.VERDICTS) and set(good["kind"]) <= set(ledger.KINDS)


def test_r6_softmax_tests_the_leading_coefficient_not_a_trend():
    tables = {"train/training_prompt_lengths.parquet": _train(0.0, 0.9)}  # L·excess tends to 0.9 of the prediction
    row = _by_id(ledger.evaluate(tables.get)).loc["R6.softmax/L=200..1000"]
    assert row["verdict"] == v.DISAGREES and row["value"] == pytest.approx(0.9, abs=1e-9)


def test_r4_without_floors_fits_the_floor():
    """The reduced model has no measured floors: the bracket runs from the raw exponent to that of A_s·L^−p + f with
    the floor f fitted; a constant floor under a 1/L gap is not mistaken for a shallow exponent, and a 1/L^1.3 gap
    disagrees."""
    rows, rng = [], np.random.default_rng(3)
    for s in range(6):
        for L in (20, 50, 100, 200, 500, 1000, 2000):
            noise = 1 + 0.02 * rng.standard_normal()
            rows.append({"experiment": "reduced_model", "model": "softmax", "prompt_length": L, "seed": s,
                         "status": "ok", "floor": np.nan, "floor_threshold": np.nan, "corrected_distance": np.nan,
                         "one": (10 + s) / L * noise + 0.004, "steep": (10 + s) / L**1.3 * noise + 0.0004})
    frame = pd.DataFrame(rows)
    one = _by_id(ledger.evaluate({"trajectory_transfer/gaps.parquet": frame.assign(sup_distance=frame["one"])}.get))
    # one noisy draw: its test may reject at 5% by chance, never at 0.1% (the size is measured in test_calibration)
    assert one.loc["R4/reduced_model", "p_value"] > 1e-3
    assert abs(one.loc["R4/reduced_model", "value"] - 1.0) < 0.1  # the bracket's midpoint
    steep = _by_id(ledger.evaluate({"trajectory_transfer/gaps.parquet": frame.assign(sup_distance=frame["steep"])}.get))
    assert steep.loc["R4/reduced_model", "verdict"] == v.DISAGREES


def test_holm_adjusts_the_ledger_and_keeps_both_verdicts():
    tables = _tables(0.95, 0.0) | {"train/training_prompt_lengths.parquet": _train(0.0, 1.0)}
    rows = ledger.evaluate(tables.get)
    tested = rows[np.isfinite(rows["p_value"])]
    assert len(tested) >= 3 and (tested["p_holm"] >= tested["p_value"]).all()
    np.testing.assert_allclose(tested["p_holm"], h.holm(tested["p_value"]))
    assert set(rows["verdict_unadjusted"]) <= set(v.VERDICTS)


def test_a_disagreement_that_holm_does_not_keep_is_inconclusive():
    """Rejected alone but not over the family: the adjusted verdict is inconclusive, never agrees."""
    frame = pd.DataFrame({"p_value": [0.01, 0.5, 0.5, 0.5, 0.5, 0.001],
                          "verdict_unadjusted": [v.DISAGREES, v.AGREES, v.AGREES, v.INCONCLUSIVE, v.AGREES, v.DISAGREES]})
    out = ledger.family_wise(frame)
    assert list(out["verdict"]) == [v.INCONCLUSIVE, v.AGREES, v.AGREES, v.INCONCLUSIVE, v.AGREES, v.DISAGREES]


def test_findings_are_descriptive_or_checked_exactly():
    classes = pd.DataFrame({"flow_class": ["drifts", "converges"], "fraction": [0.5, 0.5], "fraction_lo": [0.4, 0.4],
                            "fraction_hi": [0.6, 0.6]})
    optima = pd.DataFrame({"token_measure": ["rademacher", "uniform"], "attained": [True, False],
                           "profile_min_risk": [0.1, 0.17], "infimum": [0.1, 0.1], "profile_max_risk": [0.3, 0.171]})
    rows = _by_id(ledger.evaluate({"init_dependence/classes.parquet": classes,
                                   "beyond_gaussian/optima.parquet": optima}.get))
    assert rows.loc["init_dependence", "verdict"] == v.DESCRIPTIVE and rows.loc["init_dependence", "kind"] == "finding"
    assert rows.loc["optimum.uniform", "verdict"] == v.DESCRIPTIVE
    assert rows.loc["optimum.rademacher", "verdict"] == v.AGREES
    wrong = optima.assign(profile_min_risk=[0.1001, 0.17])
    assert _by_id(ledger.evaluate({"beyond_gaussian/optima.parquet": wrong}.get)).loc[
        "optimum.rademacher", "verdict"] == v.DISAGREES


def test_leading_coefficient_claims_read_their_ratio():
    coefficients = pd.DataFrame({"token_measure": ["gaussian", "gaussian"], "metric": ["output", "grad_U"],
                                 "c": [0.1, 0.1], "estimate": [2.0, 3.3], "se": [0.02, 0.03], "predicted": [2.0, 3.0]})
    rows = _by_id(ledger.evaluate({"concentration/leading_coefficients.parquet": coefficients}.get))
    assert rows.loc["R2.leading/gaussian/c=0.1", "verdict"] == v.AGREES
    assert rows.loc["R3.U/gaussian/c=0.1", "verdict"] == v.DISAGREES
    assert rows.loc["R3.U/gaussian/c=0.1", "value"] == pytest.approx(1.1)


def test_the_bound_claim_is_one_sided():
    rows = pd.DataFrame({"token_measure": "gaussian", "metric": "output", "statistic": "mean", "c": [1.0, 4.0],
                         "estimate": [0.9, 0.0], "ci_low": [0.88, -0.005], "ci_high": [0.92, 0.005],
                         "fit_min_prompt_length": 1024, "fit_max_prompt_length": 65536})
    got = _by_id(ledger.evaluate({"concentration/exponents.parquet": rows}.get))
    assert got.loc["R2.bound/gaussian/c=1", "verdict"] == v.AGREES  # far faster than the bound: no evidence against
    # the bound's own slope over L = 2^10…2^16 is 1/8 − 1/ln(8192) = 0.014: an error that does not fall contradicts it
    assert got.loc["R2.bound/gaussian/c=4", "verdict_unadjusted"] == v.DISAGREES


def _write_run(root, run, noise, p_raw):
    folder = root / "results" / run
    frame = ledger.evaluate(_tables(p_raw, 0.0).get)
    write_parquet(frame, folder / "claims" / "claims.parquet", {"rule": "evaluate_claims", "params": {"seed": 1}})
    table = pd.DataFrame({"x": [1.0]})
    write_parquet(table, folder / "train" / "training_prompt_lengths.parquet",
                  {"rule": "summarize_training", "params": {"icl": {"noise_variance": noise, "dim": 5}}})
    if run == "b":
        write_parquet(table, folder / "extra" / "only_b.parquet", {"rule": "x", "params": {}})


def test_claims_command_prints_every_format(tmp_path, capsys, monkeypatch):
    _write_run(tmp_path, "a", 0.1, 0.95)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["claims", "a"]) == 0
    out = capsys.readouterr().out
    rows = reading.ledger_of("a", tmp_path)
    counts = rows["verdict"].value_counts()
    assert out.splitlines()[0] == f"{len(rows)} claims: " + ", ".join(f"{n} {k}" for k, n in counts.items())
    assert "R4/full_model" in out and "not run" in out
    assert cli.main(["claims", "a", "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert {r["claim_id"] for r in records} >= {"R4/full_model", "R6.linear"}
    assert cli.main(["claims", "a", "--format", "markdown"]) == 0
    assert capsys.readouterr().out.startswith("| claim_id | kind | claim | verdict")


def test_a_missing_or_half_built_run_gets_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    _write_run(tmp_path, "a", 0.1, 0.95)
    (tmp_path / "results" / "half").mkdir()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["claims", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no run 'nope'" in err and "a, half" in err and len(err.strip().splitlines()) == 1
    assert cli.main(["compare", "a", "half"]) == 2
    err = capsys.readouterr().err
    assert "half-built" in err and "snakemake --cores 2 results/half/claims/claims.parquet" in err
    assert cli.main(["claims", "../a"]) == 2


def test_compare_shows_differing_values_moved_claims_and_one_run_tables(tmp_path, capsys, monkeypatch):
    _write_run(tmp_path, "a", 0.1, 0.95)
    _write_run(tmp_path, "b", 0.25, 1.2)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["compare", "a", "b"]) == 0
    out = capsys.readouterr().out
    assert "icl.noise_variance" in out and "icl.dim" not in out
    assert "extra/only_b.parquet" in out
    _write_run(tmp_path, "c", 1e-11, 1.2)  # a tiny value prints exactly, not rounded to 0.0
    assert cli.main(["compare", "a", "c"]) == 0
    assert "1e-11" in capsys.readouterr().out
    both = compare.side_by_side(reading.ledger_of("a", tmp_path), reading.ledger_of("b", tmp_path)).set_index("claim_id")
    assert both.loc["R4/full_model", "moved"] and not both.loc["R6.linear", "moved"]


def test_moved_needs_disjoint_intervals_or_a_new_verdict():
    base = {"verdict": v.AGREES, "value": 1.0, "ci_low": 0.9, "ci_high": 1.1}
    assert not compare._moved(base, base | {"value": 1.05, "ci_low": 0.95, "ci_high": 1.15})
    assert compare._moved(base, base | {"value": 1.3, "ci_low": 1.2, "ci_high": 1.4})
    point = {"verdict": v.AGREES, "value": 0.01, "ci_low": math.nan, "ci_high": math.nan}
    assert not compare._moved(point, point | {"value": 0.01000001})
    assert compare._moved(point, point | {"value": 0.02})




def test_a_table_without_the_column_a_claim_reads_is_not_run():
    tables = _tables(0.95, 0.0) | {"beyond_gaussian/gaps.parquet": pd.DataFrame({"token_measure": ["uniform"]})}
    rows = _by_id(ledger.evaluate(tables.get))
    assert rows.loc["R4.beyond", "verdict"] == v.NOT_RUN and "no column" in rows.loc["R4.beyond", "why"]


def test_snakemake_reads_the_ledgers_tables_without_importing_it():
    """claim_table_names (the Snakefile's view, from the syntax tree) names exactly the tables of CLAIMS."""
    from pathlib import Path

    from largeprompt.io.pipeline import claim_table_names
    from largeprompt.ledger import claims

    assert claim_table_names(Path(claims.__file__)) == sorted({c.table for c in claims.CLAIMS})
