"""The native loop of the streaming tilted moments (largeprompt.kernel.native_moments; docs/performance.md#native-moments):
against the untiled float64 reference within the dtype's round-off bound, overflow-free by its running reference,
bit-identical on a rerun, and replaced by torch where it is not built."""
from __future__ import annotations

import pytest
import torch
from test_autotune import reference_moments, round_off_bound

from helpers import without_compiler
from largeprompt.kernel import autotune, native_build, native_moments
from largeprompt.kernel.tilted_moments import AttentionKernel, TiltedMoments

F64 = torch.float64
NATIVE = AttentionKernel(1 << 16, False, True, native=True)
needs_library = pytest.mark.skipif(native_moments.library() is None, reason="no C compiler here: the native loop is not built")


def absorbed(tilt, tokens, kernel=NATIVE, second_moment=True, chunk=777):
    acc = TiltedMoments(tilt, second_moment, kernel)
    for start in range(0, tokens.shape[-2], chunk):
        acc.update(tokens[..., start : start + chunk, :])
    return acc


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("dim", [1, 2, 3, 5, 8])
def test_the_native_loop_matches_the_untiled_reference_in_every_dimension(dim, dtype):
    """Mean and covariance within the round-off bound of the dtype's eps; a tail shorter than one vector, and a
    chunk boundary inside the loop's L1 block, are both exercised (L = 2001, updates of 777 tokens)."""
    gen = torch.Generator().manual_seed(dim)
    tilt = torch.randn(4, 3, dim, generator=gen, dtype=F64).to(dtype)
    tokens = (1.5 * torch.randn(4, 2001, dim, generator=gen, dtype=F64) + 0.3).to(dtype)
    acc = absorbed(tilt, tokens)
    assert acc.reference is not None and acc.kernel.native
    mean_ref, cov_ref = reference_moments(tilt, tokens)
    tol = round_off_bound(tilt, tokens, torch.finfo(dtype).eps)
    assert (acc.mean().double() - mean_ref).abs().max().item() <= tol
    assert (acc.covariance().double() - cov_ref).abs().max().item() <= 4 * tol * tokens.abs().max().item()


@needs_library
def test_scores_of_ten_thousand_neither_overflow_nor_lose_the_top_token():
    """Tilts of 2000 (scores ±10⁴) and a prompt whose scores rise across the updates: the running reference keeps
    every weight ≤ 1 (the normaliser is at most the token count and at least 1, the top token's weight)."""
    length = 5000
    t = torch.linspace(-1.0, 1.0, length, dtype=F64)
    tokens = torch.stack([t, torch.cos(40 * t), torch.sin(40 * t)], dim=-1)[None]  # [1, L, 3]
    tilt = torch.tensor([[[3000.0, 0.0, 0.0], [-3000.0, 1.0, 0.0], [1.0, 2.0, 3.0]]], dtype=F64)
    acc = absorbed(tilt, tokens, chunk=1000)
    mean_ref, cov_ref = reference_moments(tilt, tokens)
    normaliser = acc.sums[..., 3]
    assert torch.isfinite(acc.sums).all() and (normaliser >= 1).all() and (normaliser <= length).all()
    assert (acc.mean() - mean_ref).abs().max().item() <= round_off_bound(tilt, tokens, torch.finfo(F64).eps)


@needs_library
def test_a_prompt_shared_by_every_batch_cell_is_read_through_a_zero_stride():
    """Tilts [4, 2, D] over one prompt [1, L, D] broadcast to the 4 cells (stride 0): each cell as if given its copy."""
    gen = torch.Generator().manual_seed(3)
    tilt = torch.randn(4, 2, 2, generator=gen, dtype=F64)
    tokens = torch.randn(1, 900, 2, generator=gen, dtype=F64)
    shared = absorbed(tilt, tokens)
    copied = absorbed(tilt, tokens.expand(4, -1, -1).contiguous())
    assert torch.equal(shared.mean(), copied.mean()) and torch.equal(shared.covariance(), copied.covariance())


@needs_library
def test_a_rerun_is_bit_identical_and_torch_agrees_to_round_off():
    gen = torch.Generator().manual_seed(5)
    tilt = torch.randn(8, 9, 2, generator=gen, dtype=F64)
    tokens = torch.randn(8, 3000, 2, generator=gen, dtype=F64)
    one, two = absorbed(tilt, tokens), absorbed(tilt, tokens)
    assert torch.equal(one.mean(), two.mean()) and torch.equal(one.covariance(), two.covariance())
    torch_path = absorbed(tilt, tokens, AttentionKernel(1 << 16, False, True))
    tol = round_off_bound(tilt, tokens, torch.finfo(F64).eps)
    assert (one.mean() - torch_path.mean()).abs().max().item() <= tol


