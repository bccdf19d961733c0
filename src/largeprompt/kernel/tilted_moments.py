"""The streaming accumulator behind every finite-prompt attention: softmax-weighted token moments (docs/theory.md#jacobians).

Used through :mod:`largeprompt.maths.attention`; how it runs (:class:`AttentionKernel`: tile size, storage
order, base of the exponential) comes from :mod:`largeprompt.kernel.autotune`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from largeprompt.kernel import native_moments

LOG2_E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class AttentionKernel:
    """How :class:`TiltedMoments` runs its hot loop; every choice changes results only by round-off.

    ``tile_elements``: scores per GEMM → exp → GEMM step. ``token_major``: scores and sums stored
    transposed ([n, l, q], rows [z, 1, z⊗z] contiguous per token) or query-major (scores [n, q, l],
    rows stored per feature). ``base2``: weights 2^{log₂e·s − r} by exp2 instead of e^{s − r} by exp
    (which of the two is faster depends on the CPU and its math library). ``native``: the compiled loop of
    :mod:`largeprompt.kernel.native_moments` instead of torch's GEMMs (base 2; tile and storage order then unused).
    Written and parsed as ``tile=131072,scores=query,exp=2`` (``,engine=native`` for the native loop).
    """

    tile_elements: int
    token_major: bool = False
    base2: bool = False
    native: bool = False

    def __post_init__(self):
        if self.native and not self.base2:
            raise ValueError("the native attention loop runs in base 2: AttentionKernel(..., base2=True, native=True)")

    def __str__(self) -> str:
        text = f"tile={self.tile_elements},scores={'token' if self.token_major else 'query'},exp={'2' if self.base2 else 'e'}"
        return text + (",engine=native" if self.native else "")

    @classmethod
    def parse(cls, text: str, default: AttentionKernel) -> AttentionKernel:
        """``tile=<n>,scores=token|query,exp=e|2,engine=torch|native``; a missing field keeps ``default``'s
        (``engine=native`` implies ``exp=2``)."""
        fields = {"tile": str(default.tile_elements), "scores": "token" if default.token_major else "query",
                  "exp": "2" if default.base2 else "e", "engine": "native" if default.native else "torch"}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, value = part.partition("=")
            if key.strip() not in fields:
                raise ValueError(f"unknown attention kernel field {key.strip()!r} in {text!r}; expected tile, scores, exp, engine")
            fields[key.strip()] = value.strip()
        tile = int(fields["tile"]) if fields["tile"].isdigit() else 0
        if (tile < 1 or fields["scores"] not in ("token", "query") or fields["exp"] not in ("e", "2")
                or fields["engine"] not in ("torch", "native")):
            raise ValueError(f"attention kernel {text!r}: expected tile=<positive integer>, scores=token|query, exp=e|2, "
                             "engine=torch|native")
        native = fields["engine"] == "native"
        return cls(tile, fields["scores"] == "token", fields["exp"] == "2" or native, native)


def _broadcast_shape(*shapes) -> tuple[int, ...]:
    """torch.broadcast_shapes without its first-call import of torch.fx (≈ 1.5 s per process)."""
    return tuple(torch.broadcast_tensors(*(torch.empty(s, device="meta") for s in shapes))[0].shape)


class TiltedMoments:
    """Online softmax-weighted first (and optionally second) moments of a stream of tokens.

    For tilt a [..., D] it holds a reference score r (the first tile's max, raised whenever needed)
    and S = Σᵢ wᵢ [zᵢ, 1, zᵢ⊗zᵢ], wᵢ = b^{c⟨a, zᵢ⟩ − r} (base b = e with c = 1, or b = 2 with
    c = log₂e: the same weights). A tile of tokens is copied into a buffer of rows [z, 1, z⊗z]
    [n, l, R] (n = prompts), so the hot loop is GEMM (the shift −r rides on the ones column) →
    in-place exp or exp2 → one GEMM accumulating all of S. Scores, rows and S are stored in the
    ``kernel``'s order (:class:`AttentionKernel`; default: the machine's choice,
    :class:`largeprompt.kernel.autotune.TunedMoments`). A block whose weights overflow (checked once per
    update) is redone tile by tile, rebasing r to the tile max (log-sum-exp), so scores of ±10⁴
    neither overflow nor underflow.
    """

    MAX_WEIGHT_SUM = 1e200  # rebase the reference score before weights get anywhere near overflow
    MIN_TILE_TOKENS = 256

    def __init__(self, tilt: torch.Tensor, second_moment: bool = False, kernel: AttentionKernel | None = None):
        self.tilt = tilt  # [..., D]
        self.second_moment = second_moment
        self.kernel = kernel
        self.reference = None  # r [n, q], in units of the kernel's base
        self.sums = None  # S [n, q, R], R = D + 1 (+ D²)
        self.count = 0
        self._flat_tilt = self._scaled_tilt = self._shifted_tilt = None  # a, c·a [n, q, D]; [c·a, −r] [n, q, D + 1]
        self._batch = self._out_batch = None
        self._rows = self._weights_buffer = None  # [n, W, R] and [n, q, W], W = the tile in tokens

    def choose_kernel(self, queries: int, prompts: int, dim: int, dtype, device) -> AttentionKernel:
        """The kernel for this shape when none was given: a subclass chooses it
        (:class:`largeprompt.kernel.autotune.TunedMoments`, the machine's choice)."""
        raise TypeError("TiltedMoments needs a kernel; use largeprompt.kernel.autotune.TunedMoments for the machine's choice")

    @property
    def _token_major(self) -> bool:
        return self.kernel.token_major

    def _power(self, x: torch.Tensor) -> torch.Tensor:
        """b^x in place (b = 2 or e, the kernel's base)."""
        return x.exp2_() if self.kernel.base2 else x.exp_()

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
        if self.kernel is None:
            n, q = self._flat_tilt.shape[:2]
            self.kernel = self.choose_kernel(q, n, dim, tokens.dtype, tokens.device)
        if self._scaled_tilt is None:
            self._scaled_tilt = self._flat_tilt * LOG2_E if self.kernel.base2 or self.kernel.native else self._flat_tilt
        return tokens.expand(*self._batch, *tokens.shape[-2:]).reshape(-1, *tokens.shape[-2:])

    @staticmethod
    def _buffer(n: int, rows: int, cols: int, like: torch.Tensor, transposed: bool, fill=None) -> torch.Tensor:
        """An [n, rows, cols] buffer, or a transposed view of an [n, cols, rows] one."""
        shape = (n, cols, rows) if transposed else (n, rows, cols)
        out = torch.empty(shape, dtype=like.dtype, device=like.device) if fill is None else \
            torch.full(shape, fill, dtype=like.dtype, device=like.device)
        return out.mT if transposed else out

    def update(self, tokens: torch.Tensor) -> None:
        """Absorb a block of prompt tokens [*B, l, D]."""
        if tokens.shape[-2] == 0:
            return
        tokens = self._prepare(tokens)
        if self.kernel.native and native_moments.supports(tokens):
            self._absorb_native(tokens)
            return
        tile = max(self.MIN_TILE_TOKENS, int(self.kernel.tile_elements) // max(1, self._flat_tilt[..., 0].numel()))
        length, first = tokens.shape[1], 0
        if self.reference is None:  # the first tile sets the reference score
            self._rebased_tile(self._load(tokens[:, :tile]))
            first = tile
        saved = self.sums.clone()  # keeps the storage order
        one_prompt = tokens.shape[0] == 1  # plain GEMMs: cheaper than batched ones of one
        for start in range(first, length, tile):  # unchecked: S += e^{s − r} [z, 1, z⊗z]
            rows = self._load(tokens[:, start : start + tile])
            if one_prompt:
                self.sums[0].addmm_(self._weights(rows)[0], rows[0])
            else:
                self.sums.baddbmm_(self._weights(rows), rows)
        # weights are ≥ 0, so inf or NaN anywhere in the block shows in their sum (NaN < x is False)
        if not float(self.sums[..., tokens.shape[-1]].sum()) < self.MAX_WEIGHT_SUM:
            self.sums = saved
            for start in range(first, length, tile):
                self._checked_tile(self._load(tokens[:, start : start + tile]))
        self.count += length

    def _absorb_native(self, tokens: torch.Tensor) -> None:
        """The block through the compiled loop (:func:`largeprompt.kernel.native_moments.absorb`, base 2)."""
        n, q, dim = self._flat_tilt.shape
        if self.sums is None:
            width = dim + 1 + (dim * dim if self.second_moment else 0)
            self.sums = tokens.new_zeros(n, q, width)
            self.reference = tokens.new_full((n, q), -math.inf)
            self._scaled_tilt = self._scaled_tilt.to(tokens.dtype).contiguous()  # as C reads it, once
        native_moments.absorb(tokens, self._scaled_tilt, self.reference, self.sums, self.second_moment)
        self.count += tokens.shape[1]

    def _load(self, tokens: torch.Tensor) -> torch.Tensor:
        """Copy a tile [n, l, D] into the buffer as rows [z, 1, z⊗z]; returns them, [n, l, R]."""
        length, dim = tokens.shape[1:]
        if self._rows is None or self._rows.shape[1] < length:
            width = dim + 1 + (dim * dim if self.second_moment else 0)
            # rows are contiguous when token-major; scores and sums are then the transposed ones
            self._rows = self._buffer(tokens.shape[0], length, width, tokens, not self._token_major, fill=1.0)
            self._weights_buffer = None
        rows = self._rows[:, :length]
        z = rows[..., :dim].copy_(tokens)
        if self.second_moment:
            torch.mul(z.unsqueeze(-1), z.unsqueeze(-2), out=rows[..., dim + 1 :].unflatten(-1, (dim, dim)))
        return rows

    def _weights(self, rows: torch.Tensor) -> torch.Tensor:
        """b^{c·sᵢ − r} [n, q, l] for the tile rows [n, l, R] (a reused buffer)."""
        dim = self._flat_tilt.shape[-1]
        if self._shifted_tilt is None:
            self._shifted_tilt = torch.cat([self._scaled_tilt, -self.reference.unsqueeze(-1)], dim=-1)
        if self._weights_buffer is None:
            n, q = self._flat_tilt.shape[:2]
            self._weights_buffer = self._buffer(n, q, self._rows.shape[1], rows, self._token_major)
        out = self._weights_buffer[..., : rows.shape[1]]
        if rows.shape[0] == 1:
            torch.mm(self._shifted_tilt[0], rows[0, :, : dim + 1].T, out=out[0])
        else:
            torch.bmm(self._shifted_tilt, rows[..., : dim + 1].mT, out=out)
        return self._power(out)

    def _checked_tile(self, rows: torch.Tensor) -> None:
        block = torch.bmm(self._weights(rows), rows)  # [n, q, R]
        if float(block[..., self._flat_tilt.shape[-1]].sum()) < self.MAX_WEIGHT_SUM:
            self.sums += block
        else:
            self._rebased_tile(rows)

    def _rebased_tile(self, rows: torch.Tensor) -> None:
        """Absorb a tile with the reference raised to its max: weights ≤ 1, earlier sums scaled down."""
        n, q, dim = self._flat_tilt.shape
        scores = torch.bmm(self._scaled_tilt, rows[..., :dim].mT)  # c·sᵢ, [n, q, l]
        tile_max = scores.amax(-1)
        new_reference = tile_max if self.reference is None else torch.maximum(self.reference, tile_max)
        if self.sums is None:
            self.sums = self._buffer(n, q, rows.shape[-1], rows, self._token_major, fill=0.0)
        else:
            self.sums *= self._power(self.reference - new_reference).unsqueeze(-1)  # ≤ 1
        self.reference, self._shifted_tilt = new_reference, None
        self.sums.baddbmm_(self._power(scores.sub_(new_reference.unsqueeze(-1))), rows)

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
