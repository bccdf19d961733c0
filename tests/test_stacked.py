"""The stacked-runs engine against autograd through the naive Q/K/V/O model (docs/experiments.md#training-protocol)."""
import pytest
import torch

from largeprompt.core.seeding import stream_generator
from largeprompt.icl import models
from largeprompt.icl.engine import native_step as native
from largeprompt.icl.engine import stacked
from largeprompt.icl.task import RegressionTask
from largeprompt.maths.measures import toeplitz_covariance
from tolerance import sum_tolerance


def _runs(n, dim, gen):
    return [models.init_parameters(dim, gen) for _ in range(n)]


def _batch(L, B=16):
    task = RegressionTask(toeplitz_covariance(3, 0.5), 0.5, 0.2)
    return task.sample(B, L, stream_generator(3, "test/multirun"))


@pytest.mark.parametrize("L, softmax, block", [
    (1, [True, False, True, False], None), (7, [True, False, True, False], None), (40, [True, False, True, False], None),
    (7, [False, False, False], None),  # linear runs only: read C = Σ zzᵀ/L, no rows
    (7, [True, True], None),  # softmax runs only
    (40, [False, True, True, False], 2 * 2 * 40 * 3),  # linear first (reordered), in blocks of 3 prompts
])
def test_stacked_loss_and_gradients_equal_autograd_of_the_naive_model(L, softmax, block, monkeypatch):
    if block:
        monkeypatch.setattr(stacked, "BLOCK_ELEMENTS", block)
        assert len(stacked._blocks(16, stacked._block_size(None, 2, L, 4))) == 6
    query, prompt, target = _batch(L)
    runs = _runs(len(softmax), 4, stream_generator(4, "test/multirun/init"))
    stack = stacked.RunStack.from_parameters(runs, softmax)
    loss, grads = stacked.loss_and_gradients(stack, query, prompt, target)
    for r, (params, soft) in enumerate(zip(runs, softmax)):
        leaves = {n: p.clone().requires_grad_(True) for n, p in params.items()}
        want = models.mse(models.predict_naive(leaves, query, prompt, "softmax" if soft else "linear"), target)
        auto = torch.autograd.grad(want, list(leaves.values()))
        # every entry is a sum over B·L products of O(1) factors, accumulated in float64
        tol = sum_tolerance(16 * L * 4, 1.0, torch.float64) * max(1.0, float(want.detach()))
        assert abs(float(loss[r]) - float(want.detach())) <= tol
        for name, g in zip(leaves, auto):
            assert torch.allclose(grads[name][r], g, rtol=0, atol=tol), (name, soft)


def test_a_zero_step_freezes_a_run_and_the_others_move():
    query, prompt, target = _batch(10)
    runs = _runs(2, 4, stream_generator(5, "test/multirun/init"))
    stack = stacked.RunStack.from_parameters(runs, [True, True])
    before = stack.Q.clone()
    _, grads = stacked.loss_and_gradients(stack, query, prompt, target)
    stacked.sgd_step(stack, grads, torch.tensor([0.0, 0.1], dtype=torch.float64))
    assert torch.equal(stack.Q[0], before[0]) and not torch.equal(stack.Q[1], before[1])


@pytest.mark.parametrize("softmax, block", [([True, False, True], None), ([False, False], None), ([True], None),
                                            ([False, True, False, True], 2 * 2 * 12 * 5)])
def test_stacked_prediction_equals_single_run_prediction(softmax, block, monkeypatch):
    if block:  # blocks of 5 prompts: 5, 5, 5, 1
        monkeypatch.setattr(stacked, "BLOCK_ELEMENTS", block)
    query, prompt, _ = _batch(12)
    runs = _runs(len(softmax), 4, stream_generator(6, "test/multirun/init"))
    stack = stacked.RunStack.from_parameters(runs, softmax)
    got = stacked.predict(stack, query, prompt)  # [R, B]
    for r, model in enumerate("softmax" if soft else "linear" for soft in softmax):
        want = models.predict(runs[r], query, prompt, model)
        assert torch.allclose(got[r], want, rtol=0, atol=sum_tolerance(12 * 4, 1.0, torch.float64))


