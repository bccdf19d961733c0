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
(:mod:`largeprompt.kernel.native`, docs/performance.md#native-readout) the same sums come from one C pass over
each prompt, and :func:`native_step` does the whole SGD step there. A whitened batch (tokens z = T z') is read
through U' = TᵀU and u' = Tᵀu (docs/experiments.md#whitened-draw).
Checked against autograd through the naive Q/K/V/O model (tests/test_stacked.py, tests/test_native_readout.py).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from largeprompt.icl import models
from largeprompt.kernel import native as native_kernel  # not "native": Plan has a field of that name

LOG2E = 1.0 / math.log(2.0)
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


def _tilts(query, U):
    """a [B, R, D]: a_rb = U_r q_b."""
    R, D, _ = U.shape
    return (query @ U.reshape(R * D, D).T).view(-1, R, D)


def _columns(a, u, S: int, base2: bool):
    """The softmax runs' columns [B, 2S, D]: a_r (times log₂e if ``base2``), then u_r; rows = columns · promptᵀ are
    their scores s_r = prompt a_r and values w_r = prompt u_r, in one batched product."""
    B, _, D = a.shape
    tilt = a[:, :S] * LOG2E if base2 else a[:, :S]
    return torch.cat([tilt, u[:S].expand(B, S, D)], dim=1)


def _exponentiate(rows, S: int, base2: bool = False):
    """In place: the S softmax score rows become e = exp(s − max s) (as 2^(s' − max s') of s' = log₂e·s if
    ``base2``); returns Z = Σᵢ eᵢ [B, S, 1]."""
    scores = rows[:, :S]
    scores.sub_(scores.amax(-1, keepdim=True))
    scores.exp2_() if base2 else scores.exp_()
    return scores.sum(-1, keepdim=True)


def _second_moment(prompt):
    """C = Σᵢ zᵢzᵢᵀ/L [B, D, D]: all that linear runs read from the prompt."""
    return (prompt.mT @ prompt) / prompt.shape[1]


def _linear_readout(a, u, C):
    """Linear runs: ŷ = a·Cu [B, R'], and per unit ∂ℓ/∂ŷ the moments of ∇a (Σ w z/L = Cu) and ∇u (Σ s z/L = Ca)."""
    Cu = (C @ u.T).mT  # [B, R', D]
    return (a * Cu).sum(-1), Cu, a @ C  # C is symmetric


def _softmax_readout(columns, prompt, u, S: int, base2: bool):
    """Softmax runs on one block of prompts: ŷ = u·m [b, S], and per unit ∂ℓ/∂ŷ the moments of ∇a (n − ŷm) and ∇u
    (m)."""
    rows = columns @ prompt.mT  # [b, 2S, L]
    Z = _exponentiate(rows, S, base2)
    rows[:, S:].mul_(rows[:, :S])  # e·w
    moments = (prompt.mT @ rows.mT).mT  # [b, 2S, D]: Σ e z, then Σ e w z (this orientation: 1.7x faster with MKL)
    mean, tilted = moments[:, :S] / Z, moments[:, S:] / Z  # m, n
    prediction = (mean * u).sum(-1)
    return prediction, tilted - prediction.unsqueeze(-1) * mean, mean


def _softmax_prediction(columns, prompt, S: int, base2: bool):
    """Softmax runs on one block of prompts: ŷ = Σ e w / Z [b, S]."""
    rows = columns @ prompt.mT
    Z = _exponentiate(rows, S, base2)
    return (rows[:, :S] * rows[:, S:]).sum(-1) / Z.squeeze(-1)


@dataclass(frozen=True)
class Plan:
    """How a step runs (results change only by round-off): ``block`` prompts at a time, the exponential by exp2 of
    log₂e-scaled scores (``base2``) or by exp, and the softmax runs' readout by torch's products or in one native
    pass (``native``, :mod:`largeprompt.kernel.native`; it also gives the linear runs' C). Chosen per machine by
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
        return native_kernel.readout(prompt, _tilts(query, U), u, stack.softmax, gradients=False)[0].T
    U, u, back, S = _attention_in_order(stack)
    base2 = bool(plan and plan.base2)
    a, out = _tilts(query, U), []
    if S:
        out.append(_blockwise(lambda c, z: _softmax_prediction(c, z, S, base2), _columns(a, u, S, base2), prompt, S, plan))
    if S < U.shape[0]:
        out.append(_linear_readout(a[:, S:], u[S:], _second_moment(prompt))[0])
    prediction = torch.cat(out, dim=1).T  # [R, B], softmax runs first
    return prediction if back is None else prediction[back]


def _readout_gradients(query, prompt, U, u, S: int, plan: Plan | None):
    """a [B, R, D], ŷ [B, R] and, per unit ∂ℓ/∂ŷ, the moments that ∇a and ∇u are made of: [B, R, D] each (module
    doc). Only the softmax runs go through in blocks; the linear runs read C of the whole batch."""
    base2 = bool(plan and plan.base2)
    a, parts = _tilts(query, U), []
    if S:
        parts.append(_blockwise(lambda c, z: _softmax_readout(c, z, u[:S], S, base2), _columns(a, u, S, base2),
                                prompt, S, plan))
    if S < U.shape[0]:
        parts.append(_linear_readout(a[:, S:], u[S:], _second_moment(prompt)))
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
        loss, grad_U, grad_u = native_kernel.loss_and_gradient(prompt, _tilts(query, U), u, stack.softmax, frame, query, target)
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
    """One SGD step of every run in one native call, in place (:func:`largeprompt.kernel.native.sgd_step`): (batch
    MSE [R], diverged [R]), a run whose loss is not finite or above ``threshold`` left where its loss blew up; None
    where the plan or the prompt does not allow it (the caller then steps with :func:`loss_and_gradients`)."""
    weights = [getattr(stack, n) for n in models.PARAMETER_NAMES]
    if not _native(plan, prompt) or not all(w.is_contiguous() and w.dtype == prompt.dtype for w in weights):
        return None
    return native_kernel.sgd_step(prompt, stack.softmax, query, target, frame, weights, lr, threshold)


def sgd_step(stack: RunStack, grads: dict[str, torch.Tensor], lr: torch.Tensor) -> None:
    """θ_r ← θ_r − lr_r ∇ℓ_r in place; ``lr`` [R] (0 freezes a run)."""
    for name in models.PARAMETER_NAMES:
        getattr(stack, name).sub_(lr.view(-1, 1, 1) * grads[name])
