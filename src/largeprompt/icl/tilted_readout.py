"""The §6 model's readout and the moments its gradient is made of, for R runs on one batch: the one torch definition
(docs/theory.md#icl-task), used by the single-run model (:func:`largeprompt.icl.models.readout`, with autograd) and
by the training engine's stacked step (:mod:`largeprompt.icl.engine.stacked`); the native step
(:mod:`largeprompt.icl.engine.native_step`) is its accelerated twin, tested equal to it.

Run r reads the tilt a_rb = U_r q_b and the value vector u_r. Softmax runs (the first S of the R): with scores
s = z·a, values w = z·u, e = exp(s − max s), Z = Σᵢ eᵢ, m = Σᵢ eᵢzᵢ/Z and n = Σᵢ eᵢwᵢzᵢ/Z,

    ŷ = u·m,   ∂ŷ/∂a = n − ŷ m,   ∂ŷ/∂u = m;

linear runs read only C = Σᵢ zᵢzᵢᵀ/L: ŷ = a·Cu, ∂ŷ/∂a = Cu, ∂ŷ/∂u = Ca.
"""
from __future__ import annotations

import math

import torch

LOG2E = 1.0 / math.log(2.0)


def tilts(query, U):
    """a [B, R, D]: a_rb = U_r q_b."""
    R, D, _ = U.shape
    return (query @ U.reshape(R * D, D).T).view(-1, R, D)


def softmax_columns(a, u, S: int, base2: bool):
    """The softmax runs' columns [B, 2S, D]: a_r (times log₂e if ``base2``), then u_r; rows = columns · promptᵀ are
    their scores s_r = prompt a_r and values w_r = prompt u_r, in one batched product."""
    B, _, D = a.shape
    tilt = a[:, :S] * LOG2E if base2 else a[:, :S]
    return torch.cat([tilt, u[:S].expand(B, S, D)], dim=1)


def exponentiate(rows, S: int, base2: bool = False):
    """In place: the S softmax score rows become e = exp(s − max s) (as 2^(s' − max s') of s' = log₂e·s if
    ``base2``); returns Z = Σᵢ eᵢ [B, S, 1]."""
    scores = rows[:, :S]
    scores.sub_(scores.amax(-1, keepdim=True))
    scores.exp2_() if base2 else scores.exp_()
    return scores.sum(-1, keepdim=True)


def second_moment(prompt):
    """C = Σᵢ zᵢzᵢᵀ/L [B, D, D]: all that linear runs read from the prompt."""
    return (prompt.mT @ prompt) / prompt.shape[1]


def linear_readout(a, u, C):
    """Linear runs: ŷ = a·Cu [B, R'], and per unit ∂ℓ/∂ŷ the moments of ∇a (Σ w z/L = Cu) and ∇u (Σ s z/L = Ca)."""
    Cu = (C @ u.T).mT  # [B, R', D]
    return (a * Cu).sum(-1), Cu, a @ C  # C is symmetric


def softmax_readout(columns, prompt, u, S: int, base2: bool):
    """Softmax runs on one block of prompts: ŷ = u·m [b, S], and per unit ∂ℓ/∂ŷ the moments of ∇a (n − ŷm) and ∇u
    (m)."""
    rows = columns @ prompt.mT  # [b, 2S, L]
    Z = exponentiate(rows, S, base2)
    rows[:, S:].mul_(rows[:, :S])  # e·w
    moments = (prompt.mT @ rows.mT).mT  # [b, 2S, D]: Σ e z, then Σ e w z (this orientation: 1.7x faster with MKL)
    mean, tilted = moments[:, :S] / Z, moments[:, S:] / Z  # m, n
    prediction = (mean * u).sum(-1)
    return prediction, tilted - prediction.unsqueeze(-1) * mean, mean


def softmax_prediction(columns, prompt, S: int, base2: bool):
    """Softmax runs on one block of prompts: ŷ = Σ e w / Z [b, S]."""
    rows = columns @ prompt.mT
    Z = exponentiate(rows, S, base2)
    return (rows[:, :S] * rows[:, S:]).sum(-1) / Z.squeeze(-1)
