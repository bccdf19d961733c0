"""The claims ledger (docs/experiments.md#claims): the verdict rules, each claim on tables built to agree or disagree,
missing inputs as `not run`, and the `claims` and `compare` commands."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from largeprompt import cli, reading
from largeprompt.io.parquet_io import write_parquet
from largeprompt.ledger import claims as ledger
from largeprompt.ledger import compare, measures
from largeprompt.ledger import verdicts as v


def test_interval_rule():
    assert v.interval(-1.2, -0.9, -1.0) == v.AGREES
    assert v.interval(-0.85, -0.75, -1.0) == v.DISAGREES
    assert v.interval(-2.2, 0.3, -1.0, max_width=1.0) == v.INCONCLUSIVE
    assert v.interval(float("nan"), 1.0, 0.0) == v.INCONCLUSIVE


def test_bound_and_decrease_rules():
    assert v.at_most(0.02, 0.03) == v.AGREES and v.at_most(0.04, 0.03) == v.DISAGREES
    assert v.at_most(float("nan"), 1.0) == v.INCONCLUSIVE
    assert v.decreases((0.1, 0.2), (0.3, 0.4)) == v.AGREES
    assert v.decreases((0.5, 0.6), (0.3, 0.4)) == v.DISAGREES
    assert v.decreases((0.25, 0.35), (0.3, 0.4)) == v.INCONCLUSIVE


def test_the_bootstrapped_slope_recovers_an_exact_power_law():
    lengths = np.array([100, 1000, 10000])
    rng = np.random.default_rng(0)
    errors = rng.exponential(1.0, size=(3, 500)) / lengths[:, None]  # E error = 1/L, spread over prompts
    slope, lo, hi = measures.log_slope_with_ci(errors, lengths)
    assert lo <= slope <= hi and lo < -1.0 + 0.1 and hi > -1.0 - 0.1 and hi - lo < 0.2


def test_r1_gives_each_measure_its_own_known_limit():
    """Bounded tokens with error² = 1/L + 30/L²: the fitted slope is steeper than −1, and the reason given is the 1/L²
    term, not the Gaussian tilt's pre-asymptotic ends."""
    lengths, prompts = np.array([100, 1000, 10000]), 400
    rows = [{"token_measure": m, "prompt_length": L, "prompt": p, "finite_prompt_output": np.sqrt(1 / L + c / L**2),
             "infinite_prompt_output": 0.0} for m, c in (("gaussian", 0.0), ("uniform", 30.0))
            for L in lengths for p in range(prompts)]
    rows = pd.DataFrame(rows)
    rows["finite_prompt_output"] *= 1 + 0.01 * np.random.default_rng(0).standard_normal(len(rows))
    got = _by_id(ledger.evaluate({"affine_limit/outputs.parquet": rows}.get))
    assert got.loc["R1/gaussian", "verdict"] == v.AGREES and got.loc["R1/gaussian", "why"] == ""
    assert got.loc["R1/uniform", "verdict"] == v.DISAGREES and got.loc["R1/uniform", "value"] < -1.0
    assert got.loc["R1/uniform", "why"] == measures.R1_BOUNDED_WHY


def _tables(slope_hi: float, linear_excess: float) -> dict[str, pd.DataFrame]:
    """Small tables with the columns the claims read; slope_hi < −1 makes R4 disagree, linear_excess > 0.03 R6."""
    lengths = [10, 20, 100]
    train = pd.DataFrame([
        {"model": m, "prompt_length": L, "n_ok": 6, "optimal_linear_attention_test_risk": 0.1 + 1 / L,
         "final_test_loss_mean": (0.1 + 1 / L) * (1 + linear_excess) if m == "linear" else 0.1 + 3 / L,
         "final_test_loss_lo": 0.1 + (2.9 / L if m == "softmax" else 1 / L),
         "final_test_loss_hi": 0.1 + (3.1 / L if m == "softmax" else 1 / L)} for m in ("linear", "softmax") for L in lengths])
    slopes = pd.DataFrame({"experiment": ["full_model"], "model": ["softmax"], "slope": [-1.05],
                           "slope_lo": [-1.2], "slope_hi": [slope_hi]})
    return {"train/training_prompt_lengths.parquet": train, "transfer/trajectory_slopes.parquet": slopes}


def _by_id(frame):
    return frame.set_index("claim_id")


