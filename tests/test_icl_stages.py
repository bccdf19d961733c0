"""Stages of the in-context regression pipeline called by hand with the nested params the rules pass
(workflow/rules/icl.smk, infinite.smk, train.smk, trajectory_transfer.smk): test set, reference risks, flows, training, summaries, R4 gaps.
"""
import math

import numpy as np
import pandas as pd
import pytest
import torch

from helpers import theta
from largeprompt.icl import dynamics, trajectory_transfer
from largeprompt.icl.engine.runs import initial_parameters
from largeprompt.icl.full_model_risk import full_model_risk
from largeprompt.icl.risks import optimal_linear_attention_risk
from largeprompt.icl.task import regression_task
from largeprompt.icl.test_set import load_test_set
from largeprompt.io.checkpoints import Checkpoint
from largeprompt.io.parquet_io import read_parquet, read_provenance
from largeprompt.io.pipeline import Runtime, checkpoint_path
from largeprompt.kernel import autotune
from largeprompt.stages import summarize_trajectory_transfer
from largeprompt.stages.bayes_risk import bayes_risk
from largeprompt.stages.full_model_flow import full_model_flow
from largeprompt.stages.make_icl_test_set import make_icl_test_set
from largeprompt.stages.reduced_model import reduced_model
from largeprompt.stages.summarize_training import summarize_training
from largeprompt.stages.train import train
from largeprompt.stages.train_trajectory_transfer import train_trajectory_transfer
from tolerance import assert_within, eps, mc_tolerance, ode_tolerance

SEED = 7
ICL = {"dim": 2, "covariance_rho": 0.5, "task_variance": 0.5, "noise_variance": 0.1, "n_test": 400}
ICL_TASK = {k: ICL[k] for k in ("dim", "covariance_rho", "task_variance", "noise_variance")}  # what train.smk passes
TRAIN = {"models": ["softmax", "linear"], "prompt_lengths": [5, 30], "seeds": [0, 1], "replicate_seeds": [1],
         "batch_size": 8, "lr": 0.25, "step_size_rule": "flow_sharpness", "stability_fraction": 0.8, "horizon": 2.0,
         "decay_start": 0.5, "decay_end": 0.7, "final_lr": 0.1, "n_log": 4, "divergence_threshold": 1e4,
         "fatal_divergence": False, "dtype": "float32",
         "trapped_loss_ratio": {"softmax": 1.25, "linear": 1.1}, "trapped_readout_fraction": 0.1,
         "convergence_window": 0.2, "mode_gap_factor": 2.0, "unconverged_change": 0.05}
TRAIN_RUNS = ("models", "seeds", "replicate_seeds", "batch_size", "lr", "step_size_rule", "stability_fraction",
              "horizon", "decay_start", "decay_end", "final_lr", "n_log", "divergence_threshold", "fatal_divergence",
              "dtype")
TRANSFER = {"models": ["softmax", "linear"], "prompt_lengths": [10, 30], "seeds": [1], "replicate_seeds": [1],
            "batch_size": 16, "lr": 0.05, "horizon": 0.5, "n_log": 5, "floor_factor": 3}
INFINITE = {"rtol": 1e-8, "atol": 1e-10, "flow_points": 9}
REDUCED = {"dim": 2, "noise_variance": 0.25, "v0": 2.0, "a0": 0.1, "lr": 0.05, "steps": 4, "batch_size": 16,
           "log_every": 2, "prompt_lengths": [10, 40], "seeds": [0, 1]}
RUNTIME = Runtime(device="cpu", checkpoint_every=2)


def train_params(L):
    return {"prompt_length": L, "seed": SEED, "icl": ICL_TASK, "train": {k: TRAIN[k] for k in TRAIN_RUNS}}


def transfer_params(L):
    keep = ("models", "seeds", "replicate_seeds", "batch_size", "lr", "horizon", "n_log")
    return {"prompt_length": L, "seed": SEED, "icl": ICL_TASK, "trajectory_transfer": {k: TRANSFER[k] for k in keep}}


