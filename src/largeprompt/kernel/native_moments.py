"""The native hot loop of :class:`largeprompt.kernel.tilted_moments.TiltedMoments` (``tilted_moments.c``;
docs/performance.md#native-moments).

One call absorbs a block of every prompt's tokens into the sums S = Σᵢ 2^(a·zᵢ − M) [zᵢ, 1, zᵢ⊗zᵢ] of every query,
raising the reference M chunk by chunk so that no weight exceeds 1: the GEMM → exp → GEMM of the torch path without
its score buffer, and a chunk of tokens read once from L1 by every query of its prompt. Built once per machine by
:mod:`largeprompt.kernel.native_build`; None where it cannot be, and the autotuner then never offers it.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from largeprompt.kernel import native_build

C_SOURCE = "tilted_moments.c"  # fingerprinted with this constant (largeprompt.io.fingerprints)
MAX_DIM = 8  # token dimensions 1…8 are compiled in
_P, _I64, _I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
ENTRY = {torch.float32: "tilted_moments_float", torch.float64: "tilted_moments_double"}


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The compiled kernel (:func:`largeprompt.kernel.native_build.load`), or None where it cannot be built."""
    args = [_P, _I64, _I64, _I64, _I64, _I64, _I, _I64, _P, _P, _P, _I64, _I64, _I64, _I]
    return native_build.load(C_SOURCE, {name: args for name in ENTRY.values()})


def supports(tokens: torch.Tensor) -> bool:
    """Whether the kernel is built and takes tokens [n, l, D]: on the CPU, float32 or float64, 1 ≤ D ≤ MAX_DIM (any
    strides). Where it does not, :class:`TiltedMoments` runs the block through torch (the same sums, base 2)."""
    return (tokens.device.type == "cpu" and tokens.dtype in ENTRY and 1 <= tokens.shape[-1] <= MAX_DIM
            and library() is not None)


def absorb(tokens: torch.Tensor, tilt: torch.Tensor, reference: torch.Tensor, sums: torch.Tensor, second_moment: bool):
    """Add tokens [n, l, D] to ``sums`` [n, q, W] (W = D + 1, + D² with ``second_moment``) under the base-2 tilts
    ``tilt`` [n, q, D] (log₂e · a), raising ``reference`` [n, q] (−∞: no token yet) where a chunk's maximum
    exceeds it; ``reference`` and ``sums`` are updated in place and must be contiguous / of the tokens' dtype."""
    lib = library()
    n, length, dim = tokens.shape
    queries = tilt.shape[1]
    if lib is None or not supports(tokens):
        raise ValueError("native moments: no library, or tokens it does not take (check supports() first)")
    width = dim + 1 + (dim * dim if second_moment else 0)
    if (sums.dtype != tokens.dtype or reference.dtype != tokens.dtype or tuple(sums.shape) != (n, queries, width)
            or tuple(reference.shape) != (n, queries) or not reference.is_contiguous() or tuple(tilt.shape) != (n, queries, dim)):
        raise ValueError(f"native moments: tokens {tuple(tokens.shape)} {tokens.dtype} need tilt [n, q, D], reference [n, q] "
                         f"(contiguous) and sums [n, q, {width}] in their dtype; got {tuple(tilt.shape)}, "
                         f"{tuple(reference.shape)} {reference.dtype}, {tuple(sums.shape)} {sums.dtype}")
    tilt = tilt.to(tokens.dtype).contiguous()  # held here: the C call reads its memory
    code = getattr(lib, ENTRY[tokens.dtype])(
        tokens.data_ptr(), tokens.stride(0), tokens.stride(1), tokens.stride(2), n, length, dim, queries,
        tilt.data_ptr(), reference.data_ptr(), sums.data_ptr(), sums.stride(0), sums.stride(1), sums.stride(2),
        int(second_moment))
    if code:
        raise ValueError(f"native moments: token dimension {dim} outside 1…{MAX_DIM}")
