"""The native readout and SGD step of the stacked engine (``stacked_readout.c``; docs/performance.md#native-readout):
the accelerated twin of :mod:`largeprompt.icl.tilted_readout` and :func:`largeprompt.icl.models.sgd_update`, tested
equal to them (tests/test_native_readout.py).

One pass over each prompt gives every run's prediction and the two moments its gradient is made of (softmax runs:
m = Σ e z / Z and n − ŷm with n = Σ e w z / Z; linear runs: Cu and Ca from C = Σ z zᵀ / L), in the stack's order
and in the true frame of a whitened prompt, without the rows [B, 2S, L] that the torch path writes and reads five
times, and in one call instead of some twenty torch calls. The C source ships with the package and is compiled
once per machine (:mod:`largeprompt.kernel.native_build`). Where there is no compiler, the build fails, or
``LARGEPROMPT_NATIVE=0``, :func:`library` is None and the engine's tuning never offers the native plan.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from largeprompt.kernel import native_build

ENV_NATIVE = native_build.ENV_NATIVE
C_SOURCE = "stacked_readout.c"  # fingerprinted with this constant (largeprompt.io.fingerprints)
MAX_DIM = 8  # token dimensions 2…8 are compiled in
_P, _I64, _I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
ENTRY = {torch.float32: "stacked_readout_float", torch.float64: "stacked_readout_double"}
SGD_ENTRY = {torch.float32: "stacked_sgd_float", torch.float64: "stacked_sgd_double"}


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The compiled readout (:func:`largeprompt.kernel.native_build.load`), or None where it cannot be built."""
    readout = [_P, _I64, _I64, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P]
    sgd = {dtype: [_P, _I64, _I64, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, real, _P, _P]
           for dtype, real in ((torch.float32, ctypes.c_float), (torch.float64, ctypes.c_double))}
    return native_build.load(C_SOURCE, {**{name: readout for name in ENTRY.values()},
                                        **{SGD_ENTRY[dtype]: args for dtype, args in sgd.items()}}, __package__)


def supports(prompt: torch.Tensor) -> bool:
    """Whether ``prompt`` [B, L, D] can go through the native readout: CPU, float32 or float64, 2 ≤ D ≤ MAX_DIM,
    tokens of each feature consecutive in memory (the feature-major layout of the engine's draws)."""
    return (prompt.device.type == "cpu" and prompt.dtype in ENTRY and 2 <= prompt.shape[-1] <= MAX_DIM
            and (prompt.stride(1) == 1 or prompt.shape[1] == 1) and prompt.shape[1] > 0)


def _common(prompt, softmax, frame):
    """The inputs both entries share, as C reads them: the softmax flags [R] as bytes and the frame (or None) in the
    prompt's dtype."""
    flags = softmax.to(device="cpu", dtype=torch.uint8).contiguous()
    return flags, None if frame is None else frame.to(dtype=prompt.dtype).contiguous()


def _call(prompt, tilts, values, softmax, frame, outputs, fit=None):
    """One call of the C entry; ``outputs``: (prediction, ∇a-moment, ∇u-moment) tensors or None, ``fit``:
    (query, target, loss, ∇U, ∇u) or None."""
    lib = library()
    if lib is None or not supports(prompt):
        raise ValueError("native readout: no library, or a prompt it does not take (check supports() first)")
    B, L, D = prompt.shape
    flags, frame = _common(prompt, softmax, frame)
    tilts, values = tilts.contiguous(), values.contiguous()  # held here: the C call reads their memory
    pointers = [None if t is None else t.data_ptr() for t in (*outputs, *(fit or (None,) * 5))]
    code = getattr(lib, ENTRY[prompt.dtype])(
        prompt.data_ptr(), prompt.stride(0), prompt.stride(2), B, L, D, tilts.shape[1], flags.data_ptr(),
        tilts.data_ptr(), values.data_ptr(), None if frame is None else frame.data_ptr(), *pointers)
    if code:
        raise ValueError(f"native readout: token dimension {D} outside 2…{MAX_DIM}")


