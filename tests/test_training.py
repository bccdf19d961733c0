"""The §6 model's efficient step, SGD training, resume and divergence (SPEC §0, §4, §5)."""
import math

import pandas as pd
import pytest
import torch

from largeprompt import models
from largeprompt.icl import RegressionTask
from largeprompt.measures import toeplitz_covariance
from largeprompt.seeding import stream_generator
from largeprompt.training import RunConfig, TrainingDiverged, _Interrupted, initial_parameters, train_run


def task():
    return RegressionTask(toeplitz_covariance(5, 0.5, dtype=torch.float64), 0.2, 0.1)


def make_test_set(n=32, L=20):
    return task().sample(n, L, stream_generator(9, "test/test_set"))


@pytest.mark.parametrize("model", models.MODELS)
def test_efficient_step_equals_naive(model):
    """Scores via U = KᵀQ/√D and the output via u = VᵀOᵀ give the naive Q/K/V/O forward and its gradients."""
    gen = stream_generator(2, "test/naive")
    params = {k: (3.0 * v).requires_grad_(True) for k, v in models.init_parameters(6, gen).items()}
    query, prompt, target = task().sample(16, 50, gen)
    fast = models.predict(params, query, prompt, model)
    slow = models.predict_naive(params, query, prompt, model)
    assert torch.allclose(fast, slow, rtol=1e-12, atol=1e-12)
    assert fast.std() > 1e-3  # a non-trivial check
    g_fast = torch.autograd.grad(models.mse(fast, target), list(params.values()))
    g_slow = torch.autograd.grad(models.mse(slow, target), list(params.values()))
    for a, b in zip(g_fast, g_slow):
        assert torch.allclose(a, b, rtol=1e-11, atol=1e-12)


def test_init_is_torch_default_and_shared_by_both_models():
    p = initial_parameters(5, 3, 6)
    bound = 1 / math.sqrt(6)
    for name in models.PARAMETER_NAMES:
        assert p[name].abs().max() <= bound and p[name].abs().max() > 0.8 * bound  # U(−1/√fan_in, 1/√fan_in)
    q = initial_parameters(5, 3, 6)
    assert all(torch.equal(p[k], q[k]) for k in p)
    assert not torch.equal(p["Q"], initial_parameters(5, 4, 6)["Q"])
    # nn.Linear's own default init has the same law: compare the bound of its draws
    lin = torch.nn.Linear(6, 6, bias=False)
    assert lin.weight.abs().max() <= bound


def config(model="softmax", **kw):
    base = dict(model=model, prompt_length=20, run_seed=0, base_seed=11, steps=30, batch_size=8, lr=0.05,
                log_every=5, divergence_threshold=1e4, dtype="float64")
    base.update(kw)
    return RunConfig(**base)


def test_linear_starts_from_the_softmax_weights():
    ts = make_test_set()
    soft = train_run(task(), config("softmax", steps=5), ts)
    lin = train_run(task(), config("linear", steps=5), ts)
    theta = [c for c in soft.columns if c.startswith("theta_")]
    assert len(theta) == 3 * 36 + 6
    assert soft.loc[0, theta].equals(lin.loc[0, theta])
    assert not soft.iloc[-1][theta].equals(lin.iloc[-1][theta])
    assert list(soft["step"]) == [0, 5]
    assert soft["time"].iloc[-1] == pytest.approx(0.25)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_resume_is_bit_identical(tmp_path, dtype, capsys):
    ts = make_test_set()
    cfg = config(dtype=dtype)
    ckpt = tmp_path / "run.pt"
    full = train_run(task(), cfg, ts)
    with pytest.raises(_Interrupted):
        train_run(task(), cfg, ts, checkpoint_path=ckpt, checkpoint_every=10, _interrupt_at=27)  # "killed" at step 27
    assert ckpt.exists()
    resumed = train_run(task(), cfg, ts, checkpoint_path=ckpt, checkpoint_every=10)
    assert "resumed from" in capsys.readouterr().out
    pd.testing.assert_frame_equal(full, resumed, check_exact=True)
    # a checkpoint from another config is ignored, not trusted
    other = train_run(task(), config(dtype=dtype, lr=0.04), ts, checkpoint_path=ckpt, checkpoint_every=10)
    assert "another config" in capsys.readouterr().out
    assert not other["train_loss"].equals(full["train_loss"])


def test_divergence_is_recorded_or_fatal():
    ts = make_test_set()
    cfg = config(lr=200.0, divergence_threshold=50.0)
    frame = train_run(task(), cfg, ts)
    assert frame["status"].iloc[-1] == "diverged"
    assert (frame["status"].iloc[:-1] == "ok").all()
    assert frame["step"].iloc[-1] < cfg.steps
    with pytest.raises(TrainingDiverged, match="diverged at step"):
        train_run(task(), cfg, ts, fatal_divergence=True)


def test_training_learns():
    """A short run at a sensible lr lowers both the test loss and R∞ (not a hard-coded number)."""
    ts = make_test_set(256, 50)
    frame = train_run(task(), config(prompt_length=50, steps=400, lr=0.3, batch_size=32, log_every=100, dtype="float32"), ts)
    assert frame["status"].eq("ok").all()
    assert frame["test_loss"].iloc[-1] < 0.9 * frame["test_loss"].iloc[0]
    assert frame["infinite_prompt_risk"].iloc[-1] < 0.9 * frame["infinite_prompt_risk"].iloc[0]
