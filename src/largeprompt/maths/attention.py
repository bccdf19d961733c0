"""Single-layer softmax attention over a prompt, finite and infinite (docs/theory.md#notation, #infinite-prompt-operator, #jacobians).

T_{μ_L}(z_q) = V Σᵢ softmax_i(⟨U z_q, zᵢ⟩) zᵢ = V z̄_p, where z̄_p is the softmax-weighted
(tilted) mean of the prompt tokens. Everything here reduces to that mean (and, for the
Jacobians, the weighted covariance Σ̂_p), accumulated over the prompt in chunks with an
online log-sum-exp, so memory is O(chunk) in the prompt length L.

Shapes: queries ``[*B, *Q, D]`` and a prompt ``[*B, L, D]``: the prompt's batch dims B lead the
query's, and the Q queries in each cell share that prompt. ``[L, D]`` is one prompt shared by every
query; ``[..., L, D]`` with the query's own batch shape gives each query its own prompt.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from largeprompt.kernel.autotune import TunedMoments
from largeprompt.maths.measures import TokenMeasure

DEFAULT_CHUNK_SIZE = 65_536


def _validate_prefixes(prefix_lengths: Sequence[int] | None, prompt_length: int) -> list[int]:
    if prefix_lengths is None:
        return [prompt_length]
    prefixes = sorted(int(p) for p in prefix_lengths)
    if not prefixes or prefixes[0] < 1 or prefixes[-1] > prompt_length or len(set(prefixes)) != len(prefixes):
        raise ValueError(f"prefix_lengths must be distinct integers in [1, prompt_length={prompt_length}]; "
                         f"got {list(prefix_lengths)}")
    return prefixes


def _absorb_with_prefixes(acc: TunedMoments, chunks: Iterator[torch.Tensor], prefixes: list[int], second_moment: bool):
    """Feed chunks into ``acc`` and snapshot the moments whenever a prefix length is reached."""
    means, covs = [], []
    pending = iter(prefixes)
    target = next(pending)
    seen = 0
    for chunk in chunks:
        start, n = 0, chunk.shape[-2]
        while target is not None and seen + (n - start) >= target:
            stop = start + (target - seen)
            acc.update(chunk[..., start:stop, :])
            seen, start = target, stop
            means.append(acc.mean())
            if second_moment:
                covs.append(acc.covariance())
            target = next(pending, None)
        if target is None:
            break
        acc.update(chunk[..., start:, :])
        seen += n - start
    if target is not None:
        raise ValueError(f"the prompt ended after {seen} tokens, before prefix length {target}")
    return torch.stack(means), (torch.stack(covs) if second_moment else None)


def _token_chunks(tokens: torch.Tensor, chunk_size: int) -> Iterator[torch.Tensor]:
    for start in range(0, tokens.shape[-2], chunk_size):
        yield tokens[..., start : start + chunk_size, :]


def prompt_chunks(measure: TokenMeasure, prompt_length: int, generator,
                  chunk_size: int = DEFAULT_CHUNK_SIZE, batch_shape: Sequence[int] = ()) -> Iterator[torch.Tensor]:
    """Draw a prompt of i.i.d. tokens from ``measure`` block by block: yields [*batch_shape, ≤chunk, D].

    The prompt of length L is the first L tokens of any longer prompt drawn from the same
    generator state with the same chunk size, so prompts at several L are nested.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1; got {chunk_size}")
    batch_shape = tuple(batch_shape)
    for start in range(0, prompt_length, chunk_size):
        yield measure.sample((*batch_shape, min(chunk_size, prompt_length - start)), generator)


def tilted_moments(tilt: torch.Tensor, tokens: torch.Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                   prefix_lengths: Sequence[int] | None = None, second_moment: bool = False):
    """Softmax-weighted mean (and covariance) of ``tokens`` under scores ⟨tilt, zᵢ⟩ (docs/theory.md#jacobians).

    Returns (mean [..., D], cov or None) or, with ``prefix_lengths``, stacked [P, ...] tensors.
    """
    prefixes = _validate_prefixes(prefix_lengths, tokens.shape[-2])
    acc = TunedMoments(tilt, second_moment)
    means, covs = _absorb_with_prefixes(acc, _token_chunks(tokens, chunk_size), prefixes, second_moment)
    if prefix_lengths is None:
        return means[0], (covs[0] if second_moment else None)
    return means, covs