def test_claims_follow_their_tables_and_missing_inputs_are_not_run():
    good = _by_id(ledger.evaluate(_tables(-0.9, 0.01).get))
    assert good.loc["R4/full_model", "verdict"] == v.AGREES and good.loc["R6.linear", "verdict"] == v.AGREES
    assert good.loc["R6.softmax/L=100", "verdict"] == v.AGREES
    assert good.loc["R6.linear", "value"] == pytest.approx(0.01)
    bad = _by_id(ledger.evaluate(_tables(-1.1, 0.05).get))
    assert bad.loc["R4/full_model", "verdict"] == v.DISAGREES and bad.loc["R6.linear", "verdict"] == v.DISAGREES
    assert bad.loc["R4/full_model", "why"] and not good.loc["R4/full_model", "why"]  # a disagreement says why
    for cid in ("R1", "R5", "init_dependence", "R4.beyond", "optimum.uniform"):
        assert good.loc[cid, "verdict"] == v.NOT_RUN
    assert set(good["verdict"]) <= set(v.VERDICTS)


def _write_run(root, run, noise, verdict_value):
    folder = root / "results" / run
    frame = ledger.evaluate(_tables(verdict_value, 0.01).get)
    write_parquet(frame, folder / "claims" / "claims.parquet", {"rule": "evaluate_claims", "params": {"seed": 1}})
    table = pd.DataFrame({"x": [1.0]})
    write_parquet(table, folder / "train" / "training_prompt_lengths.parquet",
                  {"rule": "summarize_training", "params": {"icl": {"noise_variance": noise, "dim": 5}}})
    if run == "b":
        write_parquet(table, folder / "extra" / "only_b.parquet", {"rule": "x", "params": {}})


def test_claims_command_prints_every_format(tmp_path, capsys, monkeypatch):
    _write_run(tmp_path, "a", 0.1, -0.9)
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
    assert capsys.readouterr().out.startswith("| claim_id | claim | verdict")


def test_a_missing_or_half_built_run_gets_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    _write_run(tmp_path, "a", 0.1, -0.9)
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
    _write_run(tmp_path, "a", 0.1, -0.9)
    _write_run(tmp_path, "b", 0.25, -1.1)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["compare", "a", "b"]) == 0
    out = capsys.readouterr().out
    assert "icl.noise_variance" in out and "icl.dim" not in out
    assert "extra/only_b.parquet" in out
    _write_run(tmp_path, "c", 1e-11, -1.1)  # a tiny value prints exactly, not rounded to 0.0
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
    tables = _tables(-0.9, 0.01) | {"beyond_gaussian/slopes.parquet": pd.DataFrame({"token_measure": ["uniform"]})}
    rows = _by_id(ledger.evaluate(tables.get))
    assert rows.loc["R4.beyond", "verdict"] == v.NOT_RUN and "no column 'slope'" in rows.loc["R4.beyond", "why"]


def test_the_floor_corrected_r4_claim_reads_its_own_fit_where_floors_were_measured():
    """R4.floor_corrected reads corrected_slope (docs/theory.md#floor-corrected-gap), beside the raw R4 claim, and
    skips the experiments without measured floors (the reduced model)."""
    slopes = pd.DataFrame({"experiment": ["full_model", "reduced_model"], "model": ["softmax", "softmax"],
                           "slope": [-0.83, -0.9], "slope_lo": [-0.86, -1.0], "slope_hi": [-0.80, -0.8],
                           "corrected_slope": [-0.97, np.nan], "corrected_slope_lo": [-1.02, np.nan],
                           "corrected_slope_hi": [-0.92, np.nan], "n_corrected_points": [40, 0]})
    rows = _by_id(ledger.evaluate((_tables(-0.9, 0.01) | {"transfer/trajectory_slopes.parquet": slopes}).get))
    assert rows.loc["R4/full_model", "verdict"] == v.DISAGREES and rows.loc["R4/full_model", "value"] == -0.83
    corrected = rows.loc["R4.floor_corrected/full_model"]
    assert corrected["verdict"] == v.AGREES and corrected["value"] == -0.97 and corrected["ci_low"] == -1.02
    assert "R4.floor_corrected/reduced_model" not in rows.index and "R4/reduced_model" in rows.index
    far = slopes.assign(corrected_slope_lo=-0.95)  # an interval that excludes −1
    assert _by_id(ledger.evaluate((_tables(-0.9, 0.01) | {"transfer/trajectory_slopes.parquet": far}).get)).loc[
        "R4.floor_corrected/full_model", "verdict"] == v.DISAGREES
    plain = _by_id(ledger.evaluate(_tables(-0.9, 0.01).get))  # a table written before the corrected fit existed
    assert plain.loc["R4.floor_corrected", "verdict"] == v.NOT_RUN
