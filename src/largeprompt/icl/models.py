"""The §6 one-head attention model with separate Q, K, V, O (docs/theory.md#icl-task).

ŷ = O V Σᵢ pᵢ zᵢ with scores sᵢ = ⟨Q z_q, K zᵢ⟩/√D, and pᵢ = softmax_i(s) (``softmax``) or
pᵢ = sᵢ/L (``linear``: the softmax dropped, scores divided by L).

Efficient step (docs/theory.md#icl-task): sᵢ = zᵢᵀ a with a = U z_q, U = KᵀQ/√D, and the output is
uᵀ Σᵢ pᵢ zᵢ = Σᵢ pᵢ wᵢ with u = VᵀOᵀ and wᵢ = uᵀzᵢ. One product prompt @ [a, u] gives both
sᵢ and wᵢ, so no token is ever projected through Q, K or V.
"""
from __future__ import annotations

import math

import torch

from largeprompt.icl import tilted_readout
from largeprompt.maths.measures import make_measure

MODELS = ("softmax", "linear")
PARAMETER_NAMES = ("Q", "K", "V", "O")


def init_parameters(dim: int, generator: torch.Generator, dtype=torch.float64, device="cpu") -> dict[str, torch.Tensor]:
    """Torch's default ``nn.Linear(bias=False)`` initialisation, drawn from ``generator`` (docs/theory.md#icl-task).

    Each weight is U(−1/√fan_in, 1/√fan_in) (kaiming_uniform with a = √5), in the order Q, K, V, O.
    Softmax and linear runs call this with the same stream, so they start from identical weights.
    """
    shapes = {"Q": (dim, dim), "K": (dim, dim), "V": (dim, dim), "O": (1, dim)}
    params = {}
    for name in PARAMETER_NAMES:
        w = torch.empty(shapes[name], dtype=torch.float64, device="cpu")  # drawn on the host, then moved
        torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator)
        params[name] = w.to(dtype=dtype, device=device)
    return params


def attention_parameters(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, O: torch.Tensor):
    """U = KᵀQ/√D [D, D] and u = VᵀOᵀ [D]: all the model sees of its four weights."""
    U = K.T @ Q / math.sqrt(Q.shape[0])  # [D, D]
    u = (O @ V).reshape(-1)  # [D]
    return U, u


class _TiltedReadout(torch.autograd.Function):
    """ŷ_b = Σᵢ p_bi wᵢ with sᵢ = zᵢᵀa_b, wᵢ = zᵢᵀu, p = softmax(s) or s/L, and its analytic backward: one run of
    :mod:`largeprompt.icl.readout` (the one definition of the readout and its gradient moments). With g = ∂ℓ/∂ŷ,
    ∇a_b = g_b ∂ŷ_b/∂a_b and ∇u = Σ_b g_b ∂ŷ_b/∂u. Checked against autograd through the naive Q/K/V/O model
    (tests/test_training.py)."""

    @staticmethod
    def forward(ctx, a, u, prompt, softmax: bool):
        # a [B, D], u [D], prompt [B, L, D]: one run (R = 1)
        a, u = a.unsqueeze(1), u.unsqueeze(0)
        if not any(ctx.needs_input_grad[:2]):
            if softmax:
                return tilted_readout.softmax_prediction(tilted_readout.softmax_columns(a, u, 1, False), prompt, 1, False)[:, 0]
            return tilted_readout.linear_readout(a, u, tilted_readout.second_moment(prompt))[0][:, 0]
        if softmax:
            prediction, for_a, for_u = tilted_readout.softmax_readout(tilted_readout.softmax_columns(a, u, 1, False), prompt, u, 1, False)
        else:
            prediction, for_a, for_u = tilted_readout.linear_readout(a, u, tilted_readout.second_moment(prompt))
        ctx.save_for_backward(for_a[:, 0], for_u[:, 0])
        return prediction[:, 0]

    @staticmethod
    def backward(ctx, grad_prediction):
        for_a, for_u = ctx.saved_tensors  # [B, D] each
        return grad_prediction.unsqueeze(-1) * for_a, grad_prediction @ for_u, None, None


