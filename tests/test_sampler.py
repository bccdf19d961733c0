"""The token and batch samplers (docs/theory.md#token-sampler): numpy's ziggurat draws N(0, 1) with the right moments
and untruncated tails, counter-based streams reproduce their bits, and the measures and the regression task built on
it have the law they state. Monte Carlo checks hold to 5 standard errors (tests/tolerance.py, MC_Z)."""
import math

import numpy as np
import pytest
import torch

from largeprompt.core.seeding import random_bits, standard_normal, stream_rng, uniform
from largeprompt.icl.engine.runs import batch
from largeprompt.icl.task import regression_task
from largeprompt.maths.attention import prompt_chunks
from largeprompt.maths.concentration import repetition_block_errors, sweep_measure, tilt_scales
from largeprompt.maths.measures import Gaussian, Rademacher, Uniform
from tolerance import MC_Z, eps

N = 2_000_000


def test_ziggurat_moments_and_tails():
    z = standard_normal((N,), stream_rng(7, "test/sampler"), torch.float64).numpy()
    # E z = 0, E z² = 1, E z⁴ = 3 (standard errors 1/√N, √2/√N, √96/√N)
    assert abs(z.mean()) <= MC_Z / math.sqrt(N)
    assert abs((z**2).mean() - 1) <= MC_Z * math.sqrt(2 / N)
    assert abs((z**4).mean() - 3) <= MC_Z * math.sqrt(96 / N)
    # the tail counts beyond 3, 4 and 4.5 against the exact normal tail (binomial standard errors): no truncation
    for t in (3.0, 4.0, 4.5):
        p = math.erfc(t / math.sqrt(2))  # P(|z| > t)
        assert abs((np.abs(z) > t).sum() - N * p) <= MC_Z * math.sqrt(N * p * (1 - p)), t


