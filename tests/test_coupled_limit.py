"""The L = ∞ readout and the coupled L = ∞ runs of R4 (docs/theory.md#coupled-limit)."""
import numpy as np
import pandas as pd
import pytest
import torch

from largeprompt.core.seeding import stream_generator
from largeprompt.icl import models
from largeprompt.icl.bounded_risk import Quadrature, limit_risk
from largeprompt.icl.coupled_limit import coupled_differences, coupled_runs, limit_step, with_coupled_weights
from largeprompt.icl.engine.runs import batch, batch_generator, initial_parameters
from largeprompt.icl.full_model_risk import full_model_risk
from largeprompt.icl.task import RegressionTask

MEASURES = ["gaussian", "rademacher", "uniform"]


def task_of(measure: str) -> RegressionTask:
    cov = np.eye(3) if measure != "gaussian" else np.array([[1.0, 0.5, 0.25], [0.5, 1.0, 0.5], [0.25, 0.5, 1.0]])
    return RegressionTask(cov, 1 / 3, 0.1, measure)


def weights(seed: int, scale: float = 1.5):
    """Initial weights, scaled up so that the softmax is far from its linearisation."""
    params = initial_parameters(0, seed, 4)
    return models.attention_parameters(*(scale * params[n] for n in models.PARAMETER_NAMES))


@pytest.mark.parametrize("model", models.MODELS)
@pytest.mark.parametrize("measure", MEASURES)
def test_limit_readout_is_the_long_prompt_limit(measure, model):
    """Monte Carlo: at L = 200 000 the finite-L readout of each prompt lies within 5 of its own standard errors of the
    L = ∞ readout (softmax: the self-normalised ratio's delta-method error; linear: the mean's)."""
    task, (U, u) = task_of(measure), weights(1)
    query, prompt, _, beta = task.sample_with_tasks(6, 200_000, stream_generator(0, "test/limit", 0))
    limit = models.limit_readout(query, beta, U, u, task, model)
    scores, values = prompt @ (query @ U.T).unsqueeze(-1), prompt @ u  # [B, L, 1], [B, L]
    if model == "softmax":
        w = torch.softmax(scores.squeeze(-1), dim=-1)
        finite = (w * values).sum(-1)
        se = ((w**2 * (values - finite[:, None]) ** 2).sum(-1)).sqrt()
    else:
        terms = scores.squeeze(-1) * values
        finite, se = terms.mean(-1), terms.std(-1) / terms.shape[-1] ** 0.5
    assert torch.all((finite - limit).abs() < 5 * se), (finite, limit, se)


@pytest.mark.parametrize("measure", MEASURES)
def test_limit_readout_gaussian_softmax_is_linear(measure):
    """For Gaussian covariates ∇K_β is linear, so softmax and linear attention share their L = ∞ readout; for the
    bounded measures they differ."""
    task, (U, u) = task_of(measure), weights(2)
    query, _, _, beta = task.sample_with_tasks(50, 1, stream_generator(0, "test/limit", 1))
    soft, lin = (models.limit_readout(query, beta, U, u, task, m) for m in models.MODELS)
    close = torch.allclose(soft, lin, rtol=1e-12, atol=1e-12)
    assert close == (measure == "gaussian")


@pytest.mark.parametrize("model", models.MODELS)
@pytest.mark.parametrize("measure", MEASURES)
def test_limit_readout_risk_is_r_infinity(measure, model):
    """Monte Carlo over tasks and queries: the mean squared error of the L = ∞ readout is R∞ (the closed form for
    Gaussian covariates and for linear attention, the quadrature for softmax on bounded ones) within 5 standard
    errors plus the quadrature's stated error."""
    task = task_of(measure)
    params = {n: 1.5 * w for n, w in initial_parameters(0, 3, 4).items()}
    theta = models.flatten(params).numpy()
    query, _, target, beta = task.sample_with_tasks(400_000, 1, stream_generator(0, "test/limit", 2))
    sq = (models.limit_readout(query, beta, *models.attention_parameters(*params.values()), task, model) - target) ** 2
    mc, se = float(sq.mean()), float(sq.std()) / len(sq) ** 0.5
    if measure == "gaussian":
        exact, stated = float(full_model_risk(task).value(theta)), 0.0
    else:
        risk = limit_risk(task, model, Quadrature())
        exact = float(risk.value(theta))
        stated = float(risk.quadrature_error(theta)) if hasattr(risk, "quadrature_error") else 0.0
    assert abs(mc - exact) < 5 * se + stated, (mc, exact, se)


def finite_sgd(task, L: int, stream: int, steps: int, lr: float, B: int) -> list[np.ndarray]:
    """Plain torch SGD of the softmax model at L from seed 0's weights on batch stream ``stream``: θ at every step."""
    params = {n: w.requires_grad_() for n, w in initial_parameters(0, 0, task.token_dim).items()}
    out = [models.flatten({n: w.detach() for n, w in params.items()}).numpy().copy()]
    for k in range(steps):
        query, prompt, target = batch(task, 0, stream, k, B, L, torch.float64, "cpu")
        loss = models.mse(models.predict(params, query, prompt, "softmax"), target)
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for w, g in zip(params.values(), grads):
                w -= lr * g
        out.append(models.flatten({n: w.detach() for n, w in params.items()}).numpy().copy())
    return out