@pytest.mark.parametrize("plan", [stacked.Plan(3, True), stacked.Plan(5, False), stacked.Plan(16, True)])
def test_every_plan_gives_the_autograd_gradients(plan):
    """A plan (prompts per block, exp or exp2) changes how a step runs, not what it computes."""
    L = 9
    query, prompt, target = _batch(L)
    softmax = [True, False, True]
    runs = _runs(3, 4, stream_generator(7, "test/multirun/init"))
    stack = stacked.RunStack.from_parameters(runs, softmax)
    loss, grads = stacked.loss_and_gradients(stack, query, prompt, target, plan)
    got = stacked.predict(stack, query, prompt, plan)
    for r, (params, soft) in enumerate(zip(runs, softmax)):
        model = "softmax" if soft else "linear"
        leaves = {n: p.clone().requires_grad_(True) for n, p in params.items()}
        want = models.mse(models.predict_naive(leaves, query, prompt, model), target)
        auto = torch.autograd.grad(want, list(leaves.values()))
        tol = sum_tolerance(16 * L * 4, 1.0, torch.float64) * max(1.0, float(want.detach()))
        assert abs(float(loss[r]) - float(want.detach())) <= tol
        for name, g in zip(leaves, auto):
            assert torch.allclose(grads[name][r], g, rtol=0, atol=tol), (name, soft)
        assert torch.allclose(got[r], models.predict(params, query, prompt, model), rtol=0, atol=tol)


def test_a_plan_reads_back_from_its_text_and_bad_text_says_the_format():
    for plan in (stacked.Plan(32, True), stacked.Plan(1, False)):
        assert stacked.Plan.parse(str(plan)) == plan
    for bad in ("block=0,exp=2", "block=x", "exp=2", "block=4,exp=3", "block=4,tile=2"):
        with pytest.raises(ValueError, match="block=<positive integer>,exp=e|2"):
            stacked.Plan.parse(bad)


def test_a_whitened_draw_is_the_same_draw_and_the_frame_moves_into_the_weights():
    """sample_whitened consumes the same numbers as sample: T z' is the prompt, query and target agree; a step on
    (z', T) gives the loss and gradients of the step on z, with both readouts (docs/experiments.md#whitened-draw)."""
    task = RegressionTask(toeplitz_covariance(3, 0.5), 0.5, 0.2)
    L, B = 30, 16
    query, prompt, target = task.sample(B, L, stream_generator(8, "test/whitened"))
    q_w, p_w, t_w, frame = task.sample_whitened(B, L, stream_generator(8, "test/whitened"))
    tol = sum_tolerance(4, 10.0, torch.float64)  # |C||g| ≤ 10 for these draws, 4 terms per entry
    assert torch.allclose(p_w @ frame.T, prompt, rtol=0, atol=tol) and torch.allclose(q_w, query, rtol=0, atol=tol)
    assert torch.allclose(t_w, target, rtol=0, atol=tol)
    runs = _runs(4, 4, stream_generator(9, "test/multirun/init"))
    stack = stacked.RunStack.from_parameters(runs, [True, False, True, False])
    plans = [None] + ([stacked.Plan(B, True, native=True)] if native.library() is not None else [])
    for plan in plans:
        loss, grads = stacked.loss_and_gradients(stack, query, prompt, target, plan)
        loss_w, grads_w = stacked.loss_and_gradients(stack, q_w, p_w, t_w, plan, frame)
        bound = sum_tolerance(B * L * 4 * 4, 1.0, torch.float64) * max(1.0, float(loss.max()))
        assert torch.allclose(loss_w, loss, rtol=0, atol=bound), plan
        for name in grads:
            assert torch.allclose(grads_w[name], grads[name], rtol=0, atol=bound), (plan, name)


def test_bounded_measures_draw_no_frame():
    task = RegressionTask(torch.eye(3, dtype=torch.float64), 0.5, 0.2, "rademacher")
    *_, frame = task.sample_whitened(4, 5, stream_generator(10, "test/whitened"))
    assert frame is None


def test_sgd_update_is_one_plain_step_and_a_zero_rate_freezes_even_a_non_finite_gradient():
    """models.sgd_update: θ − lr·g in place, per run with lr [R, 1, 1]; a run at lr 0 keeps its weights exactly even
    where its gradient is inf or NaN (0·inf would be NaN)."""
    from largeprompt.icl import models

    w = torch.arange(12, dtype=torch.float64).view(3, 2, 2)
    g = torch.full_like(w, 0.5)
    g[1] = float("inf")
    g[2, 0, 0] = float("nan")
    lr = torch.tensor([0.1, 0.0, 0.0], dtype=torch.float64).view(-1, 1, 1)
    before = w.clone()
    models.sgd_update([w], [g], lr)
    assert torch.equal(w[0], before[0] - 0.1 * g[0]) and torch.equal(w[1:], before[1:])
    v = torch.ones(4, dtype=torch.float64)
    models.sgd_update([v], [torch.full_like(v, 2.0)], 0.25)
    assert torch.equal(v, torch.full_like(v, 0.5))
