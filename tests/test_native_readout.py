"""The native softmax readout (largeprompt.kernel.native, docs/performance.md#native-readout) against a float64
reference, its overflow and NaN behaviour, the engine's native plan against autograd, and its absence."""
import math
import warnings

import pytest
import torch

from largeprompt.core.seeding import stream_generator
from largeprompt.icl import models
from largeprompt.icl.engine import stacked, tuning
from largeprompt.kernel import native
from tolerance import gamma

needs_library = pytest.mark.skipif(native.library() is None, reason="no C compiler here: the native readout is not built")


def _feature_major(B, L, D, dtype, gen):
    """A prompt [B, L, D] stored feature by feature (strides (L+1, 1, B(L+1))), as the engine draws it."""
    return torch.randn(D, B, L + 1, generator=gen, dtype=torch.float64).to(dtype).permute(1, 2, 0)[:, :L]


def _reference(prompt, tilt, values):
    """Float64 weights p ∝ 2^{tilt·z}, mean Σ p z, tilted Σ p w z, C = Σ z zᵀ/L, and the |·| sums that bound them."""
    z, t, v = prompt.double(), tilt.double(), values.double()
    scores = torch.einsum("bid,bsd->bsi", z, t)
    p = torch.softmax(scores * math.log(2.0), -1)
    w = torch.einsum("bid,sd->bsi", z, v)
    return {"mean": torch.einsum("bsi,bid->bsd", p, z), "tilted": torch.einsum("bsi,bid->bsd", p * w, z),
            "second": z.mT @ z / z.shape[1], "abs_mean": torch.einsum("bsi,bid->bsd", p, z.abs()),
            "abs_tilted": torch.einsum("bsi,bid->bsd", p * w.abs(), z.abs()), "abs_second": z.abs().mT @ z.abs() / z.shape[1],
            "score_abs": torch.einsum("bid,bsd->bsi", z.abs(), t.abs()).amax(-1) + scores.abs().amax(-1),
            "value_abs": torch.einsum("bid,sd->bsi", z.abs(), v.abs()).amax(-1)}


def _bounds(ref, L, D, dtype):
    """Rounding bounds: a weight 2^(s − M) carries relative error ln2·γ_{D+2}·(Σ|a_j z_j| + |M|) from its score and
    γ_8 from the polynomial and the scaling; a ratio of two sums of L such weights (and a value w, γ_D) adds
    γ_{L+D+8} to twice the weights' error."""
    eta = math.log(2.0) * gamma(D + 2, dtype) * ref["score_abs"] + gamma(8, dtype)  # [B, S]
    rel = 2 * eta + gamma(L + 2 * D + 8, dtype)
    return {"mean": rel.unsqueeze(-1) * ref["abs_mean"], "tilted": rel.unsqueeze(-1) * ref["abs_tilted"],
            "second": gamma(L + 2, dtype) * ref["abs_second"]}


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("L, D, S, scale", [(1, 2, 1, 1.0), (17, 6, 3, 2.0), (300, 6, 2, 4.0), (1000, 8, 1, 1.0),
                                            (257, 3, 0, 1.0), (40, 5, 4, 60.0)])
def test_the_native_readout_equals_the_float64_softmax_moments(dtype, L, D, S, scale):
    """Every tail length and chunk boundary (L = 1, 17, 257, 300, 1000), D = 2…8, no softmax run (C only), and
    scores up to ~±10³ (scale 60), where only the running maximum keeps 2^s finite."""
    gen = stream_generator(0, "test/native", L, D, S)
    B = 5
    prompt = _feature_major(B, L, D, dtype, gen)
    tilt = (scale * torch.randn(B, S, D, generator=gen, dtype=torch.float64)).to(dtype)
    values = torch.randn(S, D, generator=gen, dtype=torch.float64).to(dtype)
    mean, tilted, second = native.stacked_readout(prompt, tilt, values, tilted=True, second=True)
    ref = _reference(prompt, tilt, values)
    bound = _bounds(ref, L, D, dtype)
    for name, got in (("mean", mean), ("tilted", tilted), ("second", second)):
        assert got.dtype == dtype and torch.isfinite(got).all()
        assert ((got.double() - ref[name]).abs() <= bound[name]).all(), (name, (got.double() - ref[name]).abs().max())


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernels_power_of_two_is_accurate_to_a_few_ulp(dtype):
    """Two tokens e₁ = (1, 0) and e₂ = (0, 1) under tilt (d, 0) have exact scores d and 0, so mean₁/mean₂ = 2^d up
    to the exponential's error and three roundings (two divisions by Z, one ratio): d on a fine grid of ±100."""
    d = torch.arange(-6400, 6401, dtype=torch.float64) / 64  # exact in both dtypes
    B = d.numel()
    tokens = torch.zeros(2, B, 3, dtype=dtype)  # [D, B, L+1], feature-major
    tokens[0, :, 0], tokens[1, :, 1] = 1.0, 1.0
    prompt = tokens.permute(1, 2, 0)[:, :2]
    tilt = torch.stack([d, torch.zeros_like(d)], -1).unsqueeze(1).to(dtype)  # [B, 1, 2]
    mean, _, _ = native.stacked_readout(prompt, tilt, torch.ones(1, 2, dtype=dtype), tilted=False, second=False)
    ratio = mean[:, 0, 0].double() / mean[:, 0, 1].double()
    exact = torch.exp2(d)
    assert ((ratio - exact).abs() <= gamma(6, dtype) * exact).all(), (ratio / exact - 1).abs().max()


@needs_library
def test_a_nan_weight_gives_nan_moments_and_skipped_outputs_stay_none():
    """A diverged run must not come out finite: its NaN tilt gives NaN moments (the other run's stay finite)."""
    gen = stream_generator(1, "test/native")
    prompt = _feature_major(3, 50, 4, torch.float32, gen)
    tilt = torch.randn(3, 2, 4, generator=gen)
    tilt[:, 1, 0] = float("nan")
    mean, tilted, second = native.stacked_readout(prompt, tilt, torch.ones(2, 4), tilted=False, second=False)
    assert tilted is None and second is None
    assert torch.isnan(mean[:, 1]).all() and torch.isfinite(mean[:, 0]).all()


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
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    native.library.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert native.library() is None
        assert any("C compiler" in str(w.message) for w in caught)
        assert not any(p.native for p in tuning.candidates(2, 16))
        monkeypatch.setenv(native.ENV_NATIVE, "0")
        native.library.cache_clear()
        assert native.library() is None
    finally:
        native.library.cache_clear()
