"""Single-layer softmax attention over a prompt, finite and infinite (SPEC §1, F1, F5).

T_{μ_L}(z_q) = V Σᵢ softmax_i(⟨U z_q, zᵢ⟩) zᵢ = V z̄_p, where z̄_p is the softmax-weighted
(tilted) mean of the prompt tokens. Everything here reduces to that mean (and, for the
gradients of F5, the weighted covariance Σ̂_p), accumulated over the prompt in chunks with an
online log-sum-exp, so memory is O(chunk) in the prompt length L.

Shapes: queries ``[*B, *Q, D]`` and a prompt ``[*B, L, D]``: the prompt's batch dims B lead the
query's, and the Q queries in each cell share that prompt. ``[L, D]`` is one prompt shared by every
query; ``[..., L, D]`` with the query's own batch shape gives each query its own prompt.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import torch

from .measures import TokenMeasure

DEFAULT_CHUNK_SIZE = 65_536


class TiltedMoments:
    """Online softmax-weighted first (and optionally second) moments of a stream of tokens.

    For tilt a [..., D] it holds a reference score r (the running max of the first block, raised
    whenever needed), s1 = Σ e^{sᵢ−r} [zᵢ, 1] (weighted token sum and, last, the normaliser) and, if
    asked, s2 = Σ e^{sᵢ−r} zᵢ zᵢᵀ. The shift −r rides in the score GEMM as an extra column, so the
    hot loop is GEMM → in-place exp → GEMM. Weights may exceed 1 (no precision is lost by that);
    a block whose weights would overflow is redone with a fresh max (log-sum-exp), so scores of
    ±10⁴ neither overflow nor underflow the normaliser.
    """

    # Score tiles of this many elements (8 MiB in float64): large enough that per-tile overhead is
    # negligible (measured: 1 << 17 is 10% slower at L = 10⁶, 64 queries), small enough to bound memory.
    TILE_ELEMENTS = 1 << 20
    # Rebase the reference score before weights get anywhere near overflow.
    MAX_WEIGHT_SUM = 1e200

    def __init__(self, tilt: torch.Tensor, second_moment: bool = False):
        self.tilt = tilt  # [..., D]
        self.second_moment = second_moment
        self.reference = None  # r [*B, q]
        self.first = None  # s1 [*B, q, D + 1]
        self.second = None  # s2 [*B, q, D, D]
        self.count = 0
        self._flat_tilt = None  # [*B, q, D]
        self._shifted_tilt = None  # [*B, q, D + 1] = [a, −r]
        self._batch = None
        self._out_batch = None

    def _prepare(self, tokens: torch.Tensor) -> torch.Tensor:
        """Lay the tilt out as [*B, q, D] for a prompt [*B, l, D]; returns the prompt expanded to B.

        The prompt's batch dims B lead the tilt's batch dims; the remaining tilt dims (q of them,
        flattened) are queries sharing that prompt. B = () is one prompt shared by all queries.
        """
        nb = tokens.ndim - 2
        if self._flat_tilt is None:
            a, dim = self.tilt, self.tilt.shape[-1]
            if a.ndim - 1 < nb:
                a = a.expand(*tokens.shape[:nb], dim)
            batch = torch.broadcast_shapes(tuple(a.shape[:nb]), tuple(tokens.shape[:nb]))
            queries = tuple(a.shape[nb:-1])
            self._batch = batch
            self._out_batch = (*batch, *queries)
            self._flat_tilt = a.expand(*batch, *queries, dim).reshape(*batch, -1, dim)  # [*B, q, D]
        return tokens.expand(*self._batch, *tokens.shape[-2:])

    def update(self, tokens: torch.Tensor) -> None:
        """Absorb a block of prompt tokens [*B, l, D]."""
        if tokens.shape[-2] == 0:
            return
        tokens = self._prepare(tokens)
        ones = torch.ones(*tokens.shape[:-1], 1, dtype=tokens.dtype, device=tokens.device)
        augmented = torch.cat([tokens, ones], dim=-1)  # [*B, l, D + 1]
        n_scores = max(1, self._flat_tilt[..., 0].numel())
        tile = max(256, self.TILE_ELEMENTS // n_scores)
        for start in range(0, tokens.shape[-2], tile):
            self._update_tile(augmented[..., start : start + tile, :])
        self.count += tokens.shape[-2]

    def _update_tile(self, augmented: torch.Tensor) -> None:
        tokens = augmented[..., :-1]  # [*B, l, D]
        if self.reference is not None:
            if self._shifted_tilt is None:
                self._shifted_tilt = torch.cat([self._flat_tilt, -self.reference.unsqueeze(-1)], dim=-1)  # [*B, q, D + 1]
            weights = (self._shifted_tilt @ augmented.mT).exp_()  # e^{sᵢ − r}, [*B, q, l]
            block = weights @ augmented  # [*B, q, D + 1]
            # inf or NaN anywhere in the tile shows in its weight sum (NaN < x is False)
            if bool((block[..., -1] < self.MAX_WEIGHT_SUM).all()):
                self._accumulate(block, weights, tokens)
                return
        # first tile, or weights too large: recompute with the tile max (log-sum-exp rebase)
        scores = self._flat_tilt @ tokens.mT  # [*B, q, l]
        tile_max = scores.amax(-1)
        new_reference = tile_max if self.reference is None else torch.maximum(self.reference, tile_max)
        if self.reference is not None:
            rescale = torch.exp(self.reference - new_reference)  # ≤ 1
            self.first = self.first * rescale.unsqueeze(-1)
            if self.second_moment:
                self.second = self.second * rescale[..., None, None]
        self.reference = new_reference
        self._shifted_tilt = None
        weights = scores.sub_(new_reference.unsqueeze(-1)).exp_()  # each ≤ 1
        self._accumulate(weights @ augmented, weights, tokens)

    def _accumulate(self, block: torch.Tensor, weights: torch.Tensor, tokens: torch.Tensor) -> None:
        self.first = block if self.first is None else self.first + block
        if self.second_moment:
            block_second = torch.einsum("...ql,...li,...lj->...qij", weights, tokens, tokens)
            self.second = block_second if self.second is None else self.second + block_second

    def _weight_sum(self) -> torch.Tensor:
        return self.first[..., -1]

    def mean(self) -> torch.Tensor:
        """Softmax-weighted token mean z̄_p [..., D]."""
        if self.count == 0:
            raise ValueError("no tokens absorbed yet: a prompt needs prompt_length ≥ 1")
        mean = self.first[..., :-1] / self.first[..., -1:]
        return mean.reshape(*self._out_batch, mean.shape[-1])

    def covariance(self) -> torch.Tensor:
        """Softmax-weighted token covariance Σ̂_p [..., D, D] (SPEC F5)."""
        if not self.second_moment:
            raise ValueError("TiltedMoments was built with second_moment=False")
        dim = self.first.shape[-1] - 1
        mean = self.mean()
        second = (self.second / self._weight_sum()[..., None, None]).reshape(*self._out_batch, dim, dim)
        return second - mean.unsqueeze(-1) * mean.unsqueeze(-2)



def _validate_prefixes(prefix_lengths: Sequence[int] | None, prompt_length: int) -> list[int]:
    if prefix_lengths is None:
        return [prompt_length]
    prefixes = sorted(int(p) for p in prefix_lengths)
    if not prefixes or prefixes[0] < 1 or prefixes[-1] > prompt_length or len(set(prefixes)) != len(prefixes):
        raise ValueError(
            f"prefix_lengths must be distinct integers in [1, prompt_length={prompt_length}]; got {list(prefix_lengths)}"
        )
    return prefixes


def _absorb_with_prefixes(
    acc: TiltedMoments, chunks: Iterator[torch.Tensor], prefixes: list[int], second_moment: bool
):
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


def prompt_chunks(
    measure: TokenMeasure,
    prompt_length: int,
    generator: torch.Generator | None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    batch_shape: Sequence[int] = (),
) -> Iterator[torch.Tensor]:
    """Draw a prompt of i.i.d. tokens from ``measure`` block by block: yields [*batch_shape, ≤chunk, D].

    The prompt of length L is the first L tokens of any longer prompt drawn from the same
    generator state with the same chunk size, so prompts at several L are nested.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1; got {chunk_size}")
    batch_shape = tuple(batch_shape)
    for start in range(0, prompt_length, chunk_size):
        n = min(chunk_size, prompt_length - start)
        tokens = measure.sample((*batch_shape, n), generator)
        yield tokens


