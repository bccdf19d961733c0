"""The §6 one-head attention model with separate Q, K, V, O (SPEC §0, §4, F6).

ŷ = O V Σᵢ pᵢ zᵢ with scores sᵢ = ⟨Q z_q, K zᵢ⟩/√D, and pᵢ = softmax_i(s) (``softmax``) or
pᵢ = sᵢ/L (``linear``: the softmax dropped, scores divided by L).

Efficient step (SPEC §4): sᵢ = zᵢᵀ a with a = U z_q, U = KᵀQ/√D, and the output is
uᵀ Σᵢ pᵢ zᵢ = Σᵢ pᵢ wᵢ with u = VᵀOᵀ and wᵢ = uᵀzᵢ. One product prompt @ [a, u] gives both
sᵢ and wᵢ, so no token is ever projected through Q, K or V.
"""
from __future__ import annotations

import math

import torch

MODELS = ("softmax", "linear")
PARAMETER_NAMES = ("Q", "K", "V", "O")


def init_parameters(dim: int, generator: torch.Generator, dtype=torch.float64, device="cpu") -> dict[str, torch.Tensor]:
    """Torch's default ``nn.Linear(bias=False)`` initialisation, drawn from ``generator`` (SPEC §0).

    Each weight is U(−1/√fan_in, 1/√fan_in) (kaiming_uniform with a = √5), in the order Q, K, V, O.
    Softmax and linear runs call this with the same stream, so they start from identical weights.
    """
    shapes = {"Q": (dim, dim), "K": (dim, dim), "V": (dim, dim), "O": (1, dim)}
    params = {}
    for name in PARAMETER_NAMES:
        w = torch.empty(shapes[name], dtype=torch.float64)
        torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator)
        params[name] = w.to(dtype=dtype, device=device)
    return params


def attention_parameters(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, O: torch.Tensor):
    """U = KᵀQ/√D [D, D] and u = VᵀOᵀ [D]: all the model sees of its four weights."""
    U = K.T @ Q / math.sqrt(Q.shape[0])  # [D, D]
    u = (O @ V).reshape(-1)  # [D]
    return U, u


def readout(query: torch.Tensor, prompt: torch.Tensor, U: torch.Tensor, u: torch.Tensor, model: str) -> torch.Tensor:
    """ŷ = Σᵢ pᵢ uᵀzᵢ from a = U z_q (efficient form, SPEC §4). query [B, D], prompt [B, L, D] → [B]."""
    a = query @ U.T  # [B, D]  a = U z_q
    sw = prompt @ torch.stack([a, u.expand_as(a)], dim=-1)  # [B, L, 2]  (sᵢ, wᵢ)
    scores, values = sw[..., 0], sw[..., 1]  # [B, L], [B, L]
    if model == "softmax":
        weights = torch.softmax(scores, dim=-1)  # [B, L]
    elif model == "linear":
        weights = scores / prompt.shape[-2]  # [B, L]
    else:
        raise ValueError(f"unknown model {model!r}; allowed: {', '.join(MODELS)}")
    return (weights * values).sum(-1)  # [B]


def predict(params: dict[str, torch.Tensor], query: torch.Tensor, prompt: torch.Tensor, model: str) -> torch.Tensor:
    """The §6 model's prediction [B] via U = KᵀQ/√D and the weighted token mean (SPEC §4)."""
    U, u = attention_parameters(params["Q"], params["K"], params["V"], params["O"])
    return readout(query, prompt, U, u, model)


def predict_naive(params: dict[str, torch.Tensor], query: torch.Tensor, prompt: torch.Tensor, model: str) -> torch.Tensor:
    """Reference formulation: project every token through Q, K, V, then O (SPEC §0). Same output as :func:`predict`."""
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
    """The training loss: mean squared error (SPEC §0)."""
    return ((prediction - target) ** 2).mean()


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
