"""Device-agnostic compute stages (issue: `device: auto | cpu | cuda`).

With torch's default device set to ``meta``, any tensor a stage creates without naming its device
lands on ``meta`` and the computation fails when it meets the stage's real tensors. So running a
stage with ``device="cpu"`` under a ``meta`` default proves that every tensor follows the configured
device, which is what moves a sweep to a GPU without code changes.
"""
import contextlib
import re

import pandas as pd
import pytest
import torch

from largeprompt.runlog import resolve_device
from largeprompt.stages import affine_limit, bounds, data, icl_data, train

from conftest import REPO

COMPUTE_RULES = ("simulate_affine_limit", "simulate_errors", "simulate_fixed_query_bounds", "train")


@contextlib.contextmanager
def default_device(device):
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(None)


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="config key 'device'"):
            resolve_device("cuda")


def test_every_compute_rule_receives_the_device_key():
    text = "".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    for rule in COMPUTE_RULES:
        body = re.search(rf"^rule {rule}:\n(.*?)(?=^rule |\Z)", text, flags=re.S | re.M).group(1)
        params = body.split("params:", 1)[1].split("log:", 1)[0]
        assert re.search(r"device=cfg\(\"device\"\)|device=config\[\"device\"\]", params), rule


def _run_stages(tmp_path):
    """Each compute stage at a tiny size; returns its output frames."""
    out = {}
    data.make_queries({}, {"queries": tmp_path / "q.parquet"}, {"ray": {"direction": [1.0, 0.5], "t_max": 1.0, "n_points": 3}})
    affine_limit.simulate_affine_limit(
        {"queries": tmp_path / "q.parquet"}, {"result": tmp_path / "a.parquet"},
        dict(seed=1, dtype="float64", device="cpu", measures=["gaussian", "rademacher", "uniform"], gaussian_mean=[0.1, 0.0],
             gaussian_rho=0.5, attention_scale=1.0, prompt_lengths=[10, 100], n_prompts=3, chunk_size=32),
    )
    out["affine_limit"] = pd.read_parquet(tmp_path / "a.parquet")
    bounds.simulate_errors(
        {}, {"result": tmp_path / "e.parquet"},
        dict(seed=1, dtype="float64", device="cpu", measure="uniform", c=0.5, dim=2, log2_min_prompt_length=3,
             log2_max_prompt_length=7, points_per_octave=1, n_repetitions=20, repetition_block=10, chunk_size=32),
    )
    out["errors"] = pd.read_parquet(tmp_path / "e.parquet")
    bounds.simulate_fixed_query_bounds(
        {}, {"result": tmp_path / "f.parquet"},
        dict(seed=1, dtype="float64", device="cpu", dim=2, rho=0.5, kappas=[0.25], log2_min_prompt_length=3,
             log2_max_prompt_length=6, n_repetitions=40, repetition_block=20, chunk_size=16, deltas=[0.1],
             ci_level=0.95, n_f2_draws=200),
    )
    out["fixed_query"] = pd.read_parquet(tmp_path / "f.parquet")
    icl = {"dim": 2, "covariance_rho": 0.5, "task_variance": 0.5, "noise_variance": 0.1, "n_test": 8}
    icl_data.make_icl_test_set({}, {"test_set": tmp_path / "t.parquet"}, {"seed": 1, "icl": icl, "max_prompt_length": 12})
    run = {"steps": 6, "batch_size": 4, "lr": 0.1, "log_every": 3, "checkpoint_every": 3, "divergence_threshold": 1e4,
           "fatal_divergence": False, "dtype": "float32"}
    train.train(
        {"test_set": tmp_path / "t.parquet"}, {"trajectory": tmp_path / "r.parquet"},
        {"model": "softmax", "prompt_length": 12, "run_seed": 0, "seed": 1, "icl": icl, "train": run, "device": "cpu",
         "checkpoint": str(tmp_path / "ckpt.pt")},
    )
    out["train"] = pd.read_parquet(tmp_path / "r.parquet")
    return out


def test_compute_stages_put_every_tensor_on_the_configured_device(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "meta").mkdir()
    reference = _run_stages(tmp_path / "plain")
    with default_device("meta"):
        strict = _run_stages(tmp_path / "meta")
    for name, frame in reference.items():
        pd.testing.assert_frame_equal(strict[name], frame, check_exact=True, obj=name)
