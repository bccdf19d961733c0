"""The native softmax readout (largeprompt.icl.engine.native_step, docs/performance.md#native-readout) against a float64
reference, its overflow and NaN behaviour, the engine's native plan against autograd, and its absence."""
import math

import pytest
import torch

from helpers import without_compiler
from largeprompt.core.seeding import stream_generator
from largeprompt.icl import models
from largeprompt.icl.engine import native_step as native
from largeprompt.icl.engine import stacked, tuning
from largeprompt.icl.task import RegressionTask
from largeprompt.maths.measures import toeplitz_covariance
from tolerance import gamma

needs_library = pytest.mark.skipif(native.library() is None, reason="no C compiler here: the native readout is not built")


def _feature_major(B, L, D, dtype, gen):
    """A prompt [B, L, D] stored feature by feature (strides (L+1, 1, B(L+1))), as the engine draws it."""
    return torch.randn(D, B, L + 1, generator=gen, dtype=torch.float64).to(dtype).permute(1, 2, 0)[:, :L]


def _reference(prompt, tilts, values, softmax):
    """Float64 ŷ, ∇a- and ∇u-moments of every run (softmax: p ∝ e^{a·z}, m = Σ p z, n − ŷm; linear: C = Σ zzᵀ/L, Cu,
    Ca), and rounding bounds for each: a weight e^(s − M) carries relative error γ_{D+2}·(Σ|a_j z_j| + |M|) from its
    score and γ_8 from the polynomial and its scaling; a ratio of two sums of L weights adds γ_{L+2D+8} to twice
    that; products with u and ŷ add their own |·| terms (tolerance.py)."""
    z, a, v = prompt.double(), tilts.double(), values.double()
    B, L, D = z.shape
    dtype, soft = prompt.dtype, softmax.view(1, -1)
    scores = torch.einsum("bid,brd->bri", z, a)
    p = torch.softmax(scores, -1)
    w = torch.einsum("bid,rd->bri", z, v)
    m, n = torch.einsum("bri,bid->brd", p, z), torch.einsum("bri,bid->brd", p * w, z)
    m_abs, n_abs = torch.einsum("bri,bid->brd", p, z.abs()), torch.einsum("bri,bid->brd", p * w.abs(), z.abs())
    eta = gamma(D + 2, dtype) * (torch.einsum("bid,brd->bri", z.abs(), a.abs()).amax(-1) + scores.abs().amax(-1))
    rel = (2 * (eta + gamma(8, dtype)) + gamma(L + 2 * D + 8, dtype)).unsqueeze(-1)  # [B, R, 1]
    y_soft = (m * v).sum(-1)
    y_soft_bound = (rel * m_abs * v.abs()).sum(-1) + gamma(D, dtype) * (m.abs() * v.abs()).sum(-1)
    fa_soft = n - y_soft.unsqueeze(-1) * m
    fa_soft_bound = rel * n_abs + y_soft.abs().unsqueeze(-1) * rel * m_abs + y_soft_bound.unsqueeze(-1) * m_abs \
        + gamma(3, dtype) * (n.abs() + (y_soft.unsqueeze(-1) * m).abs())
    C, C_abs = z.mT @ z / L, z.abs().mT @ z.abs() / L  # [B, D, D]
    Cu, Ca = torch.einsum("bjk,rk->brj", C, v), torch.einsum("bjk,brk->brj", C, a)
    Cu_bound = gamma(L + D + 2, dtype) * torch.einsum("bjk,rk->brj", C_abs, v.abs())
    Ca_bound = gamma(L + D + 2, dtype) * torch.einsum("bjk,brk->brj", C_abs, a.abs())
    y_lin, y_lin_bound = (a * Cu).sum(-1), (a.abs() * (Cu.abs() + Cu_bound)).sum(-1) * (1 + gamma(D, dtype)) - (a * Cu).abs().sum(-1)
    pick = lambda s_, l_: torch.where(soft.unsqueeze(-1) if s_.dim() == 3 else soft, s_, l_)  # noqa: E731
    return {"prediction": (pick(y_soft, y_lin), pick(y_soft_bound, y_lin_bound)),
            "for_a": (pick(fa_soft, Cu), pick(fa_soft_bound, Cu_bound)),
            "for_u": (pick(m, Ca), pick(rel * m_abs, Ca_bound))}


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("L, D, softmax, scale", [
    (1, 2, [True], 1.0), (17, 6, [True, False, True], 2.0), (300, 6, [False, True], 4.0), (1000, 8, [True], 1.0),
    (257, 3, [False, False], 1.0), (40, 5, [True, True, False, True], 60.0)])
