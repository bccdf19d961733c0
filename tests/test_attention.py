"""Finite, streaming and infinite-prompt attention (SPEC §1, F1, §3.4)."""
import json
import math
import subprocess
import sys
import textwrap

import pytest
import torch

from largeprompt.attention import (
    finite_prompt_attention,
    infinite_prompt_attention,
    prompt_chunks,
    streaming_prompt_attention,
    streaming_tilted_moments,
    tilted_moments,
)
from largeprompt.measures import Gaussian, Rademacher, Uniform, toeplitz_covariance

F64 = torch.float64


def naive_attention(query, tokens, U, V):
    """Textbook float64 softmax attention: V Σ softmax(⟨U z_q, z_i⟩) z_i, everything materialised."""
    scores = torch.einsum("...d,...ld->...l", query @ U.T, tokens)
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("...l,...ld->...d", weights, tokens) @ V.T


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1000])
def test_finite_attention_equals_naive_softmax(chunk_size):
    g = _gen(0)
    U, V = torch.randn(4, 4, generator=g, dtype=F64), torch.randn(2, 4, generator=g, dtype=F64)
    query = torch.randn(3, 5, 4, generator=g, dtype=F64)
    tokens = torch.randn(3, 5, 200, 4, generator=g, dtype=F64)  # every query its own prompt
    got = finite_prompt_attention(query, tokens, U, V, chunk_size=chunk_size)
    assert got.shape == (3, 5, 2)
    assert torch.allclose(got, naive_attention(query, tokens, U, V), rtol=1e-12, atol=1e-12)


def test_shared_and_grouped_prompts_equal_naive_softmax():
    g = _gen(1)
    U, V = torch.randn(3, 3, generator=g, dtype=F64), torch.randn(1, 3, generator=g, dtype=F64)
    query = torch.randn(6, 3, generator=g, dtype=F64)
    shared = torch.randn(150, 3, generator=g, dtype=F64)  # one prompt for all queries
    got = finite_prompt_attention(query, shared, U, V, chunk_size=32)
    assert torch.allclose(got, naive_attention(query, shared.expand(6, 150, 3), U, V), rtol=1e-12, atol=1e-12)
    grouped_q = torch.randn(4, 6, 3, generator=g, dtype=F64)  # 4 prompts, 6 queries sharing each
    grouped_p = torch.randn(4, 150, 3, generator=g, dtype=F64)
    got = finite_prompt_attention(grouped_q, grouped_p, U, V, chunk_size=32)
    want = naive_attention(grouped_q, grouped_p[:, None].expand(4, 6, 150, 3), U, V)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_no_overflow_for_scores_of_ten_thousand(dtype):
    g = _gen(2)
    tokens = torch.randn(50, 3, generator=g, dtype=dtype)
    tokens = tokens / tokens.norm(dim=-1, keepdim=True)
    U = torch.eye(3, dtype=dtype)
    V = torch.eye(3, dtype=dtype)
    for sign in (1.0, -1.0):
        query = sign * 1e4 * tokens[17]  # scores up to ±10⁴
        got = finite_prompt_attention(query, tokens, U, V, chunk_size=8)
        assert torch.isfinite(got).all()
        assert torch.allclose(got, naive_attention(query, tokens, U, V), atol=1e-5)
        if sign > 0:  # the softmax is a hard max on token 17
            assert torch.allclose(got, tokens[17], atol=1e-5)
    # all scores ≈ −10⁴: the normaliser underflows without log-sum-exp
    query = -1e4 * torch.ones(3, dtype=dtype)
    tokens = torch.ones(20, 3, dtype=dtype) + 0.01 * torch.randn(20, 3, generator=g, dtype=dtype)
    got = finite_prompt_attention(query, tokens, U, V, chunk_size=3)
    assert torch.isfinite(got).all()


def test_moments_match_weighted_mean_and_covariance():
    g = _gen(3)
    tilt = torch.randn(4, 3, generator=g, dtype=F64)
    tokens = torch.randn(4, 90, 3, generator=g, dtype=F64)
    mean, cov = tilted_moments(tilt, tokens, chunk_size=13, second_moment=True)
    p = torch.softmax(torch.einsum("bd,bld->bl", tilt, tokens), -1)
    want_mean = torch.einsum("bl,bld->bd", p, tokens)
    centred = tokens - want_mean[:, None]
    want_cov = torch.einsum("bl,bli,blj->bij", p, centred, centred)
    assert torch.allclose(mean, want_mean, atol=1e-13)
    assert torch.allclose(cov, want_cov, atol=1e-13)


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
        if batch is None:
            want = naive_attention(query, prompt.expand(5, L, 3), U, V)
        else:
            want = naive_attention(query, prompt[:, None].expand(5, 2, L, 3), U, V)
        assert torch.allclose(got[k], want, rtol=1e-11, atol=1e-11), L
    # without prefixes: the output at the full length, identical to the last prefix
    full = streaming_prompt_attention(query, measure, 5000, U, V, _gen(99), 333, **kwargs)
    assert torch.allclose(full, got[-1], rtol=1e-12, atol=1e-12)


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
    # the O(1/L) bias is far below the standard error at this L
    assert torch.all((mean - limit).abs() < 5 * se + 1e-12), (mean, limit, se)
    if isinstance(measure, Gaussian):
        assert torch.allclose(limit, (measure.loc + (query @ U.T) @ measure.cov) @ V.T)


def test_streaming_memory_is_bounded_at_ten_million_tokens():
    """L = 10⁷ tokens in D = 6 would be 480 MB as a tensor; streaming must stay far below that."""
    code = textwrap.dedent(
        """
        import json, resource, sys, torch
        from largeprompt.attention import streaming_prompt_attention
        from largeprompt.measures import Gaussian
        torch.set_num_threads(1)
        L = int(sys.argv[1])
        m = Gaussian(torch.zeros(6), torch.eye(6, dtype=torch.float64))
        q = torch.randn(4, 6, dtype=torch.float64)
        g = torch.Generator().manual_seed(0)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = streaming_prompt_attention(q, m, L, torch.eye(6, dtype=torch.float64) * 0.3,
                                         torch.eye(6, dtype=torch.float64), g, 16384, prefix_lengths=[L // 10, L])
        assert torch.isfinite(out).all()
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"before_kb": before, "after_kb": after}))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code, "10000000"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rss = json.loads(proc.stdout.strip().splitlines()[-1])
    growth_mb = (rss["after_kb"] - rss["before_kb"]) / 1024
    assert growth_mb < 64, f"peak RSS grew by {growth_mb:.0f} MB while streaming 10⁷ tokens"


def test_rebasing_across_many_blocks_with_drifting_scores():
    """Scores rising from −5000 to +5000 across 143 blocks force repeated log-sum-exp rebases."""
    L = 1000
    t = torch.linspace(-5000.0, 5000.0, L, dtype=F64)
    tokens = torch.stack([t / 5000.0, torch.cos(t), torch.sin(t)], dim=-1)  # [L, 3]
    query = torch.tensor([[5000.0, 0.0, 0.0], [-5000.0, 0.0, 0.0], [1.0, 2.0, 3.0]], dtype=F64)
    U, V = torch.eye(3, dtype=F64), torch.eye(3, dtype=F64)
    got = finite_prompt_attention(query, tokens, U, V, chunk_size=7)
    assert torch.isfinite(got).all()
    assert torch.allclose(got, naive_attention(query, tokens, U, V), rtol=1e-10, atol=1e-12)