def test_streams_reproduce_their_bits_and_differ_between_counters():
    a = standard_normal((1000,), stream_rng(3, "test/stream", 1, 2))
    assert torch.equal(a, standard_normal((1000,), stream_rng(3, "test/stream", 1, 2)))
    assert not torch.equal(a, standard_normal((1000,), stream_rng(3, "test/stream", 1, 3)))
    bits, u = random_bits((N // 4,), stream_rng(1, "b")), uniform((N // 4,), stream_rng(1, "u"))
    assert set(bits.unique().tolist()) == {0, 1} and abs(bits.double().mean() - 0.5) <= MC_Z * 0.5 / math.sqrt(N // 4)
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) <= MC_Z * math.sqrt(1 / 12 / (N // 4))


@pytest.mark.parametrize("measure", [
    Gaussian(torch.tensor([0.3, -1.0]), torch.tensor([[2.0, 0.6], [0.6, 1.0]], dtype=torch.float64)),
    Rademacher(2), Uniform(2)])
def test_measures_sampled_from_numpy_have_their_mean_and_covariance(measure):
    x = measure.sample(N // 4, stream_rng(11, "test/measure", len(measure.name))).numpy()  # [n, 2]
    n, mean, cov = len(x), measure.mean.numpy(), measure.covariance.numpy()
    se_mean = np.sqrt(np.diag(cov) / n)
    assert np.all(np.abs(x.mean(0) - mean) <= MC_Z * se_mean)
    centred = x - mean
    emp = centred.T @ centred / n
    fourth = np.einsum("ni,nj,nk,nl->ijkl", centred, centred, centred, centred, optimize=True).reshape(4, 4) / n  # E[(xx)²]
    se_cov = np.sqrt(np.maximum(np.diag(fourth).reshape(2, 2) - cov**2, 1e-12) / n)
    assert np.all(np.abs(emp - cov) <= MC_Z * se_cov + 1e-12)


def test_float64_batches_come_from_the_ziggurat_and_have_the_task_law():
    """R4's float64 batches: x ~ N(0, Λ), y = βᵀx + σε given the prompt's β; reproducible per (stream, step)."""
    task = regression_task({"dim": 3, "covariance_rho": 0.5, "task_variance": 0.5, "noise_variance": 0.2})
    query, prompt, target = batch(task, 5, 0, 17, 2000, 50, torch.float64, "cpu")
    again = batch(task, 5, 0, 17, 2000, 50, torch.float64, "cpu")
    assert torch.equal(prompt, again[1]) and torch.equal(target, again[2])
    x = prompt[..., :3].reshape(-1, 3).numpy()
    lam = task.covariance.numpy()
    se = np.sqrt((lam**2 + np.outer(np.diag(lam), np.diag(lam))) / len(x))  # Var(xᵢxⱼ) = ΛᵢᵢΛⱼⱼ + Λᵢⱼ²
    assert np.all(np.abs(x.T @ x / len(x) - lam) <= MC_Z * se)
    assert torch.equal(query[:, 3], torch.zeros(2000, dtype=torch.float64))  # z_q = (x_q, 0)



def _rounding_scale(L: int, *values) -> float:
    """A squared difference of moments that each pass through O(L) roundings: 50·L·eps·(1 + Σ|moment|)²."""
    return 50 * L * eps(torch.float64) * max(float(((1 + np.abs(v)) ** 2).max()) for v in values)


@pytest.mark.parametrize("name", ["gaussian", "rademacher"])
def test_one_pass_over_c_equals_one_pass_per_c(name):
    """Common random numbers (docs/theory.md#token-sampler): one pass over a prompt of standardised tokens g at the C
    tilts σ_c u_c z_q gives, at every c, the squared output error of the prompt z = σ_c g under U = u_c I, V = I,
    computed here directly from the tokens with plain softmax weights in float64, and the same errors (output, ∇U,
    ∇V) as a pass at that c alone."""
    dim, reps, lengths, chunk, c_values = 2, 6, [8, 32, 96], 40, [0.25, 1.0, 2.0]
    query = standard_normal((reps, dim), stream_rng(3, "test/crn/queries"), torch.float64)
    joint = repetition_block_errors(name, dim, c_values, query, lengths, stream_rng(3, "test/crn/prompts"), chunk)
    base = sweep_measure(name, dim, 1.0, torch.float64, "cpu")
    g = torch.cat(list(prompt_chunks(base, lengths[-1], stream_rng(3, "test/crn/prompts"), chunk, (reps,))), dim=-2)
    for k, c in enumerate(c_values):
        sigma_sq, u = tilt_scales(name, c)
        z = math.sqrt(sigma_sq) * g  # [R, L, D]
        t_inf = sweep_measure(name, dim, sigma_sq, torch.float64, "cpu").cgf_grad(u * query)  # [R, D]
        for j, L in enumerate(lengths):
            w = torch.softmax(torch.einsum("rd,rld->rl", u * query, z[:, :L]), dim=-1)  # [R, L]
            t_l = torch.einsum("rl,rld->rd", w, z[:, :L])
            direct = ((t_l - t_inf) ** 2).sum(-1).numpy()
            tol = _rounding_scale(L, t_l.abs().sum(-1).numpy(), t_inf.abs().sum(-1).numpy())
            np.testing.assert_allclose(joint[0][k, :, j], direct, rtol=0, atol=tol)
        alone = repetition_block_errors(name, dim, [c], query, lengths, stream_rng(3, "test/crn/prompts"), chunk)
        for joint_part, alone_part in zip(joint[:3], alone[:3]):
            tol = _rounding_scale(lengths[-1], np.sqrt(joint_part[k]))
            np.testing.assert_allclose(joint_part[k], alone_part[0], rtol=0, atol=tol)
        np.testing.assert_allclose(joint[3][k], alone[3][0], rtol=4 * eps(torch.float64), atol=0)  # κ = K(2a) − 2K(a)