def test_coupled_run_cancels_the_batch_noise():
    """The coupled L = ∞ run over the same batches (its own redraw of the run's stream) is far closer to the finite-L
    run than the finite-L run of another stream is, and its distance falls with L (R4 in miniature)."""
    task, steps, lr, B = task_of("gaussian"), 6, 0.05, 256
    gaps = {}
    for L in (40, 640):
        finite = {j: finite_sgd(task, L, j, steps, lr, B) for j in (0, 1)}
        runs = pd.DataFrame({"model": "softmax", "seed": 0, "stream": 0, "step": range(steps + 1),
                             "status": "ok", "theta": finite[0]})
        diff = coupled_differences(with_coupled_weights(runs, task, 0, lr, B, L))
        gaps[L] = max(np.linalg.norm(d) for d in diff["difference"])
        between_streams = max(np.linalg.norm(a - b) for a, b in zip(finite[0], finite[1]))
        if L == 640:  # at L = 40 the O(1/L) part itself is as large as the batch noise of these six steps
            assert gaps[L] < 0.2 * between_streams, (L, gaps[L], between_streams)
    assert gaps[640] < 0.25 * gaps[40], gaps


def test_coupled_runs_skip_diverged_runs_and_log_the_logged_steps():
    """Only runs that never diverged get a coupled run, logged at exactly their logged steps, from their initial
    weights; one step of it is :func:`limit_step` on batch 0."""
    task = task_of("gaussian")
    rows = [{"model": m, "seed": s, "stream": 0, "step": k, "status": "diverged" if s == 1 else "ok", "theta": None}
            for m in models.MODELS for s in (0, 1) for k in (0, 1, 3)]
    coupled = coupled_runs(pd.DataFrame(rows), task, 0, 0.01, 32, 10)
    assert set(coupled["seed"]) == {0} and sorted(coupled["step"].unique()) == [0, 1, 3]
    init = initial_parameters(0, 0, task.token_dim)
    start = coupled[(coupled["model"] == "softmax") & (coupled["step"] == 0)]["theta"].iloc[0]
    np.testing.assert_array_equal(start, models.flatten(init).numpy())
    state = {("softmax", 0): {n: w.clone().requires_grad_() for n, w in init.items()}}
    query, _, target, beta = task.sample_with_tasks(32, 10, batch_generator(0, 0, 0, torch.float64))
    limit_step(state, query, beta, target, task, 0.01)
    one = coupled[(coupled["model"] == "softmax") & (coupled["step"] == 1)]["theta"].iloc[0]
    np.testing.assert_allclose(one, models.flatten({n: w.detach() for n, w in state[("softmax", 0)].items()}).numpy(),
                               rtol=0, atol=1e-15)



@pytest.mark.parametrize("measure", MEASURES)
def test_query_side_is_the_draws_query_side(measure):
    """sample_query_side gives sample_with_tasks's query, target and β from the same generator state, to rounding."""
    task = task_of(measure)
    query, _, target, beta = task.sample_with_tasks(64, 17, batch_generator(5, 1, 3, torch.float64))
    q, t, b = task.sample_query_side(64, 17, batch_generator(5, 1, 3, torch.float64))
    torch.testing.assert_close(q, query, rtol=4 * torch.finfo(torch.float64).eps, atol=0)
    torch.testing.assert_close(b, beta, rtol=0, atol=0)
    torch.testing.assert_close(t, target, rtol=16 * torch.finfo(torch.float64).eps, atol=16 * torch.finfo(torch.float64).eps)


def test_coupled_weights_are_the_coupled_runs_beside_each_row():
    """with_coupled_weights keeps every row of the runs in order and puts the coupled run's θ of its (run, step)
    beside it; a diverged run's rows get None."""
    task = task_of("gaussian")
    P = models.flatten(initial_parameters(0, 0, task.token_dim)).numel()
    rows = pd.DataFrame([{"model": "softmax", "seed": s, "stream": 0, "step": k, "status": "diverged" if s == 1 else "ok",
                          "theta": np.full(P, float(k))} for s in (0, 1) for k in (0, 2)])
    out = with_coupled_weights(rows, task, 0, 0.01, 16, 5)
    coupled = coupled_runs(rows, task, 0, 0.01, 16, 5)
    assert out[["seed", "step"]].values.tolist() == rows[["seed", "step"]].values.tolist()
    assert out[out["seed"] == 1]["coupled_theta"].isna().all()
    for r in coupled.itertuples():
        mine = out[(out["seed"] == r.seed) & (out["step"] == r.step)]["coupled_theta"].iloc[0]
        np.testing.assert_array_equal(mine, r.theta)
    diff = coupled_differences(out)
    assert set(diff["seed"]) == {0}
    np.testing.assert_array_equal(diff["difference"].iloc[1], rows["theta"].iloc[1] - out["coupled_theta"].iloc[1])


def test_coupled_runs_of_only_diverged_runs_is_empty():
    """Every run diverged: no coupled run, an empty table with the columns."""
    rows = pd.DataFrame([{"model": "softmax", "seed": 0, "stream": 0, "step": 0, "status": "diverged", "theta": None}])
    out = coupled_runs(rows, task_of("gaussian"), 0, 0.01, 8, 5)
    assert out.empty and list(out.columns) == ["model", "seed", "stream", "step", "theta"]
