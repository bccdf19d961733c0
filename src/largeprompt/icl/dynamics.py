"""Infinite-prompt gradient flows and the reduced model's finite-L SGD (R4, R5; docs/theory.md#full-model-infinite-prompt-risk,
docs/theory.md#balanced-flow, docs/theory.md#reduced-infinite-prompt-risk, docs/theory.md#trajectory-transfer).

Every flow is θ̇ = −∇R(θ) for a closed-form risk R, integrated by scipy's ``solve_ivp`` (LSODA) with
the gradient and Hessian from torch autograd in float64. Training time is t = lr · step, so an SGD run and its
flow share a clock.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch
from scipy.integrate import solve_ivp
from scipy.optimize import brentq

from largeprompt.core.seeding import stream_generator
from largeprompt.icl import models
from largeprompt.icl.full_model_risk import full_model_risk
from largeprompt.icl.risks import reduced_infinite_prompt_risk
from largeprompt.icl.task import RegressionTask


def integrate_flow(gradient: Callable, hessian: Callable, theta0, times, rtol: float = 1e-9, atol: float = 1e-11):
    """Integrate θ̇ = −∇R(θ) from θ0 [P] and return θ at ``times`` [T, P].

    ``gradient`` and ``hessian`` map a float64 vector θ [P] to ∇R [P] and ∇²R [P, P]. LSODA switches to BDF
    where the flow turns stiff (slow valley directions next to fast ones, the drifting flows of
    docs/experiments.md#init_dependence), with −∇²R as its Jacobian. ``rtol``/``atol`` are solve_ivp's local
    error tolerances.
    """
    times = np.asarray(times, dtype=np.float64)
    sol = solve_ivp(lambda _t, y: -gradient(y), (0.0, float(times[-1])), np.asarray(theta0, dtype=np.float64),
                    method="LSODA", jac=lambda _t, y: -hessian(y), t_eval=times, rtol=rtol, atol=atol)
    if not sol.success:
        raise RuntimeError(f"gradient flow failed: {sol.message}")
    return sol.y.T  # [T, P]


def gradient_flow(risk: Callable[[torch.Tensor], torch.Tensor], theta0, times, rtol: float = 1e-9, atol: float = 1e-11):
    """:func:`integrate_flow` for a torch risk θ [P] → scalar (gradient and Hessian by autograd, float64):
    θ at ``times`` [T, P] and R there [T]."""

    def gradient(y):
        theta = torch.tensor(y, dtype=torch.float64, requires_grad=True)
        (grad,) = torch.autograd.grad(risk(theta), theta)
        return grad.numpy()

    def hessian(y):  # vectorised: one batched backward pass, not P of them (and no torch._dynamo import)
        return torch.autograd.functional.hessian(risk, torch.tensor(y, dtype=torch.float64), vectorize=True).numpy()

    thetas = integrate_flow(gradient, hessian, theta0, times, rtol, atol)
    with torch.no_grad():
        risks = np.array([float(risk(torch.tensor(th))) for th in thetas])
    return thetas, risks


# --- the §6 Q/K/V/O model --------------------------------------------------------------------------

def full_model_flow(task: RegressionTask, params0: dict[str, torch.Tensor], times, rtol=1e-9, atol=1e-11, risk=None):
    """Gradient flow on the closed-form R∞(Q, K, V, O) (docs/theory.md#full-model-infinite-prompt-risk) from
    ``params0``, with its exact gradient and Hessian (:mod:`largeprompt.icl.full_model_risk`): (θ [T, P], R∞ [T]).
    ``risk``: another R∞ with the same interface (:func:`largeprompt.icl.bounded_risk.limit_risk`)."""
    risk = full_model_risk(task) if risk is None else risk
    theta0 = models.flatten({k: v.to(torch.float64) for k, v in params0.items()}).numpy()
    thetas = integrate_flow(risk.gradient, risk.solver_hessian, theta0, times, rtol, atol)
    return thetas, risk.value(thetas)


def flow_table(risk, seed: int, times, thetas: np.ndarray, risks: np.ndarray, token_dim: int) -> pd.DataFrame:
    """One row per flow time: R∞, the sharpness (of ``risk.solver_risk()``: the closed form itself, or the coarse rule
    of bounded covariates), det(u_y M_x), the parameter norms and θ as a list (order of :func:`models.flatten`)."""
    frame = pd.DataFrame({"seed": int(seed), "time": times, "infinite_prompt_risk": risks,
                          "sharpness": risk.solver_risk().sharpness(thetas),
                          "readout_determinant": risk.readout_determinant(thetas)})
    summaries = [models.parameter_summaries(models.unflatten(torch.tensor(th), token_dim), token_dim) for th in thetas]
    frame = pd.concat([frame, pd.DataFrame(summaries)], axis=1)
    frame["theta"] = list(thetas)
    return frame


def full_model_gradient_descent(task: RegressionTask, params0: dict[str, torch.Tensor], lr: float, steps,
                                risk=None) -> np.ndarray:
    """θ_k of plain gradient descent θ_{k+1} = θ_k − lr ∇R∞(θ_k) on the closed-form R∞ from ``params0``, at the
    step counts ``steps`` [S] (any order, repeats allowed): [S, P]. Its distance to :func:`full_model_flow` at
    t = lr·k is the Euler error of the step lr, which no prompt length removes (docs/theory.md#euler-floor)."""
    risk = full_model_risk(task) if risk is None else risk
    theta = models.flatten({k: v.to(torch.float64) for k, v in params0.items()}).numpy()
    wanted = np.asarray(steps, dtype=np.int64)
    out = np.empty((len(wanted), theta.size))
    for k in range(int(wanted.max(initial=0)) + 1):
        out[wanted == k] = theta
        theta = theta - lr * risk.gradient(theta)
    return out


def full_model_sharpness(task: RegressionTask, theta) -> np.ndarray:
    """Largest eigenvalue of ∇²R∞ at θ [..., P] (docs/theory.md#sgd-stability): plain SGD with learning rate lr
    can follow the flow only where it is < 2/lr."""
    return full_model_risk(task).sharpness(np.asarray(theta, dtype=np.float64))


# --- R5: the balanced (A, b) flow ------------------------------------------------------------------

def balanced_risk(A: torch.Tensor, b: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """The paper's R∞(A, b) = ½ tr((bΣA − I) Σ (bΣA − I)ᵀ) (docs/theory.md#balanced-flow, paper Thm 5.1; paper A = our Aᵀ, b = v)."""
    R = b * sigma @ A - torch.eye(sigma.shape[0], dtype=sigma.dtype)  # [d, d]
    return 0.5 * torch.trace(R @ sigma @ R.T)


def bayes_point(sigma) -> tuple[float, np.ndarray]:
    """b* = tr(Σ⁻²)^{1/4} and A* = tr(Σ⁻²)^{−1/4} Σ⁻¹ (docs/theory.md#balanced-flow, paper Thm 5.1)."""
    inv = np.linalg.inv(np.asarray(sigma, dtype=np.float64))
    scale = np.trace(inv @ inv) ** 0.25
    return scale, inv / scale


def balanced_flow(sigma, alpha: float, times, rtol=1e-10, atol=1e-12):
    """R5 flow from the balanced start b = ‖A‖_F = α, A = α I/√d: (A [T, d, d], b [T], R [T])."""
    sig = torch.as_tensor(np.asarray(sigma), dtype=torch.float64)
    d = sig.shape[0]

    def risk(theta):
        return balanced_risk(theta[:-1].reshape(d, d), theta[-1], sig)

    theta0 = np.concatenate([(alpha / math.sqrt(d)) * np.eye(d).ravel(), [alpha]])
    thetas, risks = gradient_flow(risk, theta0, times, rtol, atol)
    return thetas[:, :-1].reshape(-1, d, d), thetas[:, -1], risks


# --- the reduced (v, A) model (docs/theory.md#block-sparse-family) ----------------------------------

def reduced_flow(task: RegressionTask, v0: float, A0, times, rtol=1e-10, atol=1e-12):
    """Gradient flow of (v, A) on R∞ = τ² tr((vAΛ − I)ᵀΛ(vAΛ − I)) + σ² (docs/theory.md#reduced-infinite-prompt-risk): (v [T], A [T, d, d], R [T])."""
    d = task.dim

    def risk(theta):
        return reduced_infinite_prompt_risk(task, theta[0], theta[1:].reshape(d, d))

    theta0 = np.concatenate([[v0], np.asarray(A0, dtype=np.float64).ravel()])
    thetas, risks = gradient_flow(risk, theta0, times, rtol, atol)
    return thetas[:, 0], thetas[:, 1:].reshape(-1, d, d), risks


def isotropic_product(p0: float, c: float, d: int, t) -> np.ndarray:
    """p(t) = v(t)a(t) of the isotropic flow (Λ = I, A = aI, τ = 1), in closed form (docs/theory.md#isotropic-flow).

    Ψ(p(t)) = Ψ(p0) + 2t with Ψ(p) = (1/k) ln((c² + 4dp + k√(c² + 4dp²))/|1 − p|), k = √(c² + 4d);
    for c = 0 this is the logistic p = [1 + (1/p0 − 1)e^{−4√d t}]⁻¹ (for p0 < 0, e^{+4√d t}: p → 0⁻).
    """
    t = np.atleast_1d(np.asarray(t, dtype=np.float64))
    k = math.sqrt(c * c + 4 * d)

    def psi(p):
        return math.log((c * c + 4 * d * p + k * math.sqrt(c * c + 4 * d * p * p)) / abs(1.0 - p)) / k

    if p0 == 1.0:
        return np.ones_like(t)
    if c == 0.0:  # ṗ = 4√d |p| (1 − p): logistic, towards 1 if p0 > 0 and towards the saddle 0 if p0 < 0
        if p0 == 0.0:
            return np.zeros_like(t)
        return 1.0 / (1.0 + (1.0 / p0 - 1.0) * np.exp(-math.copysign(4.0 * math.sqrt(d), p0) * t))
    out = np.empty_like(t)
    target0 = psi(p0)
    for i, ti in enumerate(t):
        if ti == 0:
            out[i] = p0
            continue
        goal = target0 + 2.0 * ti
        lo, hi = (p0, 1.0) if p0 < 1 else (1.0, p0)
        f = lambda p, goal=goal: psi(p) - goal  # noqa: E731  Ψ is monotone between p0 and 1
        eps = 1e-15
        a, b = (lo, hi - eps) if p0 < 1 else (lo + eps, hi)
        if f(a) * f(b) > 0:  # p(t) is within 1e-15 of the limit
            out[i] = 1.0
        else:
            out[i] = brentq(f, a, b, xtol=1e-15, rtol=1e-15, maxiter=500)
    return out


def isotropic_flow(v0: float, a0: float, d: int, t):
    """(v(t), a(t)) of the isotropic flow in closed form: v² = ½(c + √(c² + 4dp²)), sign v = sign v0, a = p/v."""
    c = v0 * v0 - d * a0 * a0
    p = isotropic_product(v0 * a0, c, d, t)
    v = math.copysign(1.0, v0) * np.sqrt(0.5 * (c + np.sqrt(c * c + 4 * d * p * p)))
    return v, p / v


def reduced_attention(v: torch.Tensor, A: torch.Tensor):
    """The block-sparse (v, A) point as (U, u): sᵢ = x_qᵀ A xᵢ needs U = diag(Aᵀ, 0); u = v e_D (docs/theory.md#block-sparse-family)."""
    d = A.shape[0]
    U = torch.zeros(d + 1, d + 1, dtype=A.dtype, device=A.device)
    U = U.index_put((torch.arange(d)[:, None], torch.arange(d)[None, :]), A.T)  # [D, D]
    u = torch.cat([torch.zeros(d, dtype=A.dtype, device=A.device), v.reshape(1)])  # [D]
    return U, u


def reduced_model_sgd(task: RegressionTask, v0: float, A0, prompt_length: int, lr: float, steps: int,
                      batch_size: int, base_seed: int, run_seed: int, log_every: int = 1, dtype=torch.float64):
    """Plain SGD of the reduced softmax model ŷ = v Σᵢ softmax(x_qᵀAxᵢ) yᵢ at prompt length L
    (docs/theory.md#trajectory-transfer, docs/experiments.md#trajectory_transfer), and beside it its coupled L = ∞
    counterpart: the same SGD on the L = ∞ readout over the same tasks, queries and targets (docs/theory.md#coupled-limit).

    Batch s comes from stream (base_seed, "reduced/batch", run_seed, L, s). Returns steps [T], v [T], A [T, d, d] and the
    coupled run's v [T], A [T, d, d].
    """
    runs = [(torch.tensor(float(v0), dtype=dtype, requires_grad=True),
             torch.tensor(np.asarray(A0, dtype=np.float64), dtype=dtype, requires_grad=True)) for _ in range(2)]
    logged_steps, logged = [], []
    for step in range(steps + 1):
        if step % log_every == 0 or step == steps:
            logged_steps.append(step)
            logged.append([(float(v.detach()), A.detach().to(torch.float64).numpy().copy()) for v, A in runs])
        if step == steps:
            break
        gen = stream_generator(base_seed, "reduced/batch", run_seed, prompt_length, step)
        query, prompt, target, beta = task.sample_with_tasks(batch_size, prompt_length, gen, dtype=dtype)
        (v, A), (vc, Ac) = runs
        loss = models.mse(models.readout(query, prompt, *reduced_attention(v, A), "softmax"), target)
        loss = loss + models.mse(models.limit_readout(query, beta, *reduced_attention(vc, Ac), task, "softmax"), target)
        models.sgd_update((v, A, vc, Ac), torch.autograd.grad(loss, [v, A, vc, Ac]), lr)
    out = [np.array(logged_steps)]
    for r in range(2):
        out += [np.array([row[r][0] for row in logged]), np.stack([row[r][1] for row in logged])]
    return tuple(out)