def test_the_kernel_string_names_the_native_engine_and_parses_back():
    assert str(NATIVE).endswith(",engine=native")
    assert AttentionKernel.parse(str(NATIVE), autotune.default_kernel(1)) == NATIVE
    assert AttentionKernel.parse("engine=native,exp=e", autotune.default_kernel(1)).base2  # native is base 2
    with pytest.raises(ValueError, match="engine=torch\\|native"):
        AttentionKernel.parse("engine=fortran", autotune.default_kernel(1))
    report = {"kernels": {"attention/float64/cpu/D2/q16/p256/cov": str(NATIVE)}, "kernel_sources": {}}
    assert "native loop" in autotune.describe_kernels(report, 16) and "tokens;" not in autotune.describe_kernels(report, 16)


def test_without_the_library_the_tuner_never_offers_it_and_a_native_kernel_runs_through_torch(monkeypatch, tmp_path):
    with without_compiler(monkeypatch, tmp_path, native_moments.library) as (loaded, caught):
        assert loaded is None
        assert any("C compiler" in str(w.message) for w in caught)
        assert not any(k.native for k in autotune.candidate_kernels(9, 256, 2, 8))
        gen = torch.Generator().manual_seed(9)
        tilt, tokens = torch.randn(2, 3, 2, generator=gen, dtype=F64), torch.randn(2, 1500, 2, generator=gen, dtype=F64)
        acc = absorbed(tilt, tokens)  # the override's kernel, through torch's GEMMs in base 2
        mean_ref, _ = reference_moments(tilt, tokens)
        assert (acc.mean() - mean_ref).abs().max().item() <= round_off_bound(tilt, tokens, torch.finfo(F64).eps)
        monkeypatch.setenv(native_build.ENV_NATIVE, "0")
        native_moments.library.cache_clear()
        assert native_moments.library() is None


@needs_library
def test_strided_tokens_and_a_transposed_sums_buffer_are_read_through_their_strides():
    """Tokens as a slice of a feature-major tensor [D, n, L+1] (strides (L+1, 1, n(L+1))) and sums held transposed
    [n, W, q]ᵀ give what contiguous copies give, bit for bit (the loop reads the same numbers in the same order)."""
    gen = torch.Generator().manual_seed(13)
    n, q, L, D = 3, 4, 700, 3
    feature_major = torch.randn(D, n, L + 1, generator=gen, dtype=F64)
    tokens = feature_major.permute(1, 2, 0)[:, :L]  # [n, L, D], strided
    tilt = torch.randn(n, q, D, generator=gen, dtype=F64)
    width = D + 1 + D * D
    results = []
    for view, transposed in ((tokens, False), (tokens.contiguous(), True)):
        sums = torch.zeros(n, width, q, dtype=F64).mT if transposed else torch.zeros(n, q, width, dtype=F64)
        reference = torch.full((n, q), -torch.inf, dtype=F64)
        for start in range(0, L, 333):
            native_moments.absorb(view[:, start : start + 333], tilt, reference, sums, True)
        results.append(sums.contiguous())
    assert not tokens.is_contiguous() and torch.equal(results[0], results[1])


@needs_library
def test_buffers_of_another_dtype_or_shape_are_refused_by_name():
    tokens = torch.randn(2, 50, 2, dtype=F64)
    tilt = torch.randn(2, 3, 2, dtype=F64)
    reference = torch.full((2, 3), -torch.inf, dtype=torch.float32)
    with pytest.raises(ValueError, match="reference \\[n, q\\]"):
        native_moments.absorb(tokens, tilt, reference, torch.zeros(2, 3, 7, dtype=F64), True)
    with pytest.raises(ValueError, match="sums \\[n, q, 3\\]"):
        native_moments.absorb(tokens, tilt, reference.double(), torch.zeros(2, 3, 7, dtype=F64), False)
    acc = TiltedMoments(tilt.float(), False, NATIVE)
    acc.update(tokens.float())
    with pytest.raises(ValueError, match="in their dtype"):  # a later block in another dtype
        acc.update(tokens)


def test_a_native_kernel_is_base_two():
    with pytest.raises(ValueError, match="base 2"):
        AttentionKernel(1 << 16, False, False, native=True)