def tilted_moments(
    tilt: torch.Tensor,
    tokens: torch.Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    prefix_lengths: Sequence[int] | None = None,
    second_moment: bool = False,
):
    """Softmax-weighted mean (and covariance) of ``tokens`` under scores ⟨tilt, zᵢ⟩ (SPEC F5).

    Returns (mean [..., D], cov or None) or, with ``prefix_lengths``, stacked [P, ...] tensors.
    """
    prefixes = _validate_prefixes(prefix_lengths, tokens.shape[-2])
    acc = TiltedMoments(tilt, second_moment)
    means, covs = _absorb_with_prefixes(acc, _token_chunks(tokens, chunk_size), prefixes, second_moment)
    if prefix_lengths is None:
        return means[0], (covs[0] if second_moment else None)
    return means, covs


def streaming_tilted_moments(
    tilt: torch.Tensor,
    measure: TokenMeasure,
    prompt_length: int,
    generator: torch.Generator | None,
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
    if prompt_batch_shape is not None:
        batch_shape = tuple(prompt_batch_shape)
    else:
        batch_shape = tuple(tilt.shape[:-1]) if independent_prompts else ()
    chunks = prompt_chunks(measure, prefixes[-1], generator, chunk_size, batch_shape)
    acc = TiltedMoments(tilt, second_moment)
    means, covs = _absorb_with_prefixes(acc, chunks, prefixes, second_moment)
    if prefix_lengths is None:
        return means[0], (covs[0] if second_moment else None)
    return means, covs


def finite_prompt_attention(
    query: torch.Tensor,
    tokens: torch.Tensor,
    attention_matrix: torch.Tensor,
    value_matrix: torch.Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    prefix_lengths: Sequence[int] | None = None,
) -> torch.Tensor:
    """T_{μ_L}(z_q) = V Σᵢ softmax_i(⟨U z_q, zᵢ⟩) zᵢ (SPEC §1).

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
    generator: torch.Generator | None,
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
        tilt,
        measure,
        prompt_length,
        generator,
        chunk_size=chunk_size,
        prefix_lengths=prefix_lengths,
        independent_prompts=independent_prompts,
        prompt_batch_shape=prompt_batch_shape,
    )
    return mean @ value_matrix.T


def infinite_prompt_attention(
    query: torch.Tensor, measure: TokenMeasure, attention_matrix: torch.Tensor, value_matrix: torch.Tensor
) -> torch.Tensor:
    """T_μ(z_q) = V ∇K(U z_q) (SPEC F1); affine V(m + S U z_q) for Gaussian tokens (R1)."""
    tilt = query @ attention_matrix.T
    return measure.cgf_grad(tilt) @ value_matrix.T
