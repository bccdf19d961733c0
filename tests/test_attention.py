"""Finite, streaming and infinite-prompt attention (docs/theory.md#notation, #infinite-prompt-operator).

Float comparisons use the rounding bound of ``tolerance.attention_tolerance`` (twice: both sides round);
Monte Carlo comparisons use standard errors.
"""
import math

import pytest
import torch

from largeprompt.maths.attention import (
    finite_prompt_attention,
    infinite_prompt_attention,
    prompt_chunks,
    streaming_prompt_attention,
    streaming_tilted_moments,
    tilted_moments,
)
from largeprompt.maths.fluctuations import gaussian_asymptotic_covariance, leading_bias
from largeprompt.maths.measures import Gaussian, Rademacher, Uniform, toeplitz_covariance
from tolerance import assert_within, attention_tolerance, matmul_tolerance, mc_tolerance, tilted_moments_tolerance

F64 = torch.float64


def naive_attention(query, tokens, U, V):
    """Textbook float64 softmax attention: V Σ softmax(⟨U z_q, z_i⟩) z_i, everything materialised."""
    scores = torch.einsum("...d,...ld->...l", query @ U.T, tokens)
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("...l,...ld->...d", weights, tokens) @ V.T


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1000])
def test_finite_attention_equals_naive_softmax(chunk_size, dtype):
    """Against float64 naive softmax on the same (rounded) inputs: both errors bounded by attention_tolerance."""
    g = _gen(0)
    U, V = torch.randn(4, 4, generator=g, dtype=F64), torch.randn(2, 4, generator=g, dtype=F64)
    query = torch.randn(3, 5, 4, generator=g, dtype=F64)
    tokens = torch.randn(3, 5, 200, 4, generator=g, dtype=F64)  # every query its own prompt
    U, V, query, tokens = (x.to(dtype).to(F64) for x in (U, V, query, tokens))  # representable in dtype
    got = finite_prompt_attention(*(x.to(dtype) for x in (query, tokens, U, V)), chunk_size=chunk_size)
    assert got.shape == (3, 5, 2) and got.dtype == dtype
    tol = attention_tolerance(query, tokens, U, V, dtype) + attention_tolerance(query, tokens, U, V)
    assert_within(got, naive_attention(query, tokens, U, V), tol, "chunked")


def test_shared_and_grouped_prompts_equal_naive_softmax():
    g = _gen(1)
    U, V = torch.randn(3, 3, generator=g, dtype=F64), torch.randn(1, 3, generator=g, dtype=F64)
    query = torch.randn(6, 3, generator=g, dtype=F64)
    shared = torch.randn(150, 3, generator=g, dtype=F64)  # one prompt for all queries
    got = finite_prompt_attention(query, shared, U, V, chunk_size=32)
    tokens = shared.expand(6, 150, 3)
    assert_within(got, naive_attention(query, tokens, U, V), 2 * attention_tolerance(query, tokens, U, V), "shared")
    grouped_q = torch.randn(4, 6, 3, generator=g, dtype=F64)  # 4 prompts, 6 queries sharing each
    grouped_p = torch.randn(4, 150, 3, generator=g, dtype=F64)
    got = finite_prompt_attention(grouped_q, grouped_p, U, V, chunk_size=32)
    tokens = grouped_p[:, None].expand(4, 6, 150, 3)
    want = naive_attention(grouped_q, tokens, U, V)
    assert_within(got, want, 2 * attention_tolerance(grouped_q, tokens, U, V), "grouped")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_no_overflow_for_scores_of_ten_thousand(dtype):
    """Against float64 naive softmax on the same inputs, within the ``dtype`` rounding bound (whose score term
    carries the condition number of exp at scores of 10⁴)."""
    g = _gen(2)
    tokens = torch.randn(50, 3, generator=g, dtype=dtype)
    tokens = tokens / tokens.norm(dim=-1, keepdim=True)
    U = torch.eye(3, dtype=dtype)
    V = torch.eye(3, dtype=dtype)

    def reference(query, tokens):  # float64 on the same (rounded) inputs; its own error is float64 rounding
        q64, t64, e64 = query.to(F64), tokens.to(F64), U.to(F64)
        tol = attention_tolerance(query, tokens, U, V, dtype) + attention_tolerance(q64, t64, e64, e64)
        return naive_attention(q64, t64, e64, e64), tol

    for sign in (1.0, -1.0):
        query = sign * 1e4 * tokens[17]  # scores up to ±10⁴
        got = finite_prompt_attention(query, tokens, U, V, chunk_size=8)
        assert torch.isfinite(got).all()
        want, tol = reference(query, tokens)
        assert_within(got, want, tol, f"scores ±1e4, sign {sign:+}")
        if sign > 0:  # the softmax is a hard max on token 17, up to Σ_{i≠17} wᵢ|zᵢ − z₁₇| (exact, float64)
            weights = torch.softmax(tokens.to(F64) @ query.to(F64), 0)
            spill = (weights[:, None] * (tokens.to(F64) - tokens[17].to(F64)).abs()).sum(0)
            assert_within(got, tokens[17], spill + tol, "hard max")
    # all scores ≈ −10⁴: the normaliser underflows without log-sum-exp
    query = -1e4 * torch.ones(3, dtype=dtype)
    tokens = torch.ones(20, 3, dtype=dtype) + 0.01 * torch.randn(20, 3, generator=g, dtype=dtype)
    got = finite_prompt_attention(query, tokens, U, V, chunk_size=3)
    assert torch.isfinite(got).all()
    want, tol = reference(query, tokens)
    assert_within(got, want, tol, "scores ≈ −3e4")


