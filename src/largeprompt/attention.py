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

import math
from collections.abc import Iterator, Sequence

import torch

from .measures import TokenMeasure

DEFAULT_CHUNK_SIZE = 65_536


def _broadcast_shape(*shapes) -> tuple[int, ...]:
    """torch.broadcast_shapes without its first-call import of torch.fx (≈ 1.5 s per process)."""
    return tuple(torch.broadcast_tensors(*(torch.empty(s, device="meta") for s in shapes))[0].shape)


class TiltedMoments:
    """Online softmax-weighted first (and optionally second) moments of a stream of tokens.

    For tilt a [..., D] it holds a reference score r (the first tile's max, raised whenever needed)
    and S = Σᵢ wᵢ [zᵢ, 1, zᵢ⊗zᵢ], wᵢ = e^{⟨a, zᵢ⟩ − r}. A tile of tokens is copied into a buffer of
    rows [z; 1; z⊗z] [n, D + 1 (+ D²), l] (n = prompts), so the hot loop is GEMM (the shift −r rides
    on the ones row) → in-place exp (natural base: torch's exp2 is up to 1.7× slower than exp on some CPUs) → one GEMM
    accumulating all of S. A block whose weights overflow (checked once per update) is redone tile
    by tile, rebasing r to the tile max (log-sum-exp), so scores of ±10⁴ neither overflow nor
    underflow. ``tile_elements`` (scores per tile; default: the machine's choice,
    :func:`largeprompt.autotune.attention_tile`) changes the results only by round-off.
    """

    MAX_WEIGHT_SUM = 1e200  # rebase the reference score before weights get anywhere near overflow
    MIN_TILE_TOKENS = 256

    def __init__(self, tilt: torch.Tensor, second_moment: bool = False, tile_elements: int | None = None):
        self.tilt = tilt  # [..., D]
        self.second_moment = second_moment
        self.tile_elements = tile_elements
        self.reference = None  # r [n, q]
        self.sums = None  # S [n, q, D + 1 (+ D²)]
        self.count = 0
        self._flat_tilt = self._shifted_tilt = None  # a [n, q, D]; [a, −r] [n, q, D + 1]
        self._batch = self._out_batch = None
        self._buffer = None  # (rows [z; 1] [n, D + 1, W], all rows transposed [n, W, D + 1 (+ D²)]) of one buffer

    def _prepare(self, tokens: torch.Tensor) -> torch.Tensor:
        """Lay the tilt out as [n, q, D] for a prompt [*B, l, D] (n = prod B); returns the prompt as [n, l, D].

        The prompt's batch dims B lead the tilt's batch dims; the remaining tilt dims (q of them,
        flattened) are queries sharing that prompt. B = () is one prompt shared by all queries.
        """
        nb, dim = tokens.ndim - 2, tokens.shape[-1]
        if self._flat_tilt is None:
            a = self.tilt
            if a.ndim - 1 < nb:
                a = a.expand(*tokens.shape[:nb], dim)
            batch, queries = _broadcast_shape(a.shape[:nb], tokens.shape[:nb]), tuple(a.shape[nb:-1])
            self._batch, self._out_batch = batch, (*batch, *queries)
            self._flat_tilt = a.expand(*batch, *queries, dim).reshape(math.prod(batch), -1, dim)
        if self.tile_elements is None:
            from .autotune import attention_tile

            n, q = self._flat_tilt.shape[:2]
            self.tile_elements = attention_tile(q, n, dim, self.second_moment, tokens.dtype, tokens.device)
        return tokens.expand(*self._batch, *tokens.shape[-2:]).reshape(-1, *tokens.shape[-2:])

    def update(self, tokens: torch.Tensor) -> None:
        """Absorb a block of prompt tokens [*B, l, D]."""
        if tokens.shape[-2] == 0:
            return
        tokens = self._prepare(tokens)
        tile = max(self.MIN_TILE_TOKENS, int(self.tile_elements) // max(1, self._flat_tilt[..., 0].numel()))
        length, first = tokens.shape[1], 0
        if self.reference is None:  # the first tile sets the reference score
            self._rebased_tile(*self._load(tokens[:, :tile]))
            first = tile
        saved = self.sums.clone()
        for start in range(first, length, tile):  # unchecked: S += e^{s − r} [z, 1, z⊗z]
            head, rows = self._load(tokens[:, start : start + tile])
            self.sums.baddbmm_(self._weights(head), rows)
        # weights are ≥ 0, so inf or NaN anywhere in the block shows in their sum (NaN < x is False)
        if not float(self.sums[..., tokens.shape[-1]].sum()) < self.MAX_WEIGHT_SUM:
            self.sums = saved
            for start in range(first, length, tile):
                self._checked_tile(*self._load(tokens[:, start : start + tile]))
        self.count += length

    def _load(self, tokens: torch.Tensor):
        """Copy a tile [n, l, D] into the buffer as rows [z; 1; z⊗z]; returns ([z; 1] [n, D + 1, l], rows [n, l, R])."""
        length, dim = tokens.shape[1:]
        if self._buffer is None or self._buffer[0].shape[-1] < length:
            rows = dim + 1 + (dim * dim if self.second_moment else 0)
            buffer = torch.ones(tokens.shape[0], rows, length, dtype=tokens.dtype, device=tokens.device)
            self._buffer = (buffer[:, : dim + 1], buffer.mT)
        head, rows = self._buffer
        if length < head.shape[-1]:
            head, rows = head[..., :length], rows[:, :length]
        z = head[:, :dim].copy_(tokens.mT)
        if self.second_moment:
            torch.mul(z.unsqueeze(1), z.unsqueeze(2), out=rows.mT[:, dim + 1 :].unflatten(1, (dim, dim)))
        return head, rows

    def _weights(self, head: torch.Tensor) -> torch.Tensor:
        """e^{sᵢ − r} [n, q, l] for the tile [z; 1] [n, D + 1, l]."""
        if self._shifted_tilt is None:
            self._shifted_tilt = torch.cat([self._flat_tilt, -self.reference.unsqueeze(-1)], dim=-1)
        if head.shape[0] == 1:  # one prompt: a plain GEMM, cheaper than a batched one of one
            return torch.mm(self._shifted_tilt[0], head[0]).exp_().unsqueeze(0)
        return torch.bmm(self._shifted_tilt, head).exp_()

    def _checked_tile(self, head: torch.Tensor, rows: torch.Tensor) -> None:
        block = torch.bmm(self._weights(head), rows)  # [n, q, R]
        if float(block[..., head.shape[1] - 1].sum()) < self.MAX_WEIGHT_SUM:
            self.sums += block
        else:
            self._rebased_tile(head, rows)

    def _rebased_tile(self, head: torch.Tensor, rows: torch.Tensor) -> None:
        """Absorb a tile with the reference raised to its max: weights ≤ 1, earlier sums scaled down."""
        scores = torch.bmm(self._flat_tilt, head[:, :-1])  # sᵢ, [n, q, l]
        tile_max = scores.amax(-1)
        new_reference = tile_max if self.reference is None else torch.maximum(self.reference, tile_max)
        if self.reference is not None:
            self.sums *= torch.exp(self.reference - new_reference).unsqueeze(-1)  # ≤ 1
        self.reference, self._shifted_tilt = new_reference, None
        block = torch.bmm(scores.sub_(new_reference.unsqueeze(-1)).exp_(), rows)
        self.sums = block if self.sums is None else self.sums + block

    def mean(self) -> torch.Tensor:
        """Softmax-weighted token mean z̄_p [..., D]."""
        if self.count == 0:
            raise ValueError("no tokens absorbed yet: a prompt needs prompt_length ≥ 1")
        dim = self._flat_tilt.shape[-1]
        return (self.sums[..., :dim] / self.sums[..., dim : dim + 1]).reshape(*self._out_batch, dim)

    def covariance(self) -> torch.Tensor:
        """Softmax-weighted token covariance Σ̂_p [..., D, D] (docs/theory.md#jacobians)."""
        if not self.second_moment:
            raise ValueError("TiltedMoments was built with second_moment=False")
        dim = self._flat_tilt.shape[-1]
        mean = self.mean()
        second = (self.sums[..., dim + 1 :] / self.sums[..., dim : dim + 1]).reshape(*self._out_batch, dim, dim)
        return second - mean.unsqueeze(-1) * mean.unsqueeze(-2)


def _validate_prefixes(prefix_lengths: Sequence[int] | None, prompt_length: int) -> list[int]:
    if prefix_lengths is None:
        return [prompt_length]
    prefixes = sorted(int(p) for p in prefix_lengths)
    if not prefixes or prefixes[0] < 1 or prefixes[-1] > prompt_length or len(set(prefixes)) != len(prefixes):
        raise ValueError(f"prefix_lengths must be distinct integers in [1, prompt_length={prompt_length}]; "
                         f"got {list(prefix_lengths)}")
    return prefixes


def _absorb_with_prefixes(acc: TiltedMoments, chunks: Iterator[torch.Tensor], prefixes: list[int], second_moment: bool):
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


def prompt_chunks(measure: TokenMeasure, prompt_length: int, generator: torch.Generator | None,
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
    batch_shape = tuple(tilt.shape[:-1]) if independent_prompts else ()
    batch_shape = tuple(prompt_batch_shape) if prompt_batch_shape is not None else batch_shape
    chunks = prompt_chunks(measure, prefixes[-1], generator, chunk_size, batch_shape)
    acc = TiltedMoments(tilt, second_moment)
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