def streaming_tilted_moments(
    tilt: torch.Tensor,
    measure: TokenMeasure,
    prompt_length: int,
    generator,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    prefix_lengths: Sequence[int] | None = None,
    second_moment: bool = False,
    independent_prompts: bool = False,
    prompt_batch_shape: Sequence[int] | None = None,
):
    """As :func:`tilted_moments`, drawing the prompt from ``measure`` chunk by chunk and never holding it.

    By default one prompt [L, D] is shared by every tilt. ``independent_prompts=True`` gives each
    tilt in the batch [..., D] its own prompt [..., L, D]. ``prompt_batch_shape=B`` draws prompts
    [*B, L, D] for tilts [*B, *Q, D]: the Q queries in each batch cell share one prompt.
    """
    prefixes = _validate_prefixes(prefix_lengths, prompt_length)
    batch_shape = tuple(tilt.shape[:-1]) if independent_prompts else ()
    batch_shape = tuple(prompt_batch_shape) if prompt_batch_shape is not None else batch_shape
    chunks = prompt_chunks(measure, prefixes[-1], generator, chunk_size, batch_shape)
    acc = TunedMoments(tilt, second_moment)
    means, covs = _absorb_with_prefixes(acc, chunks, prefixes, second_moment)
    if prefix_lengths is None:
        return means[0], (covs[0] if second_moment else None)
    return means, covs


def finite_prompt_attention(query: torch.Tensor, tokens: torch.Tensor, attention_matrix: torch.Tensor,
                            value_matrix: torch.Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE,
                            prefix_lengths: Sequence[int] | None = None) -> torch.Tensor:
    """T_{μ_L}(z_q) = V Σᵢ softmax_i(⟨U z_q, zᵢ⟩) zᵢ (docs/theory.md#notation).

    query [..., D], tokens [..., L, D] (or [L, D] shared), attention_matrix U [D, D],
    value_matrix V [Dout, D] → [..., Dout] (or [P, ..., Dout] at ``prefix_lengths``).
    """
    tilt = query @ attention_matrix.T  # a = U z_q, [..., D]
    mean, _ = tilted_moments(tilt, tokens, chunk_size=chunk_size, prefix_lengths=prefix_lengths)
    return mean @ value_matrix.T


def streaming_prompt_attention(
    query: torch.Tensor,
    measure: TokenMeasure,
    prompt_length: int,
    attention_matrix: torch.Tensor,
    value_matrix: torch.Tensor,
    generator,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    prefix_lengths: Sequence[int] | None = None,
    independent_prompts: bool = False,
    prompt_batch_shape: Sequence[int] | None = None,
) -> torch.Tensor:
    """Finite-prompt attention with the prompt drawn from ``measure`` on the fly (bounded memory).

    With ``prefix_lengths`` returns [P, ..., Dout], the outputs at each nested prefix of one pass.
    """
    tilt = query @ attention_matrix.T
    mean, _ = streaming_tilted_moments(
        tilt, measure, prompt_length, generator, chunk_size=chunk_size, prefix_lengths=prefix_lengths,
        independent_prompts=independent_prompts, prompt_batch_shape=prompt_batch_shape,
    )
    return mean @ value_matrix.T


def infinite_prompt_attention(
    query: torch.Tensor, measure: TokenMeasure, attention_matrix: torch.Tensor, value_matrix: torch.Tensor
) -> torch.Tensor:
    """T_μ(z_q) = V ∇K(U z_q) (docs/theory.md#infinite-prompt-operator); affine V(m + S U z_q) for Gaussian tokens (R1)."""
    tilt = query @ attention_matrix.T
    return measure.cgf_grad(tilt) @ value_matrix.T
