"""Device-agnostic compute stages (config key `device: auto | cpu | cuda`, read at run time).

With torch's default device set to ``meta``, any tensor a stage creates without naming its device
lands on ``meta`` and the computation fails when it meets the stage's real tensors. So running a
stage with ``Runtime(device="cpu")`` under a ``meta`` default proves that every tensor follows the
configured device, which is what moves a sweep to a GPU without code changes.
"""
import contextlib
import importlib
import inspect
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from helpers import REPO, workflow_rules
from largeprompt.core.devices import dtype_of, resolve_device
from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.pipeline import Runtime, Setting
from largeprompt.io.runlog import runtime_settings
from largeprompt.stages.make_affine_limit_queries import make_affine_limit_queries
from largeprompt.stages.make_icl_test_set import make_icl_test_set
from largeprompt.stages.simulate_affine_limit import simulate_affine_limit
from largeprompt.stages.simulate_concentration_errors import simulate_concentration_errors
from largeprompt.stages.simulate_fixed_query_bound import simulate_fixed_query_bound
from largeprompt.stages.train import train
from largeprompt.stages.train_trajectory_transfer import train_trajectory_transfer

CPU = Runtime(device="cpu")


@contextlib.contextmanager
def default_device(device):
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(None)


def test_resolve_device_and_dtype():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="config key 'device'"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="config key 'device' = 'tpu'"):
        resolve_device("tpu")
    assert dtype_of("float32") == torch.float32 and dtype_of("float64") == torch.float64
    with pytest.raises(ValueError, match="config key 'dtype'"):
        dtype_of("float16")


def compute_rules():
    """The rules that run on the configured device: with ``device: cuda`` each asks its cluster job for a GPU."""
    return {name: rule for name, rule in workflow_rules((("device", "cuda"),)).items() if "gres" in rule.resources}


def test_every_compute_rule_hands_its_stage_the_runtime_device():
    """The device is a run-time key: never a param (changing it reruns nothing), always passed as ``runtime``.

    Read from the workflow as Snakemake parses it: each compute rule's params, and the stage its script runs (the
    rule's name in largeprompt.stages, docs/architecture.md#naming).
    """
    rules = compute_rules()
    assert {"simulate_affine_limit", "simulate_concentration_errors", "simulate_fixed_query_bound", "train",
            "train_trajectory_transfer"} <= set(rules)
    for name, rule in rules.items():
        keys = {value.key if isinstance(value, Setting) else key for key, value in rule.params.items()}
        assert not any(k == "device" or k.endswith(".device") or "device" in k.split("__") for k in keys), (name, keys)
        assert rule.script == REPO / "workflow" / "scripts" / f"{name}.py", (name, rule.script)
        assert f"run_stage(snakemake, {name})" in rule.script.read_text(), name
        stage = getattr(importlib.import_module(f"largeprompt.stages.{name}"), name)
        assert "runtime" in inspect.signature(stage).parameters, name


def test_runtime_settings_read_the_device_from_the_config():
    smk = SimpleNamespace(config={"device": "cpu", "train": {"checkpoint_every": 7}}, threads=3)
    assert runtime_settings(smk) == Runtime(device="cpu", threads=3, checkpoint_every=7)
    assert runtime_settings(SimpleNamespace(config={}, threads=1)) == Runtime()


@pytest.mark.parametrize("rule", ["train_trajectory_transfer", "train_trajectory_transfer_beyond_gaussian"])
def test_transfer_jobs_checkpoint_at_their_own_cadence(rule):
    """The R4 transfer jobs run a few hundred long steps: trajectory_transfer.checkpoint_every, not train's (runtime keys both)."""
    config = {"train": {"checkpoint_every": 10000}, "trajectory_transfer": {"checkpoint_every": 20}}
    assert runtime_settings(SimpleNamespace(config=config, threads=1, rule=rule)).checkpoint_every == 20
    assert runtime_settings(SimpleNamespace(config=config, threads=1, rule="train")).checkpoint_every == 10000


ICL = {"dim": 2, "covariance_rho": 0.5, "task_variance": 0.5, "noise_variance": 0.1}
RUNS = {"models": ["softmax", "linear"], "seeds": [0], "replicate_seeds": [0], "batch_size": 4, "lr": 0.1, "horizon": 0.6,
        "n_log": 3}