def test_the_native_readout_equals_the_float64_reference(dtype, L, D, softmax, scale):
    """Every tail length and chunk boundary (L = 1, 17, 257, 300, 1000), D = 2…8, linear runs only, and scores up
    to ~±10³ (scale 60), where only the running maximum keeps e^s finite."""
    gen = stream_generator(0, "test/native", L, D, len(softmax))
    B, R = 5, len(softmax)
    prompt = _feature_major(B, L, D, dtype, gen)
    tilts = (scale * torch.randn(B, R, D, generator=gen, dtype=torch.float64)).to(dtype)
    values = torch.randn(R, D, generator=gen, dtype=torch.float64).to(dtype)
    flags = torch.tensor(softmax)
    got = dict(zip(("prediction", "for_a", "for_u"), native.readout(prompt, tilts, values, flags)))
    for name, (want, bound) in _reference(prompt, tilts, values, flags).items():
        assert got[name].dtype == dtype and torch.isfinite(got[name]).all()
        error = (got[name].double() - want).abs()
        assert (error <= bound).all(), (name, error.max(), (error / bound).max())
    only = native.readout(prompt, tilts, values, flags, gradients=False)
    assert only[1] is None and torch.equal(only[0], got["prediction"])


@needs_library
def test_a_frame_gives_the_readout_of_the_true_tokens():
    """Tokens z = T z': the readout of (z', T) is that of z, up to the roundings of T's products (float64)."""
    gen = stream_generator(5, "test/native")
    B, L, D = 6, 50, 4
    whitened = _feature_major(B, L, D, torch.float64, gen)
    frame = torch.eye(D, dtype=torch.float64) + 0.3 * torch.randn(D, D, generator=gen, dtype=torch.float64)
    true = (whitened @ frame.T).permute(2, 0, 1).contiguous().permute(1, 2, 0)  # z = T z', feature-major again
    tilts, values = torch.randn(B, 3, D, generator=gen, dtype=torch.float64), torch.randn(3, D, generator=gen, dtype=torch.float64)
    flags = torch.tensor([True, False, True])
    for framed, plain in zip(native.readout(whitened, tilts, values, flags, frame), native.readout(true, tilts, values, flags)):
        assert torch.allclose(framed, plain, rtol=0, atol=gamma(4 * L * D, torch.float64) * 100 * (1 + plain.abs().max()))


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernels_power_of_two_is_accurate_to_a_few_ulp(dtype):
    """Two tokens e₁ = (1, 0) and e₂ = (0, 1) under tilt (d ln 2, 0) have base-2 scores d and 0 (up to the rounding
    of ln 2 · log₂e, below 2 ulp of d), so mean₁/mean₂ = 2^d up to the exponential's error, that rounding (at most
    2·100·eps·ln 2 relative) and three roundings: d on a fine grid of ±100."""
    d = torch.arange(-6400, 6401, dtype=torch.float64) / 64  # exact in both dtypes
    B = d.numel()
    tokens = torch.zeros(2, B, 3, dtype=dtype)  # [D, B, L+1], feature-major
    tokens[0, :, 0], tokens[1, :, 1] = 1.0, 1.0
    prompt = tokens.permute(1, 2, 0)[:, :2]
    tilt = (math.log(2.0) * torch.stack([d, torch.zeros_like(d)], -1)).unsqueeze(1).to(dtype)  # [B, 1, 2]: e^{a·z} = 2^d
    _, _, mean = native.readout(prompt, tilt, torch.ones(1, 2, dtype=dtype), torch.tensor([True]))
    ratio = mean[:, 0, 0].double() / mean[:, 0, 1].double()
    exact = torch.exp2(d)
    bound = (gamma(6, dtype) + 2 * math.log(2.0) * gamma(2, dtype) * d.abs()) * exact
    assert ((ratio - exact).abs() <= bound).all(), (ratio / exact - 1).abs().max()


@needs_library
def test_a_nan_weight_gives_nan_moments():
    """A diverged run must not come out finite: its NaN tilt gives NaN moments (the other run's stay finite)."""
    gen = stream_generator(1, "test/native")
    prompt = _feature_major(3, 50, 4, torch.float32, gen)
    tilt = torch.randn(3, 2, 4, generator=gen)
    tilt[:, 1, 0] = float("nan")
    prediction, for_a, for_u = native.readout(prompt, tilt, torch.ones(2, 4), torch.tensor([True, True]))
    assert torch.isnan(prediction[:, 1]).all() and torch.isnan(for_a[:, 1]).all() and torch.isnan(for_u[:, 1]).all()
    assert torch.isfinite(prediction[:, 0]).all() and torch.isfinite(for_a[:, 0]).all()


def test_a_token_major_prompt_or_an_unsupported_dimension_is_not_taken():
    gen = stream_generator(2, "test/native")
    assert native.supports(_feature_major(2, 10, 6, torch.float32, gen))
    assert not native.supports(torch.randn(2, 10, 6, generator=gen))  # tokens contiguous, features not
    assert not native.supports(_feature_major(2, 10, 9, torch.float32, gen))  # D above MAX_DIM
    assert not native.supports(_feature_major(2, 10, 6, torch.float16, gen))