def test_moments_match_weighted_mean_and_covariance():
    g = _gen(3)
    tilt = torch.randn(4, 3, generator=g, dtype=F64)
    tokens = torch.randn(4, 90, 3, generator=g, dtype=F64)
    mean, cov = tilted_moments(tilt, tokens, chunk_size=13, second_moment=True)
    p = torch.softmax(torch.einsum("bd,bld->bl", tilt, tokens), -1)
    want_mean = torch.einsum("bl,bld->bd", p, tokens)
    centred = tokens - want_mean[:, None]
    want_cov = torch.einsum("bl,bli,blj->bij", p, centred, centred)
    mean_tol, cov_tol = tilted_moments_tolerance(tilt, tokens)
    assert_within(mean, want_mean, 2 * mean_tol, "tilted mean")
    assert_within(cov, want_cov, 2 * cov_tol, "tilted covariance")


@pytest.mark.parametrize("batch", [None, (5,)])
def test_streaming_nested_prefixes_equal_non_streaming_on_same_tokens(batch):
    measure = Gaussian(torch.zeros(3), toeplitz_covariance(3, 0.5))
    g = _gen(4)
    U, V = torch.randn(3, 3, generator=g, dtype=F64), torch.randn(2, 3, generator=g, dtype=F64)
    query = torch.randn(5, 3, generator=g, dtype=F64) if batch is None else torch.randn(5, 2, 3, generator=g, dtype=F64)
    prefixes = [1, 10, 100, 999, 1000, 5000]
    kwargs = {} if batch is None else {"prompt_batch_shape": batch}
    got = streaming_prompt_attention(query, measure, 5000, U, V, _gen(99), 333, prefix_lengths=prefixes, **kwargs)
    tokens = torch.cat(list(prompt_chunks(measure, 5000, _gen(99), 333, batch or ())), dim=-2)
    for k, L in enumerate(prefixes):
        prompt = tokens[..., :L, :]
        prompt = prompt.expand(5, L, 3) if batch is None else prompt[:, None].expand(5, 2, L, 3)
        tol = 2 * attention_tolerance(query, prompt, U, V)
        assert_within(got[k], naive_attention(query, prompt, U, V), tol, f"prefix {L}")
    # without prefixes: the output at the full length, equal to the last prefix up to rounding
    full = streaming_prompt_attention(query, measure, 5000, U, V, _gen(99), 333, **kwargs)
    assert_within(full, got[-1], tol, "full length")


def test_streaming_prefix_lengths_are_validated():
    m = Rademacher(2)
    with pytest.raises(ValueError, match="prefix_lengths"):
        streaming_tilted_moments(torch.zeros(2, dtype=F64), m, 10, _gen(0), prefix_lengths=[0, 5])
    with pytest.raises(ValueError, match="prefix_lengths"):
        streaming_tilted_moments(torch.zeros(2, dtype=F64), m, 10, _gen(0), prefix_lengths=[11])


