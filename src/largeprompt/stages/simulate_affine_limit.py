"""Rule ``simulate_affine_limit`` (R1): finite-prompt attention along a query ray against its exact limit (docs/experiments.md#affine_limit).

For each token measure μ, prompt p (its own counter-based stream) and nested prompt length L,
T_{μ_L}(t·e) is evaluated at every ray point in one streaming pass; the infinite-prompt value
V ∇K(U t·e) (docs/theory.md#infinite-prompt-operator) is stored next to it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from largeprompt.core.devices import dtype_of, resolve_device
from largeprompt.core.seeding import stream_generator, stream_seed
from largeprompt.io.parquet_io import read_parquet, write_parquet
from largeprompt.io.pipeline import DEFAULT_RUNTIME, settings_from
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress
from largeprompt.maths.attention import infinite_prompt_attention, streaming_prompt_attention
from largeprompt.maths.bands import percentile_bands
from largeprompt.maths.fluctuations import asymptotic_covariance
from largeprompt.maths.leading_terms import ray_coefficient
from largeprompt.maths.measures import make_measure, toeplitz_covariance

BAND_LEVEL = 0.90  # the figure's band over prompts: the 5% and 95% quantiles
COEFFICIENT_MIN_PROMPT_LENGTH = 100  # R1's leading coefficient is fitted over L ≥ 100 (docs/experiments.md#claims)


@dataclass(frozen=True)
class AffineLimitSettings:
    """Config section ``affine_limit`` (the ray itself is in the queries file)."""

    token_measures: list
    gaussian_mean: list
    gaussian_rho: float
    attention_scale: float
    prompt_lengths: list
    n_prompts: int
    chunk_size: int


def affine_limit_measure(name: str, dim: int, cfg: AffineLimitSettings, dtype=torch.float64, device="cpu"):
    """The token measure of panel ``name``: N(m, Toeplitz(ρ)) or unit-variance Rademacher/uniform."""
    if name == "gaussian":
        cov = toeplitz_covariance(dim, cfg.gaussian_rho, dtype=dtype, device=device)
        mean = torch.tensor(cfg.gaussian_mean, dtype=dtype, device=device)
        return make_measure(name, dim, mean=mean, cov=cov, dtype=dtype, device=device)
    return make_measure(name, dim, dtype=dtype, device=device)


def attention_and_value(dim: int, scale: float, dtype=torch.float64, device="cpu"):
    """U = scale·I [D, D] and V = e₁ᵀ [1, D]: the output is the first coordinate of the tilted mean."""
    attention_matrix = scale * torch.eye(dim, dtype=dtype, device=device)
    value_matrix = torch.zeros(1, dim, dtype=dtype, device=device)
    value_matrix[0, 0] = 1.0
    return attention_matrix, value_matrix


def finite_prompt_outputs(query, measure, U, V, lengths, n_prompts, chunk_size, seed, name, device) -> np.ndarray:
    """T_{μ_L} at every query point for each prompt and nested L: [n_prompts, len(lengths), P]."""
    finite = np.empty((n_prompts, len(lengths), query.shape[0]))
    for prompt in progress(range(n_prompts), desc=f"affine_limit {name}"):
        gen = stream_generator(seed, f"affine_limit/{name}", prompt, device=device)
        out = streaming_prompt_attention(query, measure, lengths[-1], U, V, gen, chunk_size, prefix_lengths=lengths)
        finite[prompt] = out[..., 0].cpu().numpy()  # [len(lengths), P]
    return finite


def leading_coefficient_row(name, query, measure, U, V, finite, limit, lengths, seed) -> dict:
    """R1's leading coefficient of one measure (:func:`largeprompt.maths.leading_terms.ray_coefficient`): L·E err²
    against the delta-method variance C(t) at the ray points in the CLT's regime."""
    a = query @ U.T  # [P, D]
    variance = asymptotic_covariance(a, measure, V)[:, 0, 0].cpu().numpy()  # C(t) [P]
    log_rho = (measure.cgf(2 * a) - 2 * measure.cgf(a)).cpu().numpy()  # [P]
    sq = (finite - limit[None, None, :]) ** 2  # [n_prompts, P_L, P]
    rng = np.random.default_rng(stream_seed(seed, f"affine_limit/bootstrap/{name}"))
    fit = ray_coefficient(sq, lengths, variance, log_rho, COEFFICIENT_MIN_PROMPT_LENGTH, rng)
    return {"token_measure": name, "predicted": 1.0, **fit} if fit else {}


def simulate_affine_limit(inputs, outputs, params, rule="simulate_affine_limit", runtime=DEFAULT_RUNTIME):
    """Write results/<run>/affine_limit/outputs.parquet (one row per (measure, L, prompt, point)), bands.parquet
    (one row per (measure, L, point): the mean and 90% band over prompts that the figure draws) and
    leading_coefficients.parquet (one row per measure: R1's leading coefficient against its closed form)."""
    cfg = settings_from(AffineLimitSettings, params["affine_limit"], "affine_limit")
    dtype, device = dtype_of(params["dtype"]), resolve_device(runtime.device)
    queries = read_parquet(inputs["queries"]).sort_values("point")
    coords = [c for c in queries.columns if c.startswith("z")]
    query = torch.tensor(queries[coords].to_numpy(), dtype=dtype, device=device)  # [P, D]
    n_points, dim = query.shape
    lengths = sorted(int(L) for L in cfg.prompt_lengths)
    U, V = attention_and_value(dim, cfg.attention_scale, dtype, device)
    frames, coefficients = [], []
    for name in cfg.token_measures:
        measure = affine_limit_measure(name, dim, cfg, dtype, device)
        limit = infinite_prompt_attention(query, measure, U, V)[:, 0].cpu().numpy()  # [P]
        finite = finite_prompt_outputs(query, measure, U, V, lengths, cfg.n_prompts, cfg.chunk_size, params["seed"],
                                       name, device)
        coefficients.append(leading_coefficient_row(name, query, measure, U, V, finite, limit, lengths, params["seed"]))
        prompt_idx, length_idx, point_idx = np.meshgrid(
            np.arange(cfg.n_prompts), np.arange(len(lengths)), np.arange(n_points), indexing="ij"
        )
        frames.append(pd.DataFrame({
            "token_measure": name,
            "prompt_length": np.asarray(lengths)[length_idx.ravel()],
            "prompt": prompt_idx.ravel(),
            "point": point_idx.ravel(),
            "t": queries["t"].to_numpy()[point_idx.ravel()],
            "finite_prompt_output": finite.ravel(),
            "infinite_prompt_output": limit[point_idx.ravel()],
        }))
    frame = pd.concat(frames, ignore_index=True)
    prov = provenance(rule, params, base_seed=params["seed"], runtime=runtime)
    write_parquet(frame, outputs["outputs"], prov)
    keys = ["token_measure", "prompt_length", "point", "t", "infinite_prompt_output"]
    write_parquet(percentile_bands(frame, keys, "finite_prompt_output", BAND_LEVEL), outputs["bands"], prov)
    write_parquet(pd.DataFrame([r for r in coefficients if r]), outputs["leading_coefficients"], prov)
