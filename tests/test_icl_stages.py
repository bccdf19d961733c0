"""Stages 1–3 of the in-context regression pipeline, called by hand (SPEC §3.1): data, training, flows."""
import pandas as pd
import pytest
import torch

from largeprompt.parquet_io import read_parquet, read_provenance
from largeprompt.stages import icl_data, infinite, train

ICL = {"dim": 5, "covariance_rho": 0.5, "task_variance": 0.2, "noise_variance": 0.1, "n_test": 40}
TRAIN = {"steps": 20, "batch_size": 8, "lr": 0.2, "log_every": 5, "checkpoint_every": 10,
         "divergence_threshold": 1e4, "fatal_divergence": False, "dtype": "float32"}


@pytest.fixture
def data(tmp_path):
    test_set = tmp_path / "icl_test.parquet"
    params = {"seed": 7, "icl": ICL, "prompt_lengths": [5, 30]}
    icl_data.make_icl_test_set({}, {"test_set": test_set}, {"seed": 7, "icl": ICL, "max_prompt_length": 30})
    icl_data.bayes_risk({"test_set": test_set}, {"bayes_risk": tmp_path / "bayes.parquet"}, params)
    return tmp_path


def test_test_set_is_nested_long_format(data):
    frame = read_parquet(data / "icl_test.parquet")
    assert set(frame["token_index"]) == set(range(-1, 30)) and frame["prompt"].nunique() == 40
    q30, p30, y30 = icl_data.load_test_set(frame)
    q5, p5, y5 = icl_data.load_test_set(frame, 5)
    assert torch.equal(p30[:, :5], p5) and torch.equal(q5, q30) and torch.equal(y5, y30)
    assert torch.all(q5[:, -1] == 0)
    # the stored β generates the labels: y − βᵀx has the noise variance
    beta = torch.tensor(frame.sort_values(["prompt", "token_index"]).groupby("prompt")[[f"beta{j}" for j in range(5)]].first().to_numpy())
    resid = p30[..., -1] - (p30[..., :-1] @ beta[:, :, None]).squeeze(-1)
    assert 0.05 < float(resid.var()) < 0.2


def test_bayes_risk_decreases_to_the_noise(data):
    bayes = read_parquet(data / "bayes.parquet").sort_values("prompt_length")
    assert {5, 30} <= set(bayes["prompt_length"])
    assert bayes["bayes_risk"].iloc[-1] < bayes["bayes_risk"].iloc[0]
    assert read_provenance(data / "bayes.parquet")["rule"] == "bayes_risk"


def run_train(data, out, model="softmax", L=5):
    params = {"model": model, "prompt_length": L, "run_seed": 1, "seed": 7, "icl": ICL, "train": TRAIN,
              "device": "cpu", "checkpoint": str(data / "ckpt" / f"{model}{L}.pt")}
    train.train({"test_set": data / "icl_test.parquet"}, {"trajectory": out}, params)
    return read_parquet(out)


def test_train_stage_is_reproducible_and_cleans_its_checkpoint(data):
    a = run_train(data, data / "a.parquet")
    b = run_train(data, data / "b.parquet")
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert list(a["step"]) == [0, 5, 10, 15, 20] and a["status"].eq("ok").all()
    assert {"time", "train_loss", "test_loss", "infinite_prompt_risk", "norm_U", "u_y", "theta_000"} <= set(a.columns)
    assert not (data / "ckpt" / "softmax5.pt").exists()
    prov = read_provenance(data / "a.parquet")
    assert prov["params"]["train"]["lr"] == 0.2 and prov["seed"] == 1


def test_summary_and_trajectory_gap(data):
    runs = [run_train(data, data / f"{m}{L}.parquet", m, L) for m in ("softmax", "linear") for L in (5, 30)]
    assert all(len(r) for r in runs)
    paths = [data / f"{m}{L}.parquet" for m in ("softmax", "linear") for L in (5, 30)]
    train.summarize_training({"runs": paths, "bayes_risk": data / "bayes.parquet"}, {"summary": data / "summary.parquet"}, {})
    summary = read_parquet(data / "summary.parquet")
    s = summary[summary["kind"] == "summary"]
    assert len(s) == 4 and s["n_seeds"].eq(1).all()
    flow_params = {"run_seed": 1, "seed": 7, "icl": ICL, "train": {k: TRAIN[k] for k in ("steps", "lr", "log_every")},
                   "infinite": {"rtol": 1e-8, "atol": 1e-10}}
    infinite.full_model_flow({}, {"flow": data / "flow1.parquet"}, flow_params)
    flow = read_parquet(data / "flow1.parquet")
    assert list(flow["step"]) == [0, 5, 10, 15, 20]
    theta = [c for c in flow.columns if c.startswith("theta_")]
    assert flow.loc[0, theta].to_numpy().tolist() == pytest.approx(runs[0].loc[0, theta].to_numpy().tolist(), abs=1e-7)  # same start
    reduced = {"dim": 3, "noise_variance": 0.25, "v0": 2.0, "a0": 0.1, "lr": 0.05, "steps": 4, "batch_size": 16,
               "log_every": 2, "prompt_lengths": [10, 40], "seeds": [0, 1]}
    infinite.reduced_model({}, {"result": data / "reduced.parquet"}, {"seed": 7, "reduced_model": reduced})
    infinite.trajectory_gap({"runs": paths, "flows": [data / "flow1.parquet"], "reduced": data / "reduced.parquet"},
                            {"result": data / "gap.parquet"}, {"horizon": 10.0})
    gap = read_parquet(data / "gap.parquet")
    fits = gap[gap["kind"] == "fit"]
    assert set(fits["experiment"]) == {"full_model", "reduced_model"}
    assert (gap[gap["kind"] == "gap"]["sup_distance"] > 0).all()


def test_checkpoint_of_another_task_is_not_reused(data):
    """A checkpoint left by a killed job is ignored when the config's task has changed since."""
    from largeprompt.stages.train import run_config

    params = {"model": "softmax", "prompt_length": 5, "run_seed": 1, "seed": 7, "icl": ICL, "train": TRAIN}
    other = dict(params, icl=dict(ICL, noise_variance=ICL["noise_variance"] * 2))
    assert run_config(params).key() != run_config(other).key()
    assert run_config(params).key() == run_config(dict(params)).key()