def _training_stages(tmp_path, out):
    make_icl_test_set({}, {"test_set": tmp_path / "t.parquet"}, {"seed": 1, "icl": dict(ICL, n_test=8), "max_prompt_length": 12})
    times = np.linspace(0.0, 0.6, 4)
    flow = pd.DataFrame({"seed": 0, "time": times, "sharpness": 1.0 + 10 * times,  # what the train stage reads of a flow
                         "infinite_prompt_risk": [1.1, 1.1, 0.15, 0.15], "readout_determinant": 1.0})
    write_parquet(flow, tmp_path / "flow0.parquet", {"rule": "full_model_flow"})
    section = dict(RUNS, step_size_rule="flow_sharpness", stability_fraction=0.8, decay_start=0.5, decay_end=0.7,
                   final_lr=0.05, divergence_threshold=1e4, fatal_divergence=False, dtype="float32")
    train({"test_set": tmp_path / "t.parquet", "flows": [tmp_path / "flow0.parquet"]}, {"trajectories": tmp_path / "r.parquet"},
          {"prompt_length": 12, "seed": 1, "icl": ICL, "train": section}, runtime=Runtime(device="cpu", checkpoint_every=2))
    out["train"] = pd.read_parquet(tmp_path / "r.parquet")
    train_trajectory_transfer({"test_set": tmp_path / "t.parquet"}, {"trajectories": tmp_path / "x.parquet"},
                   {"prompt_length": 12, "seed": 1, "icl": ICL, "trajectory_transfer": RUNS}, runtime=CPU)
    out["train_trajectory_transfer"] = pd.read_parquet(tmp_path / "x.parquet")


def _run_stages(tmp_path):
    """Each compute stage at a tiny size, with the nested params its rule passes; returns its output frames."""
    out = {}
    make_affine_limit_queries({}, {"queries": tmp_path / "q.parquet"},
                              {"affine_limit": {"ray": {"direction": [1.0, 0.5], "t_max": 1.0, "n_points": 3}}})
    simulate_affine_limit(
        {"queries": tmp_path / "q.parquet"},
        {"outputs": tmp_path / "a.parquet", "bands": tmp_path / "b.parquet", "leading_coefficients": tmp_path / "c.parquet"},
        {"seed": 1, "dtype": "float64", "affine_limit": dict(
            token_measures=["gaussian", "rademacher", "uniform"], gaussian_mean=[0.1, 0.0], gaussian_rho=0.5,
            attention_scale=1.0, prompt_lengths=[10, 100], n_prompts=3, chunk_size=32)},
        runtime=CPU,
    )
    out["affine_limit"] = pd.read_parquet(tmp_path / "a.parquet")
    simulate_concentration_errors(
        {}, {"errors": tmp_path / "e.parquet"},
        {"seed": 1, "dtype": "float64", "token_measure": "uniform", "concentration": dict(
            dim=2, c_values=[0.5, 2.0], log2_min_prompt_length=3, log2_max_prompt_length=7, points_per_octave=1,
            n_repetitions=20, repetition_block=10, chunk_size=32)},
        runtime=CPU,
    )
    out["errors"] = pd.read_parquet(tmp_path / "e.parquet")
    simulate_fixed_query_bound(
        {}, {"quantiles": tmp_path / "f.parquet"},
        {"seed": 1, "dtype": "float64", "fixed_query_bound": dict(
            dim=2, rho=0.5, kappas=[0.25], log2_min_prompt_length=3, log2_max_prompt_length=6, n_repetitions=40,
            repetition_block=20, deltas=[0.1], n_limit_law_draws=200, chunk_size=16, ci_level=0.95)},
        runtime=CPU,
    )
    out["fixed_query"] = pd.read_parquet(tmp_path / "f.parquet")
    _training_stages(tmp_path, out)
    return out


@pytest.mark.slow
def test_compute_stages_put_every_tensor_on_the_configured_device(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "meta").mkdir()
    reference = _run_stages(tmp_path / "plain")
    with default_device("meta"):
        strict = _run_stages(tmp_path / "meta")
    assert set(reference) == {"affine_limit", "errors", "fixed_query", "train", "train_trajectory_transfer"}
    for name, frame in reference.items():
        assert len(frame), name
        pd.testing.assert_frame_equal(strict[name], frame, check_exact=True, obj=name)
