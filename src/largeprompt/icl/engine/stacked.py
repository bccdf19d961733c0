"""Many training runs of the §6 model as one stack: forward, analytic gradient and plain SGD step.

The runs share each batch (common random numbers): R runs, each with its own Q, K, V [D, D] and O [1, D],
see the same query [B, D], prompt [B, L, D] and target [B]. Run r predicts

    ŷ_rb = Σᵢ p_rbi w_rbi,   s_rbi = zᵇᵢ·a_rb,  a_rb = U_r q_b,  U_r = K_rᵀQ_r/√D,
                           w_rbi = zᵇᵢ·u_r,    u_r = V_rᵀO_rᵀ,

with p = softmax_i(s) (``softmax``) or s/L (``linear``) (docs/theory.md#full-model-infinite-prompt-risk).
A step makes two passes over the prompt whatever R is (docs/experiments.md#training-protocol). Softmax runs:
one batched product rows @ promptᵀ gives their scores and values as rows [B, 2S, L] (contiguous in i), and
one product of those rows, re-weighted in place, with the prompt gives their moments. Linear runs are
quadratic in the prompt: all they read from it is C = Σᵢ zᵢzᵢᵀ/L [B, D, D], one product for any number of them.

  softmax: with e = exp(s − max s), Z = Σᵢ eᵢ, m = Σᵢ eᵢzᵢ/Z and n = Σᵢ eᵢwᵢzᵢ/Z:
           ŷ = u·m,  ∇a_rb = g_rb (n − ŷ m),  ∇u_r = Σ_b g_rb m;
  linear:  Σᵢ wᵢzᵢ/L = C u,  Σᵢ sᵢzᵢ/L = C a:  ŷ = a·Cu,  ∇a_rb = g_rb Cu,  ∇u_r = Σ_b g_rb C a,

g_rb = ∂ℓ_r/∂ŷ_rb; then ∇U_r = Σ_b ∇a_rb q_bᵀ, ∇Q = K∇U/√D, ∇K = Q∇Uᵀ/√D, ∇V = Oᵀ∇uᵀ, ∇O = (V∇u)ᵀ.
A marginal linear run costs O(B D²) per step, a marginal softmax run two rows and three elementwise passes
(max, exp, e·w). The softmax rows go through in blocks of prompts (a :class:`Plan`, tuned per machine by
:mod:`largeprompt.icl.engine.tuning`, capped by BLOCK_ELEMENTS), so that they stay in cache and memory stays
bounded; everything else is computed once for the whole batch. Where the plan says ``readout=native``
(:mod:`largeprompt.icl.engine.native_step`, docs/performance.md#native-readout) the same sums come from one C pass over
each prompt, and :func:`native_step` does the whole SGD step there. A whitened batch (tokens z = T z') is read
through U' = TᵀU and u' = Tᵀu (docs/experiments.md#whitened-draw).
Checked against autograd through the naive Q/K/V/O model (tests/test_stacked.py, tests/test_native_readout.py).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from largeprompt.icl import models, tilted_readout
from largeprompt.icl.engine import native_step as native_kernel  # not "native": Plan has a field of that name

BLOCK_ELEMENTS = 1 << 22  # the rows of one block of prompts, [block, 2R, L], hold at most this many numbers


@dataclass
class RunStack:
    """The weights of R runs [R, …] and which of them use softmax (the rest are linear)."""

    Q: torch.Tensor  # [R, D, D]
    K: torch.Tensor  # [R, D, D]
    V: torch.Tensor  # [R, D, D]
    O: torch.Tensor  # [R, 1, D]
    softmax: torch.Tensor  # [R] bool

    @classmethod
    def from_parameters(cls, runs: list[dict[str, torch.Tensor]], softmax: list[bool]) -> RunStack:
        stack = {n: torch.stack([p[n] for p in runs]) for n in models.PARAMETER_NAMES}
        return cls(**stack, softmax=torch.tensor(softmax, dtype=torch.bool, device=stack["Q"].device))

    def run(self, r: int) -> dict[str, torch.Tensor]:
        return {n: getattr(self, n)[r] for n in models.PARAMETER_NAMES}

    def select(self, index: torch.Tensor) -> RunStack:
        return RunStack(self.Q[index], self.K[index], self.V[index], self.O[index], self.softmax[index])

    def attention(self):
        """U [R, D, D] and u [R, D]."""
        D = self.Q.shape[-1]
        return self.K.mT @ self.Q / math.sqrt(D), (self.O @ self.V).squeeze(-2)


@functools.lru_cache(maxsize=64)
def _order(flags: tuple[bool, ...], device: torch.device):
    """(order, back, S): run indices with the softmax runs first (stack order kept within each group), the inverse
    permutation and the number S of softmax runs; order and back are None when the softmax runs already come first."""
    order = [r for r, soft in enumerate(flags) if soft] + [r for r, soft in enumerate(flags) if not soft]
    if order == list(range(len(flags))):
        return None, None, sum(flags)
    order = torch.tensor(order, device=device)
    return order, torch.argsort(order), sum(flags)


def _attention_in_order(stack: RunStack):
    """U [R, D, D], u [R, D] with the softmax runs first, the inverse permutation (or None) and S."""
    order, back, S = _order(tuple(stack.softmax.tolist()), stack.Q.device)
    U, u = stack.attention()
    return (U, u, back, S) if order is None else (U[order], u[order], back, S)


@dataclass(frozen=True)
class Plan:
    """How a step runs (results change only by round-off): ``block`` prompts at a time, the exponential by exp2 of
    log₂e-scaled scores (``base2``) or by exp, and the softmax runs' readout by torch's products or in one native
    pass (``native``, :mod:`largeprompt.icl.engine.native_step`; it also gives the linear runs' C). Chosen per machine by
    :mod:`largeprompt.icl.engine.tuning`; written ``block=32,exp=2`` or ``block=128,exp=2,readout=native``."""

    block: int
    base2: bool = False
    native: bool = False

    def __str__(self) -> str:
        return f"block={self.block},exp={'2' if self.base2 else 'e'}" + (",readout=native" if self.native else "")

    @classmethod
    def parse(cls, text: str) -> Plan:
        fields = dict(part.strip().partition("=")[::2] for part in text.split(",") if part.strip())
        block, base, readout = fields.get("block", ""), fields.get("exp", "e"), fields.get("readout", "torch")
        if (set(fields) - {"block", "exp", "readout"} or not block.isdigit() or int(block) < 1 or base not in ("e", "2")
                or readout not in ("torch", "native")):
            raise ValueError(f"training plan {text!r}: expected block=<positive integer>,exp=e|2[,readout=torch|native]")
        return cls(int(block), base == "2", readout == "native")


def default_plan(n_softmax: int, prompt_length: int, dim: int) -> Plan:
    """The whole batch in blocks whose softmax rows [block, 2S, L] hold at most BLOCK_ELEMENTS numbers, base e (the
    linear runs read C of the whole batch: never blocked)."""
    return Plan(max(1, BLOCK_ELEMENTS // (2 * max(1, n_softmax) * max(1, prompt_length))))


def _block_size(plan: Plan | None, n_softmax: int, prompt_length: int, dim: int) -> int:
    """``plan``'s block, capped so that a block's rows never exceed BLOCK_ELEMENTS (memory)."""
    cap = default_plan(n_softmax, prompt_length, dim).block
    return cap if plan is None else min(plan.block, cap)


def _blocks(batch: int, size: int):
    """Slices of ``size`` prompts covering the batch."""
    return [slice(start, start + size) for start in range(0, batch, size)]


def _blockwise(fn, columns, prompt, S: int, plan: Plan | None):
    """``fn(columns, prompt, S, …)`` of the softmax runs over the batch in blocks of prompts (the plan's, capped by
    memory), its outputs concatenated along the batch."""
    B, L, D = prompt.shape
    size = _block_size(plan, S, L, D)
    outs = [fn(columns[rows_of], prompt[rows_of]) for rows_of in _blocks(B, size)]
    if len(outs) == 1:
        return outs[0]
    return torch.cat(outs) if isinstance(outs[0], torch.Tensor) else tuple(torch.cat(x) for x in zip(*outs))


def _native(plan: Plan | None, prompt) -> bool:
    """Whether this step's softmax readout runs natively (the plan says so and the prompt's layout allows it)."""
    return bool(plan and plan.native) and native_kernel.supports(prompt) and native_kernel.library() is not None


def predict(stack: RunStack, query, prompt, plan: Plan | None = None) -> torch.Tensor:
    """ŷ [R, B] of every run on one batch (the softmax runs' rows in blocks of prompts: a large test set fits)."""
    if _native(plan, prompt):
        U, u = stack.attention()
        return native_kernel.readout(prompt, tilted_readout.tilts(query, U), u, stack.softmax, gradients=False)[0].T
    U, u, back, S = _attention_in_order(stack)
    base2 = bool(plan and plan.base2)
    a, out = tilted_readout.tilts(query, U), []
    if S:
        columns = tilted_readout.softmax_columns(a, u, S, base2)
        out.append(_blockwise(lambda c, z: tilted_readout.softmax_prediction(c, z, S, base2), columns, prompt, S, plan))
    if S < U.shape[0]:
        out.append(tilted_readout.linear_readout(a[:, S:], u[S:], tilted_readout.second_moment(prompt))[0])
    prediction = torch.cat(out, dim=1).T  # [R, B], softmax runs first
    return prediction if back is None else prediction[back]


def _readout_gradients(query, prompt, U, u, S: int, plan: Plan | None):
    """a [B, R, D], ŷ [B, R] and, per unit ∂ℓ/∂ŷ, the moments that ∇a and ∇u are made of: [B, R, D] each (module
    doc). Only the softmax runs go through in blocks; the linear runs read C of the whole batch."""
    base2 = bool(plan and plan.base2)
    a, parts = tilted_readout.tilts(query, U), []
    if S:
        parts.append(_blockwise(lambda c, z: tilted_readout.softmax_readout(c, z, u[:S], S, base2), tilted_readout.softmax_columns(a, u, S, base2),
                                prompt, S, plan))
    if S < U.shape[0]:
        parts.append(tilted_readout.linear_readout(a[:, S:], u[S:], tilted_readout.second_moment(prompt)))
    if len(parts) == 1:
        return parts[0]
    return tuple(torch.cat(x, dim=1) for x in zip(*parts))


def _step_readout(stack: RunStack, query, prompt, plan: Plan | None, frame):
    """ŷ [B, R] and, per unit ∂ℓ/∂ŷ, the ∇a and ∇u moments [B, R, D] of every run, in stack order and in the true
    frame, by torch's products on the softmax-first order, mapped back (the native plan sums them in C)."""
    U, u, back, S = _attention_in_order(stack)
    if frame is not None:
        U, u = frame.mT @ U, u @ frame
    prediction, for_a, for_u = _readout_gradients(query, prompt, U, u, S, plan)
    if frame is not None:  # the moments of z' = T⁻¹z: T times them, row by row
        for_a, for_u = for_a @ frame.mT, for_u @ frame.mT
    if back is not None:  # back to the stack's order
        prediction, for_a, for_u = prediction[:, back], for_a[:, back], for_u[:, back]
    return prediction, for_a, for_u


def _batch_sums(query, target, prediction, for_a, for_u):
    """Every run's batch MSE [R], ∇U = Σ_b g_rb ∇a_rb q_bᵀ/√D [R, D, D] and ∇u = Σ_b g_rb ∇u_rb [R, D], g = ∂ℓ/∂ŷ."""
    B, R, D = for_a.shape
    residual = prediction - target.unsqueeze(-1)  # [B, R]
    g = ((2.0 / B) * residual).unsqueeze(-1)  # ∂ℓ/∂ŷ, [B, R, 1]
    loss = (residual * residual).mean(0)  # [R]
    grad_U = ((for_a * g).reshape(B, R * D).T @ query).view(R, D, D) / math.sqrt(D)
    return loss, grad_U, (for_u * g).sum(0)


def loss_and_gradients(stack: RunStack, query, prompt, target, plan: Plan | None = None, frame=None):
    """Every run's batch MSE [R] and its gradient in Q, K, V, O (each [R, …]), analytically (``plan``: how, not what).

    ``frame`` T [D, D]: the prompt is given whitened, its tokens z = T z' (a whitened draw). Scores and values
    read z·a = z'·Tᵀa, so the readout runs on U' = TᵀU and u' = Tᵀu, and the moments of z' it gives are T⁻¹ times
    those of z (docs/experiments.md#whitened-draw)."""
    if _native(plan, prompt):  # the batch's sums in the same native call
        U, u = stack.attention()
        loss, grad_U, grad_u = native_kernel.loss_and_gradient(prompt, tilted_readout.tilts(query, U), u, stack.softmax, frame, query, target)
    else:
        loss, grad_U, grad_u = _batch_sums(query, target, *_step_readout(stack, query, prompt, plan, frame))
    grads = {
        "Q": stack.K @ grad_U,
        "K": stack.Q @ grad_U.mT,
        "V": stack.O.mT * grad_u.unsqueeze(-2),  # Oᵀ ∇uᵀ, [R, D, D]
        "O": (stack.V @ grad_u.unsqueeze(-1)).mT,  # (V ∇u)ᵀ, [R, 1, D]
    }
    return loss, grads


def native_step(stack: RunStack, query, prompt, target, lr: torch.Tensor, threshold: float, frame=None, plan=None):
    """One SGD step of every run in one native call, in place (:func:`largeprompt.icl.engine.native_step.sgd_step`): (batch
    MSE [R], diverged [R]), a run whose loss is not finite or above ``threshold`` left where its loss blew up; None
    where the plan or the prompt does not allow it (the caller then steps with :func:`loss_and_gradients`)."""
    weights = [getattr(stack, n) for n in models.PARAMETER_NAMES]
    if not _native(plan, prompt) or not all(w.is_contiguous() and w.dtype == prompt.dtype for w in weights):
        return None
    return native_kernel.sgd_step(prompt, stack.softmax, query, target, frame, weights, lr, threshold)


def sgd_step(stack: RunStack, grads: dict[str, torch.Tensor], lr: torch.Tensor) -> None:
    """θ_r ← θ_r − lr_r ∇ℓ_r in place (:func:`largeprompt.icl.models.sgd_update`); ``lr`` [R] (0 freezes a run, even
    where its gradient is not finite)."""
    models.sgd_update([getattr(stack, n) for n in models.PARAMETER_NAMES], [grads[n] for n in models.PARAMETER_NAMES],
                      lr.view(-1, 1, 1))