def readout(prompt: torch.Tensor, tilts: torch.Tensor, values: torch.Tensor, softmax: torch.Tensor, frame=None, *,
            gradients: bool = True):
    """(ŷ [B, R], ∇a-moment [B, R, D], ∇u-moment [B, R, D]) of every run (module doc; the moments None unless
    ``gradients``) on prompt [B, L, D] (see :func:`supports`), tokens z = T z' with T = ``frame`` [D, D] (None: I),
    tilts a = U q [B, R, D], value directions u [R, D] and ``softmax`` [R] (bool: softmax, else linear)."""
    B, L, D = prompt.shape
    R = tilts.shape[1]
    prediction = prompt.new_empty(B, R)
    for_a = prompt.new_empty(B, R, D) if gradients else None
    for_u = prompt.new_empty(B, R, D) if gradients else None
    _call(prompt, tilts, values, softmax, frame, (prediction, for_a, for_u))
    return prediction, for_a, for_u


def loss_and_gradient(prompt: torch.Tensor, tilts: torch.Tensor, values: torch.Tensor, softmax: torch.Tensor, frame,
                      query: torch.Tensor, target: torch.Tensor):
    """As :func:`readout`, summed over the batch in the same call: every run's batch MSE [R] against ``target`` [B],
    ∇U = Σ_b ∂ℓ/∂ŷ_b (∇a-moment) q_bᵀ/√D [R, D, D] and ∇u = Σ_b ∂ℓ/∂ŷ_b (∇u-moment) [R, D], ∂ℓ/∂ŷ = 2(ŷ − y)/B."""
    B, L, D = prompt.shape
    R = tilts.shape[1]
    query, target = query.to(prompt.dtype).contiguous(), target.to(prompt.dtype).contiguous()
    loss, grad_U, grad_u = prompt.new_empty(R), prompt.new_empty(R, D, D), prompt.new_empty(R, D)
    _call(prompt, tilts, values, softmax, frame, (None, None, None), (query, target, loss, grad_U, grad_u))
    return loss, grad_U, grad_u


def sgd_step(prompt: torch.Tensor, softmax: torch.Tensor, query: torch.Tensor, target: torch.Tensor, frame, weights,
             lr: torch.Tensor, threshold: float):
    """One plain-SGD step of every run, in place on ``weights`` (Q, K, V [R, D, D] and O [R, 1, D], contiguous, in
    the prompt's dtype): (batch MSE [R], diverged [R] bool). A run whose loss is not finite or above ``threshold``
    keeps its weights and is flagged; the others step by ``lr`` [R] (docs/performance.md#native-readout)."""
    lib = library()
    if lib is None or not supports(prompt) or not all(w.is_contiguous() and w.dtype == prompt.dtype for w in weights):
        raise ValueError("native step: no library, or inputs it does not take (check supports() first)")
    B, L, D = prompt.shape
    R = softmax.shape[0]
    flags, frame = _common(prompt, softmax, frame)
    query, target = query.to(prompt.dtype).contiguous(), target.to(prompt.dtype).contiguous()
    lr = lr.to(dtype=prompt.dtype).contiguous()
    loss, diverged = prompt.new_empty(R), torch.empty(R, dtype=torch.uint8, device="cpu")
    code = getattr(lib, SGD_ENTRY[prompt.dtype])(
        prompt.data_ptr(), prompt.stride(0), prompt.stride(2), B, L, D, R, flags.data_ptr(), query.data_ptr(),
        target.data_ptr(), None if frame is None else frame.data_ptr(), *(w.data_ptr() for w in weights),
        lr.data_ptr(), float(threshold), loss.data_ptr(), diverged.data_ptr())
    if code:
        raise ValueError(f"native step: token dimension {D} outside 2…{MAX_DIM}" if code == 1 else "native step: out of memory")
    return loss, diverged.bool()