@pytest.mark.parametrize(
    "measure",
    [Gaussian([0.3, 0.0, -0.1], toeplitz_covariance(3, 0.5)), Rademacher(3), Uniform(3)],
    ids=["gaussian", "rademacher", "uniform"],
)
def test_infinite_prompt_attention_is_the_large_prompt_limit(measure):
    """Mean over 40 independent prompts at L = 20 000 agrees with V∇K(Uz_q) within 5 standard errors."""
    g = _gen(5)
    U = 0.5 * torch.randn(3, 3, generator=g, dtype=F64)
    V = torch.randn(2, 3, generator=g, dtype=F64)
    query = torch.randn(4, 3, generator=g, dtype=F64)
    out = streaming_prompt_attention(
        query.expand(40, 4, 3), measure, 20_000, U, V, _gen(6), 4096, prompt_batch_shape=(40,)
    )  # [40 prompts, 4 queries, 2]
    mean, se = out.mean(0), out.std(0) / math.sqrt(out.shape[0])
    limit = infinite_prompt_attention(query, measure, U, V)
    bias = leading_bias(query @ U.T, measure, V, 20_000)  # O(1/L), and its O(1/L²) remainder far smaller
    assert torch.all(bias.abs() < 0.1 * se)  # the bias is negligible here: the comparison is pure Monte Carlo
    assert_within(mean, limit, mc_tolerance(se) + bias.abs(), "mean over prompts vs T∞")
    if isinstance(measure, Gaussian):  # V(m + S a): two matrix products of inner size D, on both sides
        a_abs = query.abs() @ U.abs().T
        scale = (measure.loc.abs() + a_abs @ measure.cov.abs()) @ V.abs().T
        affine = (measure.loc + (query @ U.T) @ measure.cov) @ V.T
        assert_within(limit, affine, 2 * matmul_tolerance(2 * 3 + 1, scale), "affine limit")


def test_streaming_at_a_million_tokens_is_near_the_limit():
    """L = 10⁶ streamed (never materialised) in D = 6: right shape, finite, and within the central-limit
    spread √(C/L) of T∞ at both prefixes (C the asymptotic covariance, docs/theory.md#fixed-query-fluctuations).

    The memory ceiling of streaming at L = 10⁷ is a benchmark target (``largeprompt bench``), not a unit test.
    """
    L, dim = 1_000_000, 6
    cov = torch.eye(dim, dtype=F64)
    measure = Gaussian(torch.zeros(dim), cov)
    query = torch.randn(4, dim, generator=_gen(7), dtype=F64)
    U, V = 0.3 * torch.eye(dim, dtype=F64), torch.eye(dim, dtype=F64)
    prefixes = [L // 10, L]
    out = streaming_prompt_attention(query, measure, L, U, V, _gen(0), 16384, prefix_lengths=prefixes)
    assert out.shape == (2, 4, dim) and torch.isfinite(out).all()
    a = query @ U.T
    limit = infinite_prompt_attention(query, measure, U, V)
    spread = torch.diagonal(gaussian_asymptotic_covariance(a, cov, V), dim1=-2, dim2=-1).sqrt()  # [4, D]
    for k, n in enumerate(prefixes):
        bias = leading_bias(a, measure, V, n)
        assert_within(out[k], limit, mc_tolerance(spread / math.sqrt(n)) + bias.abs(), f"L = {n}")


def test_rebasing_across_many_blocks_with_drifting_scores():
    """Scores rising from −5000 to +5000 across 143 blocks force repeated log-sum-exp rebases."""
    L = 1000
    t = torch.linspace(-5000.0, 5000.0, L, dtype=F64)
    tokens = torch.stack([t / 5000.0, torch.cos(t), torch.sin(t)], dim=-1)  # [L, 3]
    query = torch.tensor([[5000.0, 0.0, 0.0], [-5000.0, 0.0, 0.0], [1.0, 2.0, 3.0]], dtype=F64)
    U, V = torch.eye(3, dtype=F64), torch.eye(3, dtype=F64)
    got = finite_prompt_attention(query, tokens, U, V, chunk_size=7)
    assert torch.isfinite(got).all()
    assert_within(got, naive_attention(query, tokens, U, V), 2 * attention_tolerance(query, tokens, U, V), "rebasing")
