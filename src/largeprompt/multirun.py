"""Many training runs of the §6 model as one stack: forward, analytic gradient and plain SGD step.

The runs share each batch (common random numbers): R runs, each with its own Q, K, V [D, D] and O [1, D],
see the same query [B, D], prompt [B, L, D] and target [B]. Run r predicts

    ŷ_rb = Σᵢ p_rbi w_rbi,   s_rbi = zᵇᵢ·a_rb,  a_rb = U_r q_b,  U_r = K_rᵀQ_r/√D,
                           w_rbi = zᵇᵢ·u_r,    u_r = V_rᵀO_rᵀ,

with p = softmax_i(s) (``softmax``) or s/L (``linear``) (docs/theory.md#full-model-infinite-prompt-risk).
One batched product prompt @ [a_r…, u_r…] gives every run's scores and values, and one more gives every
gradient, so a step costs two passes over the prompt whatever R is (docs/experiments.md#training-protocol).
Gradients of the mean squared error, with g_rb = ∂ℓ_r/∂ŷ_rb:
  softmax: ∇a_rb = g_rb Σᵢ p_rbi (w_rbi − ŷ_rb) zᵢ,  ∇u_r = Σ_b g_rb Σᵢ p_rbi zᵢ;
  linear:  ∇a_rb = g_rb Σᵢ w_rbi zᵢ / L,             ∇u_r = Σ_b g_rb Σᵢ s_rbi zᵢ / L;
then ∇U_r = Σ_b ∇a_rb q_bᵀ, ∇Q = K∇U/√D, ∇K = Q∇Uᵀ/√D, ∇V = Oᵀ∇uᵀ, ∇O = (V∇u)ᵀ.
Checked against autograd through the naive Q/K/V/O model (tests/test_multirun.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import models


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


def _scores_and_values(query, prompt, U, u):
    """s, w [B, L, R]: every run's scores and values from one batched product over the prompt."""
    a = torch.einsum("rij,bj->bir", U, query)  # [B, D, R]
    columns = torch.cat([a, u.T.unsqueeze(0).expand(query.shape[0], -1, -1)], dim=-1)  # [B, D, 2R]
    sw = prompt @ columns  # [B, L, 2R]
    R = U.shape[0]
    return sw[..., :R], sw[..., R:]


def _weights(scores, softmax, prompt_length: int):
    """p [B, L, R]: softmax over the prompt for softmax runs, s/L for linear runs."""
    soft = torch.softmax(scores, dim=1)
    return torch.where(softmax, soft, scores / prompt_length)


def predict(stack: RunStack, query, prompt) -> torch.Tensor:
    """ŷ [R, B] of every run on one batch."""
    U, u = stack.attention()
    scores, values = _scores_and_values(query, prompt, U, u)
    weights = _weights(scores, stack.softmax, prompt.shape[1])
    return (weights * values).sum(1).T


def loss_and_gradients(stack: RunStack, query, prompt, target):
    """Every run's batch MSE [R] and its gradient in Q, K, V, O (each [R, …]), analytically."""
    B, L, D = prompt.shape
    U, u = stack.attention()
    scores, values = _scores_and_values(query, prompt, U, u)  # [B, L, R]
    weights = _weights(scores, stack.softmax, L)
    prediction = (weights * values).sum(1)  # [B, R]
    residual = prediction - target.unsqueeze(-1)  # [B, R]
    loss = (residual * residual).mean(0)  # [R]
    g = (2.0 / B) * residual.unsqueeze(1)  # ∂ℓ/∂ŷ, [B, 1, R]
    soft = stack.softmax
    mix_a = torch.where(soft, weights * (values - prediction.unsqueeze(1)), values / L) * g  # [B, L, R]
    mix_u = torch.where(soft, weights, scores / L) * g  # [B, L, R]
    moments = prompt.mT @ torch.cat([mix_a, mix_u], dim=-1)  # [B, D, 2R]
    R = U.shape[0]
    grad_a, grad_u = moments[..., :R], moments[..., R:].sum(0).T  # [B, D, R], [R, D]
    grad_U = torch.einsum("bir,bj->rij", grad_a, query) / math.sqrt(D)  # ∇U/√D, [R, D, D]
    grads = {
        "Q": stack.K @ grad_U,
        "K": stack.Q @ grad_U.mT,
        "V": stack.O.mT * grad_u.unsqueeze(-2),  # Oᵀ ∇uᵀ, [R, D, D]
        "O": (stack.V @ grad_u.unsqueeze(-1)).mT,  # (V ∇u)ᵀ, [R, 1, D]
    }
    return loss, grads


def sgd_step(stack: RunStack, grads: dict[str, torch.Tensor], lr: torch.Tensor) -> None:
    """θ_r ← θ_r − lr_r ∇ℓ_r in place; ``lr`` [R] (0 freezes a run)."""
    for name in models.PARAMETER_NAMES:
        getattr(stack, name).sub_(lr.view(-1, 1, 1) * grads[name])
