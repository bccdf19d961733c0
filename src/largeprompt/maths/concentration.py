"""The random-query concentration sweep of R2 and R3 (docs/experiments.md#output_concentration,
docs/theory.md#random-query-rate): its L grid, its scales and one block of repetitions.

Scales (docs/theory.md#random-query-rate): Gaussian tokens N(0, σ² I) with σ² = c and U = I (the paper
varies the token scale σ at fixed U); Rademacher / uniform tokens have unit variance, so U = √c I. V = I_D.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from largeprompt.maths.attention import streaming_tilted_moments
from largeprompt.maths.gradients import jacobian_sq_errors
from largeprompt.maths.measures import make_measure

ERROR_KEYS = ["token_measure", "c", "sigma_sq", "u", "prompt_length", "repetition", "kappa"]  # the keys of an error row


def prompt_length_grid(log2_min: int, log2_max: int, points_per_octave: int = 1) -> list[int]:
    """Log-spaced integer prompt lengths round(2^{k/points_per_octave}) from 2^log2_min to 2^log2_max."""
    if log2_max - log2_min < 2:
        raise ValueError(
            f"config keys log2_min_prompt_length = {log2_min} and log2_max_prompt_length = {log2_max}: "
            "the L grid needs log2_max_prompt_length ≥ log2_min_prompt_length + 2 to fit a rate"
        )
    steps = np.arange(log2_min * points_per_octave, log2_max * points_per_octave + 1)
    return sorted({int(round(2.0 ** (k / points_per_octave))) for k in steps})


def tilt_scales(measure_name: str, c: float) -> tuple[float, float]:
    """(σ², u) with c = σ² u²: Gaussian varies σ² = c at u = 1, the others u = √c at σ = 1."""
    if measure_name == "gaussian":
        return float(c), 1.0
    return 1.0, math.sqrt(c)


def sweep_measure(measure_name: str, dim: int, sigma_sq: float, dtype, device):
    """The token measure of the sweep: N(0, σ² I_D), or unit-variance Rademacher / uniform."""
    cov = sigma_sq * torch.eye(dim, dtype=dtype, device=device) if measure_name == "gaussian" else None
    return make_measure(measure_name, dim, cov=cov, dtype=dtype, device=device)


def repetition_block_errors(measure_name: str, dim: int, c_values, query, lengths, gen, chunk_size):
    """One block of repetitions at every tilt strength c at once (docs/theory.md#token-sampler): each repetition's
    query z_q [R, D] and one prompt of standardised tokens g (N(0, I) or unit-variance Rademacher / uniform),
    shared by every c. A token of scale σ is z = σ g and U = u·I, so the weights e^{⟨U z_q, z⟩} are e^{⟨σ u z_q, g⟩}:
    the tilted moments of g at the tilts σ_c u_c z_q [R, C, D], one pass over the prompt for all C tilts, give
    T_L = σ ḡ and Σ̂ = σ² Σ̂_g at every c (V = I_D). Returns the squared output, ∇_U and ∇_V errors [C, R, P] and
    log ρ(a) = K(2a) − 2K(a) [C, R]."""
    dtype, device = query.dtype, query.device
    scales = [tilt_scales(measure_name, c) for c in c_values]  # (σ², u) per c
    tilts = torch.stack([math.sqrt(s2) * u * query for s2, u in scales], dim=1)  # [R, C, D]
    base = sweep_measure(measure_name, dim, 1.0, dtype, device)  # the standardised tokens g
    mean_g, cov_g = streaming_tilted_moments(
        tilts, base, lengths[-1], gen, chunk_size=chunk_size, prefix_lengths=lengths, second_moment=True,
        prompt_batch_shape=(query.shape[0],),
    )  # [P, R, C, D], [P, R, C, D, D]
    value_matrix = torch.eye(dim, dtype=dtype, device=device)
    out, kappas = [], []
    for k, (sigma_sq, u) in enumerate(scales):
        measure = sweep_measure(measure_name, dim, sigma_sq, dtype, device)
        tilt = u * query  # a = U z_q, [R, D]
        mean_l, cov_l = math.sqrt(sigma_sq) * mean_g[:, :, k], sigma_sq * cov_g[:, :, k]  # moments of z = σ g
        mean_inf, cov_inf = measure.cgf_grad(tilt), measure.cgf_hess(tilt)  # [R, D], [R, D, D]
        gap = mean_l - mean_inf  # T_L − T_∞ (V = I), [P, R, D]
        err_u, err_v = jacobian_sq_errors(mean_l, cov_l, mean_inf, cov_inf, query, value_matrix)  # [P, R]
        out.append([x.T.cpu().numpy() for x in ((gap * gap).sum(-1), err_u, err_v)])
        kappas.append(measure.cgf(2 * tilt).sub(2 * measure.cgf(tilt)).cpu().numpy())  # log E w²/(E w)², [R]
    output, grad_u, grad_v = (np.stack(cols) for cols in zip(*out))
    return output, grad_u, grad_v, np.stack(kappas)
