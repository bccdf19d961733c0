"""The R6 results tables on synthetic trajectories: run status (ok, trapped, diverged), escape times, the
convergence check and the seed statistics (docs/experiments.md#trapped-runs,
docs/experiments.md#training_vs_prompt_length)."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from largeprompt.parquet_io import read_parquet, write_parquet
from largeprompt.stages import training_summary as ts
from largeprompt.stages.training_summary import SummarySettings, flow_reference, prompt_length_row, run_row
from tolerance import assert_within, eps, rounding_tolerance

CFG = SummarySettings(trapped_readout_fraction=0.1, drift_sharpness_ratio=1.5, convergence_window=0.2)
TIMES = np.arange(21) / 2  # 0, 0.5, …, 10: exact binary fractions, so window edges compare exactly


def flow(seed=0, escapes=True, u_end=0.8, uxx_end=2.0):
    """A flow whose R∞ drops from 1.0 to 0.2 at t = 3 (escapes) or from 1.0 to 0.9 (stays on the plateau);
    its readout |u_y|·‖U_xx‖ ends at u_end·uxx_end (1.6)."""
    low = 0.2 if escapes else 0.9
    return pd.DataFrame({"seed": seed, "time": TIMES, "infinite_prompt_risk": np.where(TIMES < 3, 1.0, low),
                         "u_y": np.linspace(0.01, u_end, len(TIMES)), "norm_U_xx": np.linspace(0.5, uxx_end, len(TIMES)),
                         "sharpness": 1.0})


def trajectory(u_end, model="softmax", L=50, seed=0, stream=0, drop_at=4.0, test_loss=None, status=None, uxx_end=2.0):
    """A run logged at TIMES whose R∞ drops from 1.0 to 0.3 at ``drop_at``, whose u_y ends at ``u_end`` and ‖U_xx‖
    at ``uxx_end``."""
    n = len(TIMES)
    return pd.DataFrame({
        "model": model, "prompt_length": L, "seed": seed, "stream": stream, "step": np.arange(n) * 5, "time": TIMES,
        "train_loss": 1.0, "test_loss": np.linspace(1.0, 0.5, n) if test_loss is None else test_loss,
        "infinite_prompt_risk": np.where(TIMES < drop_at, 1.0, 0.3), "status": status if status is not None else "ok",
        "u_y": np.linspace(0.02, u_end, n), "norm_U_xx": np.linspace(0.5, uxx_end, n), "stability_margin": 1.2,
    })


def test_flow_reference_and_escape_times():
    ref = flow_reference(flow().sample(frac=1.0, random_state=0))  # row order does not matter
    assert ref["escapes"] and ref["threshold"] == 0.6 and ref["readout"] == 0.8 * 2.0 and ref["escape_time"] == 3.0
    stuck = flow_reference(flow(escapes=False))
    # the end 0.9 is not below half the start: no escape (the midpoint crossing is still timed: 0.9 < 0.95 at t = 3)
    assert not stuck["escapes"] and stuck["threshold"] == 0.95 and stuck["escape_time"] == 3.0
    assert math.isnan(ts.escape_time(flow(), 0.1))  # never below the threshold
    row = run_row(trajectory(0.7), ref, CFG)
    assert row["escape_time"] == 4.0 and row["flow_escape_time"] == 3.0 and row["flow_readout"] == 1.6
    assert row["readout"] == 0.7 * 2.0
    assert math.isnan(run_row(trajectory(0.7, drop_at=99.0), ref, CFG)["escape_time"])  # never escapes


@pytest.mark.parametrize("u_end, uxx_end, escapes, status", [
    (0.7, 2.0, True, "ok"),
    (-0.7, 2.0, True, "ok"),  # a readout of y with either sign
    (0.05, 2.0, True, "trapped"),  # |u_y|·‖U_xx‖ = 0.1 < 0.1 × 1.6 while the flow escapes
    (-0.05, 2.0, True, "trapped"),
    (0.05, 2.0, False, "ok"),  # the flow itself stays on the plateau: not a failure of the finite-L run
    (0.081, 2.0, True, "ok"),  # 0.162: just above the fraction
    (0.7, 0.2, True, "trapped"),  # u_y is read, but through a vanishing U_xx: 0.14 < 0.16
    (0.1, 1.7, True, "ok"),  # a small u_y read through a large U_xx: 0.17
])
def test_trapped_rule(u_end, uxx_end, escapes, status):
    row = run_row(trajectory(u_end, uxx_end=uxx_end), flow_reference(flow(escapes=escapes)), CFG)
    assert row["status"] == status


@pytest.mark.parametrize("growth, escapes, status, reason", [
    (3.0, True, "trapped", "drifting flow"),  # the flow's weights still drift: sharpness tripled over the second half
    (1.2, True, "ok", ""),  # below the drift ratio 1.5
    (3.0, False, "ok", ""),  # the flow itself stays on the plateau: nothing to be trapped against
])
def test_a_run_whose_flow_keeps_drifting_is_trapped(growth, escapes, status, reason):
    f = flow(escapes=escapes)
    f["sharpness"] = np.where(f["time"] <= 0.5 * f["time"].max(), 1.0, growth)
    row = run_row(trajectory(0.8), flow_reference(f), CFG)  # a run that reads y well
    assert (row["status"], row["trap_reason"]) == (status, reason)
    assert row["flow_sharpness_growth"] == pytest.approx(growth)


@pytest.mark.parametrize("where", [1, 10, 20])
def test_any_diverged_row_makes_the_run_diverged(where):
    run = trajectory(0.05)  # would be trapped
    run.loc[where, "status"] = "diverged"
    run = run.iloc[: where + 1]  # a diverged run stops at its last row
    row = run_row(run, flow_reference(flow()), CFG)
    assert row["status"] == "diverged" and row["final_test_loss"] == run["test_loss"].iloc[-1]
    assert row["step"] == run["step"].iloc[-1]


def test_final_loss_averages_the_last_tenth_of_the_horizon():
    loss = np.linspace(1.0, 0.5, len(TIMES))
    row = run_row(trajectory(0.7, test_loss=loss), flow_reference(flow()), CFG)
    tail = loss[TIMES >= 9.0]  # times 9.0, 9.5, 10.0
    assert len(tail) == 3
    assert_within(row["final_test_loss"], tail.mean(), rounding_tolerance(4, 1.0), "final loss")
    assert row["model"] == "softmax" and row["seed"] == 0 and row["stream"] == 0 and row["time"] == 10.0


def seeds_frame(levels, slope, status=None, stream=0):
    """One run per seed with test loss level_s + slope·t."""
    frames = []
    for seed, level in enumerate(levels):
        frames.append(trajectory(0.7, seed=seed, stream=stream, test_loss=level + slope * TIMES,
                                 status=(status or {}).get(seed, "ok")))
    return pd.concat(frames, ignore_index=True)


def runs_table(trajectories):
    ref = flow_reference(flow())
    return pd.DataFrame([run_row(g, ref, CFG) for _, g in trajectories.groupby(["seed", "stream"])])


def test_seed_mean_change_over_the_ok_shared_stream_runs():
    levels, slope = [1.0, 1.5, 2.0], -0.01
    traj = pd.concat([seeds_frame(levels, slope), trajectory(0.05, seed=3, test_loss=50.0 + 0 * TIMES),  # trapped
                      trajectory(0.7, seed=0, stream=1, test_loss=90.0 + 0 * TIMES)], ignore_index=True)  # replicate
    runs = runs_table(traj)
    assert runs.set_index(["seed", "stream"]).loc[(3, 0), "status"] == "trapped"
    ok = runs[(runs["status"] == "ok") & (runs["stream"] == 0)]
    got = ts.seed_mean_change(traj, ok, CFG.convergence_window)
    # windows of a twentieth of the horizon (0.5): [9.5, 10] at the end, [8, 8.5] at the start of the last 20%
    end, start = np.mean(levels) + slope * 9.75, np.mean(levels) + slope * 8.25
    assert_within(got, abs(end - start) / end, rounding_tolerance(20, 1.0), "seed_mean_change")
    assert math.isnan(ts.seed_mean_change(traj, ok.iloc[:0], CFG.convergence_window))


def bayes_row(L=50):
    return pd.Series({"bayes_risk": 0.3, "optimal_linear_attention_risk": 0.33, "optimal_linear_attention_test_risk": 0.34},
                     name=L)


PREDICTIONS = {"noise_variance": 0.1, "valley_correction": 12.0, "valley_scale": 0.4}


def test_seed_statistics_use_the_ok_shared_stream_runs_only():
    finals = {0: 0.40, 1: 0.44, 2: 0.38, 3: 0.41}
    traj = pd.concat([trajectory(0.7 if s != 2 else 0.05, seed=s, test_loss=v + 0 * TIMES) for s, v in finals.items()]
                     + [trajectory(0.7, seed=4, test_loss=7.0 + 0 * TIMES, status="ok").iloc[:5].assign(
                         status=["ok"] * 4 + ["diverged"]),
                        trajectory(0.7, seed=1, stream=1, test_loss=0.47 + 0 * TIMES),  # replicate of seed 1
                        trajectory(0.7, seed=2, stream=1, test_loss=0.99 + 0 * TIMES)],  # replicate of a trapped seed
                     ignore_index=True)
    runs = runs_table(traj)
    runs["bayes_risk"] = 0.3
    runs["excess_risk"] = runs["final_test_loss"] - 0.3
    runs["scaled_excess_risk"] = 50 * runs["excess_risk"]
    row = prompt_length_row(runs, traj, bayes_row(), PREDICTIONS, CFG)
    assert (row["n_seeds"], row["n_ok"], row["n_trapped"], row["n_diverged"]) == (5, 3, 1, 1)
    ok = np.array([finals[s] for s in (0, 1, 3)])
    half = stats.t.ppf(0.975, 2) * ok.std(ddof=1) / math.sqrt(3)
    tol = rounding_tolerance(10, 1.0)
    assert_within(row["final_test_loss_mean"], ok.mean(), tol, "mean")
    assert_within([row["final_test_loss_lo"], row["final_test_loss_hi"]], [ok.mean() - half, ok.mean() + half], tol, "CI")
    assert_within(row["scaled_excess_risk_mean"], 50 * (ok.mean() - 0.3), 50 * tol, "L·excess")
    assert row["final_test_loss_median"] == pytest.approx(0.41, abs=eps(np.float64) * 4)
    assert_within(row["max_deviation_from_median"], 0.44 / 0.41 - 1, tol, "max deviation")
    # the replicate of ok seed 1 differs by 0.03; the trapped seed's replicate is not compared
    assert_within(row["sgd_noise_spread"], 0.03, tol, "SGD-noise spread")
    assert row["max_stability_margin"] == 1.2 and row["converged"]  # flat losses: no change
    assert row["softmax_leading_order_risk"] == 0.1 + 12.0 / 50
    assert_within(row["softmax_leading_order_test_risk"], 0.34 + 0.1 + 12.0 / 50 - 0.33, tol, "softmax test theory")
    assert_within(row["predicted_excess_ratio"], (12.0 / 50) / (0.33 - 0.1), tol, "excess ratio")
    assert not row["softmax_theory_valid"]  # L = 50 < 200
    assert math.isnan(prompt_length_row(runs[runs["stream"] == 0], traj, bayes_row(), PREDICTIONS, CFG)["sgd_noise_spread"])


def test_summarize_training_classifies_each_run_against_its_own_seeds_flow(tmp_path):
    """Seed 0's flow escapes and seed 1's does not: the same unread y is trapped for seed 0 only."""
    prov = {"rule": "test"}
    paths = []
    for s, escapes in ((0, True), (1, False)):
        write_parquet(flow(s, escapes), tmp_path / f"flow{s}.parquet", prov)
    for L in (10, 50):
        traj = pd.concat([trajectory(0.05, model=m, L=L, seed=s) for m in ("softmax", "linear") for s in (0, 1)],
                         ignore_index=True)
        paths.append(write_parquet(traj, tmp_path / f"L{L}.parquet", prov))
    bayes = pd.DataFrame({"prompt_length": [10, 50], "bayes_risk": [0.5, 0.3], "optimal_linear_attention_risk": [0.6, 0.33],
                          "optimal_linear_attention_test_risk": [0.61, 0.34]})
    write_parquet(bayes, tmp_path / "bayes.parquet", prov)
    icl = {"dim": 2, "covariance_rho": 0.5, "task_variance": 0.5, "noise_variance": 0.1}
    ts.summarize_training({"trajectories": paths, "flows": [tmp_path / "flow0.parquet", tmp_path / "flow1.parquet"],
                           "bayes_risk": tmp_path / "bayes.parquet"},
                          {"runs": tmp_path / "runs.parquet", "prompt_lengths": tmp_path / "table.parquet"},
                          {"icl": icl, "train": {"trapped_readout_fraction": 0.1, "drift_sharpness_ratio": 1.5, "convergence_window": 0.2}})
    runs, table = read_parquet(tmp_path / "runs.parquet"), read_parquet(tmp_path / "table.parquet")
    assert len(runs) == 8 and len(table) == 4
    assert (runs["status"] == np.where(runs["seed"] == 0, "trapped", "ok")).all()
    assert table["n_trapped"].eq(1).all() and table["n_ok"].eq(1).all()
    assert (runs["excess_risk"] == runs["final_test_loss"] - runs["prompt_length"].map({10: 0.5, 50: 0.3})).all()
    for col in ("seed", "stream", "step", "prompt_length"):
        assert pd.api.types.is_integer_dtype(runs[col]), col