@needs_library
@pytest.mark.parametrize("softmax", [[True, False, True], [False, False], [True]])
def test_the_native_plan_gives_the_autograd_gradients_in_float64(softmax):
    L, B = 23, 8
    gen = stream_generator(3, "test/native/plan")
    query = torch.randn(B, 4, generator=gen, dtype=torch.float64)
    prompt = _feature_major(B, L, 4, torch.float64, gen)
    target = torch.randn(B, generator=gen, dtype=torch.float64)
    runs = [models.init_parameters(4, gen) for _ in softmax]
    stack = stacked.RunStack.from_parameters(runs, softmax)
    plan = stacked.Plan(B, True, native=True)
    loss, grads = stacked.loss_and_gradients(stack, query, prompt, target, plan)
    got = stacked.predict(stack, query, prompt, plan)
    for r, soft in enumerate(softmax):
        model = "softmax" if soft else "linear"
        leaves = {n: p.clone().requires_grad_(True) for n, p in runs[r].items()}
        want = models.mse(models.predict_naive(leaves, query, prompt, model), target)
        auto = torch.autograd.grad(want, list(leaves.values()))
        tol = gamma(4 * B * L * 4, torch.float64) * max(1.0, float(want.detach())) * 10
        assert abs(float(loss[r]) - float(want.detach())) <= tol
        for name, g in zip(leaves, auto):
            assert torch.allclose(grads[name][r], g, rtol=0, atol=tol), (name, model)
        assert torch.allclose(got[r], models.predict(runs[r], query, prompt, model), rtol=0, atol=tol)


@needs_library
def test_the_native_step_is_bit_identical_on_rerun_and_close_to_the_torch_step_in_float32():
    L, B = 200, 16
    gen = stream_generator(4, "test/native/step")
    query = torch.randn(B, 6, generator=gen)
    prompt = _feature_major(B, L, 6, torch.float32, gen)
    target = torch.randn(B, generator=gen)
    stack = stacked.RunStack.from_parameters([models.init_parameters(6, gen, dtype=torch.float32) for _ in range(4)],
                                             [True, False, True, False])
    one = stacked.loss_and_gradients(stack, query, prompt, target, stacked.Plan(B, True, native=True))
    two = stacked.loss_and_gradients(stack, query, prompt, target, stacked.Plan(B, True, native=True))
    torch_path = stacked.loss_and_gradients(stack, query, prompt, target, stacked.Plan(B, True))
    assert torch.equal(one[0], two[0]) and all(torch.equal(one[1][n], two[1][n]) for n in one[1])
    # both paths differ from the exact values by their rounding, each bounded as a sum of B·L·D terms
    assert torch.allclose(one[0], torch_path[0], rtol=2 * gamma(B * L * 6, torch.float32), atol=0)


def test_without_a_compiler_the_engine_falls_back_to_torch_and_says_what_to_install(monkeypatch, tmp_path):
    with without_compiler(monkeypatch, tmp_path, native.library) as (loaded, caught):
        assert loaded is None
        assert any("C compiler" in str(w.message) for w in caught)
        assert not any(p.native for p in tuning.candidates(2, 16))
        monkeypatch.setenv(native.ENV_NATIVE, "0")
        native.library.cache_clear()
        assert native.library() is None


@needs_library
def test_the_native_step_is_the_sgd_step_of_the_analytic_gradients_and_freezes_a_diverged_run():
    """native_step = θ − lr ∇θ with loss_and_gradients' gradients (float64, a whitened frame); a run whose batch loss
    exceeds the threshold keeps its weights and is flagged, a zero step size freezes a run."""
    L, B = 31, 12
    task = RegressionTask(toeplitz_covariance(3, 0.5), 0.5, 0.2)
    query, prompt, target, frame = task.sample_whitened(B, L, stream_generator(6, "test/native/sgd"))
    runs = [models.init_parameters(4, stream_generator(7, "test/native/sgd", r)) for r in range(4)]
    runs[2] = {n: 30.0 * p for n, p in runs[2].items()}  # a run whose loss blows past the threshold
    stack = stacked.RunStack.from_parameters(runs, [True, False, True, False])
    plan = stacked.Plan(B, True, native=True)
    want_loss, grads = stacked.loss_and_gradients(stack, query, prompt, target, plan, frame)
    threshold = float(want_loss[[0, 1, 3]].max()) * 2
    assert float(want_loss[2]) > threshold
    lr = torch.tensor([0.1, 0.2, 0.1, 0.0], dtype=torch.float64)
    before = {n: getattr(stack, n).clone() for n in models.PARAMETER_NAMES}
    loss, diverged = stacked.native_step(stack, query, prompt, target, lr, threshold, frame, plan)
    assert diverged.tolist() == [False, False, True, False]
    tol = gamma(4 * B * L * 4, torch.float64) * 10 * (1 + float(want_loss.abs().max()))
    assert torch.allclose(loss, want_loss, rtol=0, atol=tol)
    for name in models.PARAMETER_NAMES:
        got, old = getattr(stack, name), before[name]
        for r in (2, 3):
            assert torch.equal(got[r], old[r]), (name, r)  # diverged, and a zero step: untouched
        for r in (0, 1):
            want = old[r] - lr[r] * grads[name][r]
            assert torch.allclose(got[r], want, rtol=0, atol=tol * float(lr[r]) * (1 + float(grads[name][r].abs().max()))), (name, r)