def readout(query: torch.Tensor, prompt: torch.Tensor, U: torch.Tensor, u: torch.Tensor, model: str) -> torch.Tensor:
    """ŷ = Σᵢ pᵢ uᵀzᵢ from a = U z_q (efficient form, docs/theory.md#icl-task). query [B, D], prompt [B, L, D] → [B]."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; allowed: {', '.join(MODELS)}")
    a = query @ U.T  # [B, D]  a = U z_q
    return _TiltedReadout.apply(a, u, prompt, model == "softmax")


def limit_readout(query: torch.Tensor, beta: torch.Tensor, U: torch.Tensor, u: torch.Tensor, task, model: str) -> torch.Tensor:
    """The L = ∞ output on the task β (docs/theory.md#coupled-limit): softmax uᵀ∇K_β(U z_q), linear uᵀΣ_β U z_q, with
    K_β the CGF of a prompt token z = (x, βᵀx + σε) and Σ_β = ∇²K_β(0) its covariance. query [B, D], beta [B, d] → [B].

    With a = U z_q and t = a_x + a_y β: ∇K_β(a) = (m, βᵀm + a_y σ²), m = ∇K_x(t), which is Λt for Gaussian covariates
    (so softmax and linear agree) and κ'(t) coordinatewise for the bounded measures."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; allowed: {', '.join(MODELS)}")
    a = query @ U.T  # [B, D]
    t = a[:, :-1] + a[:, -1:] * beta  # [B, d]
    if model == "linear" or task.token_measure == "gaussian":
        m = t @ task.covariance.to(dtype=t.dtype, device=t.device)  # Λt (Λ symmetric); Λ = I for the bounded measures
    else:
        m = make_measure(task.token_measure, task.dim, dtype=t.dtype).cgf_grad(t)
    y_part = (beta * m).sum(-1) + a[:, -1] * task.noise_variance  # [B]
    return m @ u[:-1] + u[-1] * y_part


def predict(params: dict[str, torch.Tensor], query: torch.Tensor, prompt: torch.Tensor, model: str) -> torch.Tensor:
    """The §6 model's prediction [B] via U = KᵀQ/√D and the weighted token mean (docs/theory.md#icl-task)."""
    U, u = attention_parameters(params["Q"], params["K"], params["V"], params["O"])
    return readout(query, prompt, U, u, model)


def predict_naive(params: dict[str, torch.Tensor], query: torch.Tensor, prompt: torch.Tensor, model: str) -> torch.Tensor:
    """Reference formulation: project every token through Q, K, V, then O (docs/theory.md#icl-task). Same output as :func:`predict`."""
    Q, K, V, O = (params[n] for n in PARAMETER_NAMES)
    D = query.shape[-1]
    q = query @ Q.T  # [B, D]
    k = prompt @ K.T  # [B, L, D]
    v = prompt @ V.T  # [B, L, D]
    scores = (k @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(D)  # [B, L]
    if model == "softmax":
        weights = torch.softmax(scores, dim=-1)
    else:
        weights = scores / prompt.shape[-2]
    head = (weights.unsqueeze(-2) @ v).squeeze(-2)  # [B, D]
    return (head @ O.T).squeeze(-1)  # [B]


def mse(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The training loss: mean squared error (docs/theory.md#icl-task)."""
    return ((prediction - target) ** 2).mean()


def sgd_update(weights, grads, lr) -> None:
    """Plain SGD, θ ← θ − lr ∇ℓ, in place on each weight: the one update of every trainer (the engine's torch step,
    the reduced model, the coupled L = ∞ runs; the native step is its twin, docs/theory.md#sgd-stability). ``lr``: a
    number, or a tensor broadcast against each weight (per run: [R, 1, 1]), where 0 leaves a weight exactly as it is
    even if its gradient is not finite (a frozen, diverged run)."""
    frozen = lr == 0 if torch.is_tensor(lr) and bool((lr == 0).any()) else None  # checked once, not per weight
    with torch.no_grad():
        for w, g in zip(weights, grads):
            step = lr * g
            if frozen is not None:
                step = torch.where(frozen, torch.zeros((), dtype=step.dtype, device=step.device), step)
            w.sub_(step)


def flatten(params: dict[str, torch.Tensor]) -> torch.Tensor:
    """θ as one vector [4D² − D² + D... ] in the order Q, K, V, O (rows of each weight)."""
    return torch.cat([params[n].reshape(-1) for n in PARAMETER_NAMES])


def unflatten(theta: torch.Tensor, dim: int) -> dict[str, torch.Tensor]:
    """Inverse of :func:`flatten` for token dimension ``dim``."""
    sizes = {"Q": (dim, dim), "K": (dim, dim), "V": (dim, dim), "O": (1, dim)}
    out, start = {}, 0
    for name in PARAMETER_NAMES:
        n = sizes[name][0] * sizes[name][1]
        out[name] = theta[start : start + n].reshape(sizes[name])
        start += n
    return out


def parameter_summaries(params: dict[str, torch.Tensor], dim: int) -> dict[str, float]:
    """Norms logged next to the losses: ‖Q‖, ‖K‖, ‖V‖, ‖O‖ (Frobenius), ‖U‖, ‖U[:d,:d]‖, u_y and ‖u_x‖."""
    with torch.no_grad():
        U, u = attention_parameters(params["Q"], params["K"], params["V"], params["O"])
        d = dim - 1
        out = {f"norm_{n}": float(params[n].norm()) for n in PARAMETER_NAMES}
        out.update(
            norm_U=float(U.norm()),
            norm_U_xx=float(U[:d, :d].norm()),
            u_y=float(u[d]),
            norm_u_x=float(u[:d].norm()),
        )
    return out