def trajectories(root, section, L):
    """Where the rules put a training job's output: results/<run>/<section>/L{L}.parquet (its checkpoint beside it)."""
    return root / "results" / "test" / section / f"L{L}.parquet"


def run_train(root, L, out):
    autotune.forget()  # as in a job of its own: provenance records the kernels and plans of this job only
    inputs = {"test_set": root / "icl_test.parquet", "flows": [root / f"flow{s}.parquet" for s in TRAIN["seeds"]]}
    train(inputs, {"trajectories": out}, train_params(L), runtime=RUNTIME)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Every stage once, at a tiny size, as the rules chain them."""
    root = tmp_path_factory.mktemp("icl")
    longest = max(TRAIN["prompt_lengths"] + TRANSFER["prompt_lengths"])
    make_icl_test_set({}, {"test_set": root / "icl_test.parquet"}, {"seed": SEED, "icl": ICL, "max_prompt_length": longest})
    bayes_risk({"test_set": root / "icl_test.parquet"}, {"bayes_risk": root / "bayes.parquet"},
               {"icl": ICL, "train": {"prompt_lengths": TRAIN["prompt_lengths"]}})
    for s in TRAIN["seeds"]:
        full_model_flow({}, {"flow": root / f"flow{s}.parquet"},
                        {"run_seed": s, "seed": SEED, "icl": ICL_TASK, "train": {"horizon": TRAIN["horizon"]},
                         "infinite": INFINITE})
    for L in TRAIN["prompt_lengths"]:
        run_train(root, L, trajectories(root, "train", L))
    for L in TRANSFER["prompt_lengths"]:
        train_trajectory_transfer({"test_set": root / "icl_test.parquet"}, {"trajectories": trajectories(root, "transfer", L)},
                       transfer_params(L), runtime=RUNTIME)
    reduced_model({}, {"result": root / "reduced.parquet"}, {"seed": SEED, "infinite": {"reduced_model": REDUCED}})
    return root


def test_test_set_is_nested_long_format_with_its_tasks(root):
    frame = read_parquet(root / "icl_test.parquet")
    n, longest = ICL["n_test"], 30
    assert set(frame["token_index"]) == set(range(-1, longest)) and frame["prompt"].nunique() == n
    q30, p30, y30 = load_test_set(frame)
    q5, p5, y5 = load_test_set(frame, 5)
    assert p30.shape == (n, longest, 3) and p5.shape == (n, 5, 3)
    assert torch.equal(p30[:, :5], p5) and torch.equal(q5, q30) and torch.equal(y5, y30)  # nested prefixes
    assert torch.all(q5[:, -1] == 0)  # z_q = (x_q, 0)
    # the stored β generates the labels: y − βᵀx is the label noise, prompt and query alike
    beta = torch.tensor(frame.sort_values(["prompt", "token_index"]).groupby("prompt")[["beta0", "beta1"]].first().to_numpy())
    prompt_noise = p30[..., -1] - (p30[..., :-1] @ beta[:, :, None]).squeeze(-1)  # [N, L]
    query_noise = y30 - (q30[:, :-1] * beta).sum(-1)  # [N]
    resid = torch.cat([prompt_noise, query_noise[:, None]], 1)
    s2 = ICL["noise_variance"]
    assert_within(float(resid.var()), s2, mc_tolerance(s2 * math.sqrt(2 / (resid.numel() - 1))), "σ²")
    assert_within(float(beta.var()), ICL["task_variance"],
                  mc_tolerance(ICL["task_variance"] * math.sqrt(2 / (beta.numel() - 1))), "τ²")
    assert read_provenance(root / "icl_test.parquet")["base_seed"] == SEED


def test_reference_risks_bayes_decreases_and_the_linear_optimum_matches_its_population_value(root):
    bayes = read_parquet(root / "bayes.parquet").sort_values("prompt_length")
    assert set(TRAIN["prompt_lengths"]) <= set(bayes["prompt_length"])
    assert bayes.loc[bayes["in_training_grid"], "prompt_length"].tolist() == TRAIN["prompt_lengths"]
    assert bayes["prompt_length"].is_unique and bayes["prompt_length"].min() == 1
    risk = bayes["bayes_risk"].to_numpy()
    assert risk[-1] < risk[0] and risk[-1] > ICL["noise_variance"] * 0.5
    # the test-set Γ* predictor's MSE estimates the population R(Γ*) (same prompts for every L: correlated, z = 5)
    task = regression_task(ICL)
    for _, row in bayes.iterrows():
        L = int(row["prompt_length"])
        want = optimal_linear_attention_risk(task.covariance.numpy(), ICL["task_variance"], ICL["noise_variance"], L)
        assert row["optimal_linear_attention_risk"] == want
        assert_within(row["optimal_linear_attention_test_risk"], want, mc_tolerance(row["optimal_linear_attention_test_risk_se"]),
                      f"R(Γ*) test vs population at L = {L}")
        # the Bayes predictor is the best one: not worse than Γ* beyond their Monte Carlo errors
        assert row["bayes_risk"] <= row["optimal_linear_attention_test_risk"] + mc_tolerance(
            row["bayes_risk_se"] + row["optimal_linear_attention_test_risk_se"])
    assert (bayes["bayes_risk_se"] > 0).all() and (bayes["optimal_linear_attention_test_risk_se"] > 0).all()


def test_full_model_flow_is_on_a_uniform_grid_from_the_training_start(root):
    flow = read_parquet(root / "flow1.parquet")
    assert np.array_equal(flow["time"].to_numpy(), np.linspace(0.0, TRAIN["horizon"], INFINITE["flow_points"]))
    assert (flow["sharpness"] > 0).all() and flow["seed"].eq(1).all()
    assert flow["infinite_prompt_risk"].iloc[-1] < flow["infinite_prompt_risk"].iloc[0]
    start = torch.cat([p.reshape(-1) for p in initial_parameters(SEED, 1, 3).values()]).numpy()
    # θ(0) is read from the solver's dense output at t = 0: within its tolerances of the initial weights
    scale = float(np.abs(start).max())
    assert_within(theta(flow)[0], start, ode_tolerance(INFINITE["rtol"], INFINITE["atol"], scale), "θ∞(0)")
    run = read_parquet(trajectories(root, "train", 5))
    first = run[(run["seed"] == 1) & (run["step"] == 0)]
    assert len(first) == 4  # softmax and linear, shared stream and replicate, all from the flow's start
    # training runs in float32: one rounding of each weight
    for weights in theta(first):
        assert_within(weights, start, eps(torch.float32) * np.abs(start), "θ(0)")
    prov = read_provenance(root / "flow1.parquet")
    assert prov["base_seed"] == SEED and prov["run_seeds"] == [1]


def test_train_stage_writes_every_run_and_is_reproducible(root, monkeypatch):
    out = trajectories(root, "train", 30)
    frame = read_parquet(out)
    columns = ["model", "prompt_length", "seed", "stream", "step", "time", "train_loss", "test_loss",
               "infinite_prompt_risk", "status", "stability_margin", "u_y", "theta"]
    assert set(columns) <= set(frame.columns)
    assert not any(c.startswith("theta_") for c in frame.columns)  # the weights are one list column
    assert theta(frame).shape == (len(frame), 3 * 9 + 3)  # Q, K, V (D × D each), then O (1 × D), D = 3
    runs = frame.groupby(["model", "seed", "stream"]).size()
    assert set(runs.index) == {(m, s, 0) for m in TRAIN["models"] for s in TRAIN["seeds"]} | {
        (m, 1, 1) for m in TRAIN["models"]}
    assert frame["prompt_length"].eq(30).all() and frame["status"].eq("ok").all()
    for _, run in frame.groupby(["model", "seed", "stream"]):
        assert run["step"].iloc[0] == 0 and run["time"].iloc[-1] == pytest.approx(TRAIN["horizon"], rel=1e-12)
        assert run["step"].is_monotonic_increasing
    # flow_sharpness keeps lr·λ within the stability fraction along each run's flow
    assert (frame["stability_margin"] <= 2 * TRAIN["stability_fraction"] * (1 + 1e-12)).all()
    checkpoint = checkpoint_path(out)
    assert checkpoint == root / "results" / "test" / "checkpoints" / "train" / "L30.pt"  # beside, not among, the outputs
    assert not checkpoint.exists()  # spent checkpoints are removed
    prov = read_provenance(out)
    assert prov["base_seed"] == SEED and prov["run_seeds"] == TRAIN["seeds"]
    assert prov["runtime"]["resolved_device"] == "cpu" and prov["runtime"]["checkpoint_every"] == 2
    assert prov["params"]["train"]["lr"] == TRAIN["lr"] and prov["params"]["prompt_length"] == 30
    # a second run of the same job: a checkpoint written on the way, then the same bytes
    saved = []
    real = Checkpoint.save
    monkeypatch.setattr(Checkpoint, "save", lambda self, state: saved.append((self.path, state["step"])) or real(self, state))
    again = root / "results" / "again" / "train" / "L30.parquet"
    run_train(root, 30, again)
    assert saved and all(path == checkpoint_path(again) and step % 2 == 0 for path, step in saved)
    assert not checkpoint_path(again).exists()
    pd.testing.assert_frame_equal(read_parquet(again), frame, check_exact=True)
    assert again.read_bytes() == out.read_bytes()


def test_train_transfer_runs_both_streams_at_a_constant_lr(root):
    frame = read_parquet(trajectories(root, "transfer", 10))
    assert set(frame.groupby(["model", "seed", "stream"]).groups) == {(m, 1, j) for m in TRANSFER["models"] for j in (0, 1)}
    for _, run in frame.groupby(["model", "stream"]):
        assert run["step"].iloc[-1] == math.ceil(TRANSFER["horizon"] / TRANSFER["lr"] - 1e-9)  # 10 steps of lr
        assert np.allclose(run["time"], TRANSFER["lr"] * run["step"], rtol=0, atol=1e-12)
        assert len(run) == TRANSFER["n_log"] + 1
    assert frame["stability_margin"].isna().all()  # no flow read: not measured
    shared, other = (theta(frame[(frame["model"] == "softmax") & (frame["stream"] == j)]) for j in (0, 1))
    assert np.array_equal(shared[0], other[0])
    assert not np.array_equal(shared[-1], other[-1])
    prov = read_provenance(trajectories(root, "transfer", 10))
    assert prov["rule"] == "train_trajectory_transfer" and prov["run_seeds"] == [1]
    assert not checkpoint_path(trajectories(root, "transfer", 10)).exists()


def summarize(root):
    inputs = {"trajectories": [trajectories(root, "train", L) for L in TRAIN["prompt_lengths"]],
              "flows": [root / f"flow{s}.parquet" for s in TRAIN["seeds"]], "bayes_risk": root / "bayes.parquet"}
    outputs = {"runs": root / "summary.parquet", "prompt_lengths": root / "prompt_length_summary.parquet"}
    params = {"seed": 3, "icl": ICL_TASK, "train": {k: TRAIN[k] for k in ("batch_size", "trapped_loss_ratio",
                                                                            "trapped_readout_fraction",
                                                                            "convergence_window", "mode_gap_factor",
                                                                            "unconverged_change")}}
    summarize_training(inputs, outputs, params)
    return read_parquet(outputs["runs"]), read_parquet(outputs["prompt_lengths"])


def test_summarize_training_writes_one_row_per_run_and_per_prompt_length(root):
    runs, table = summarize(root)
    n_runs = len(TRAIN["models"]) * (len(TRAIN["seeds"]) + len(TRAIN["replicate_seeds"]))
    assert len(runs) == n_runs * len(TRAIN["prompt_lengths"])
    assert not runs.duplicated(["model", "prompt_length", "seed", "stream"]).any()
    assert {"model", "prompt_length", "seed", "stream", "final_test_loss", "status", "excess_risk",
            "scaled_excess_risk", "escape_time", "stability_margin"} <= set(runs.columns)
    assert "kind" not in runs.columns and "kind" not in table.columns
    for col in ("seed", "stream", "step", "prompt_length"):
        assert pd.api.types.is_integer_dtype(runs[col]), col
    assert set(runs["status"]) <= {"ok", "trapped", "diverged"}
    assert len(table) == len(TRAIN["models"]) * len(TRAIN["prompt_lengths"])
    assert not table.duplicated(["model", "prompt_length"]).any()
    assert pd.api.types.is_integer_dtype(table["prompt_length"])
    assert table["n_seeds"].eq(len(TRAIN["seeds"])).all()  # the shared stream only
    # the final loss is the mean test loss over the last tenth of the horizon, by hand for one run
    traj = read_parquet(trajectories(root, "train", 30))
    one = traj[(traj["model"] == "linear") & (traj["seed"] == 0) & (traj["stream"] == 0)]
    tail = one[one["time"] >= 0.9 * one["time"].max()]["test_loss"].mean()
    got = runs[(runs["model"] == "linear") & (runs["seed"] == 0) & (runs["stream"] == 0) & (runs["prompt_length"] == 30)]
    assert got["final_test_loss"].item() == tail
    bayes = read_parquet(root / "bayes.parquet").set_index("prompt_length")
    assert_within(got["excess_risk"].item(), tail - bayes.loc[30, "bayes_risk"], eps(np.float64) * 2 * tail, "excess")


def test_trajectory_gap_tables(root):
    inputs = {"trajectories": [trajectories(root, "transfer", L) for L in TRANSFER["prompt_lengths"]],
              "reduced": root / "reduced.parquet"}
    outputs = {"gaps": root / "gaps.parquet", "slopes": root / "slopes.parquet"}
    params = {"seed": SEED, "icl": ICL_TASK, "infinite": {k: INFINITE[k] for k in ("rtol", "atol")},
              "trajectory_transfer": {"floor_factor": TRANSFER["floor_factor"], "lr": TRANSFER["lr"],
                           "batch_size": TRANSFER["batch_size"]}}
    summarize_trajectory_transfer.summarize_trajectory_transfer(inputs, outputs, params)
    gaps, slopes = read_parquet(outputs["gaps"]), read_parquet(outputs["slopes"])
    full = gaps[gaps["experiment"] == "full_model"]
    assert len(full) == len(TRANSFER["models"]) * len(TRANSFER["prompt_lengths"])  # one row per shared-stream run
    assert (full["sup_distance"] > 0).all() and (full["noise_floor"] > 0).all()
    reduced = gaps[gaps["experiment"] == "reduced_model"]
    assert len(reduced) == len(REDUCED["prompt_lengths"]) * len(REDUCED["seeds"])
    assert (reduced["noise_floor"] > 0).all() and reduced["euler_floor"].isna().all()  # its seeds are its streams
    for part in (full, reduced):  # the coupled design (docs/theory.md#coupled-limit): a distance and its noise floor
        assert (part["coupled_distance"] > 0).all() and (part["coupled_noise_floor"] > 0).all()
        np.testing.assert_array_equal(part["coupled_corrected_distance"],
                                      part["coupled_distance"] - part["coupled_noise_floor"])
    # the floor is sup_t ‖θ(t) − θ'(t)‖ between the two batch streams, recomputed from the trajectories
    traj = read_parquet(trajectories(root, "transfer", 30))
    a, b = (theta(traj[(traj["model"] == "linear") & (traj["stream"] == j)].sort_values("step")) for j in (0, 1))
    row = full[(full["model"] == "linear") & (full["prompt_length"] == 30)]
    assert row["noise_floor"].item() == np.linalg.norm(a - b, axis=1).max()
    # the Euler floor: plain GD at the runs' lr on R∞ against the flow, recomputed here step by step
    one = traj[(traj["model"] == "linear") & (traj["stream"] == 0)].sort_values("step")
    task = regression_task(ICL_TASK)
    params0 = initial_parameters(SEED, 1, task.token_dim)
    flow, _ = dynamics.full_model_flow(task, params0, one["time"].to_numpy(), **{k: INFINITE[k] for k in ("rtol", "atol")})
    risk, th, by_step = full_model_risk(task), torch.cat([params0[k].double().flatten() for k in "QKVO"]).numpy(), {}
    for k in range(int(one["step"].max()) + 1):
        by_step[k], th = th, th - TRANSFER["lr"] * risk.gradient(th)
    euler = np.linalg.norm(np.stack([by_step[int(k)] for k in one["step"]]) - flow, axis=1).max()
    assert_within(row["euler_floor"].item(), euler, 1e3 * eps(np.float64) * (1 + euler), "Euler floor")
    assert row["floor"].item() == max(row["noise_floor"].item(), row["euler_floor"].item())
    assert set(slopes["experiment"]) == {"full_model", "reduced_model"} and slopes["floor_factor"].eq(3).all()
    assert (slopes["n_points_above_floor"] <= slopes["n_points"]).all()
    assert read_provenance(outputs["gaps"])["base_seed"] == SEED


def synthetic_gaps():
    """Gaps 0.3·L^(−1/2) at L ≤ 100, ten times their floor; from L = 200 on, 1e-3 at the floor; one diverged run."""
    L = np.array([10, 20, 50, 100, 200, 500, 1000])
    gap = 0.3 * L**-0.5
    sup = np.where(L >= 200, 1e-3, gap)
    floor = np.where(L >= 200, sup, gap / 10)
    gaps = pd.DataFrame({"experiment": "full_model", "model": "softmax", "prompt_length": L, "seed": 1,
                         "sup_distance": sup, "noise_floor": floor, "floor": floor, "status": "ok"})
    gaps.loc[len(gaps)] = ["full_model", "softmax", 2000, 1, 1.0, np.nan, np.nan, "diverged"]  # never fitted
    return gaps


def test_slopes_use_only_points_above_the_floor():
    gaps = synthetic_gaps()
    row = trajectory_transfer.slopes(gaps, floor_factor=3.0).iloc[0]
    assert row["n_points_above_floor"] == 4
    assert row["fit_min_prompt_length"] == 10 and row["fit_max_prompt_length"] == 100
    assert_within(row["slope"], -0.5, 1e-12, "slope of an exact power law")
    everything = trajectory_transfer.slopes(gaps, floor_factor=0.0).iloc[0]
    assert everything["n_points_above_floor"] == 7 and abs(everything["slope"] + 0.5) > 0.1  # the floor bends the fit


def test_slopes_count_all_ok_points():
    assert trajectory_transfer.slopes(synthetic_gaps(), floor_factor=3.0).iloc[0]["n_points"] == 7


def test_floor_threshold_is_the_factor_times_the_median_floor_of_the_ok_runs():
    """trajectory_transfer.with_floor_threshold: per (experiment, model, L), factor × the median floor over ok seeds (a
    diverged run's floor does not count), the same on every row of the group."""
    rows = [("full_model", "softmax", 20, s, f, "ok") for s, f in enumerate([1.0, 2.0, 4.0])]
    rows += [("full_model", "softmax", 20, 3, 100.0, "diverged"), ("full_model", "linear", 20, 0, 5.0, "ok"),
             ("full_model", "softmax", 40, 0, 7.0, "ok")]
    gaps = pd.DataFrame(rows, columns=["experiment", "model", "prompt_length", "seed", "floor", "status"])
    out = trajectory_transfer.with_floor_threshold(gaps, 3.0)
    assert out["floor_threshold"].tolist() == [6.0, 6.0, 6.0, 6.0, 15.0, 21.0]
    by_measure = trajectory_transfer.with_floor_threshold(gaps.assign(token_measure=["a", "b", "a", "a", "a", "a"]), 2.0,
                                                    by=("token_measure", "model"))
    assert by_measure["floor_threshold"].tolist()[:3] == [5.0, 4.0, 5.0]  # median of 1 and 4 (seed 1 is another measure)
