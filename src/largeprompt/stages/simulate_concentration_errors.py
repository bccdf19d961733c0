"""Rule ``simulate_concentration_errors`` (R2, R3 over random queries; docs/experiments.md#output_concentration):
one job per token measure, every tilt strength c on the same draws. Each repetition draws a query z_q ~ N(0, I_D)
and one prompt of length L_max, streamed in chunks; every L of the grid is a prefix of that prompt. It records
‖T_L − T_∞‖² and the squared Jacobian errors of ∇_U, ∇_V (docs/theory.md#jacobians)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from largeprompt.core.devices import dtype_of, resolve_device
from largeprompt.core.seeding import standard_normal, stream_rng
from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.pipeline import DEFAULT_RUNTIME, settings_from
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress
from largeprompt.maths.concentration import prompt_length_grid, repetition_block_errors, tilt_scales


@dataclass(frozen=True)
class SweepSettings:
    """Config section ``concentration``: the random-query sweep's L grid and Monte Carlo sizes."""

    dim: int
    c_values: list
    log2_min_prompt_length: int
    log2_max_prompt_length: int
    points_per_octave: int
    n_repetitions: int
    repetition_block: int
    chunk_size: int


def simulate_concentration_errors(inputs, outputs, params, rule="simulate_concentration_errors",
                                  runtime=DEFAULT_RUNTIME):
    """One token measure at every c: rows (c, L, repetition) with output and gradient squared errors.

    Each repetition's query and prompt are shared by every c (common random numbers; the law at each c is unchanged,
    docs/theory.md#token-sampler). Column ``kappa`` is log ρ(a) = K(2a) − 2K(a) of the repetition's query at that c
    (= aᵀSa for Gaussian tokens): the effective prompt length is L e^{−kappa}.
    """
    cfg = settings_from(SweepSettings, params["concentration"], "concentration")
    dtype, device = dtype_of(params["dtype"]), resolve_device(runtime.device)
    name, c_values = params["token_measure"], [float(c) for c in cfg.c_values]
    lengths = prompt_length_grid(cfg.log2_min_prompt_length, cfg.log2_max_prompt_length, cfg.points_per_octave)
    blocks = []
    starts = range(0, cfg.n_repetitions, cfg.repetition_block)
    for b, start in enumerate(progress(starts, desc=f"errors {name} at {len(c_values)} c")):
        r = min(cfg.repetition_block, cfg.n_repetitions - start)
        q_gen = stream_rng(params["seed"], f"concentration/queries/{name}", b)
        p_gen = stream_rng(params["seed"], f"concentration/prompts/{name}", b)  # numpy's ziggurat (theory#token-sampler)
        query = standard_normal((r, cfg.dim), q_gen, dtype, device)  # z_q, [R, D]
        blocks.append(repetition_block_errors(name, cfg.dim, c_values, query, lengths, p_gen, cfg.chunk_size))
    output, grad_u, grad_v, kappa = (np.concatenate(cols, axis=1) for cols in zip(*blocks))  # [C, R, P], [C, R]
    n_c, n_r, n_l = output.shape
    scales = np.array([tilt_scales(name, c) for c in c_values])  # [C, 2]
    frame = pd.DataFrame({
        "token_measure": name,
        "c": np.repeat(c_values, n_r * n_l),
        "sigma_sq": np.repeat(scales[:, 0], n_r * n_l),
        "u": np.repeat(scales[:, 1], n_r * n_l),
        "prompt_length": np.tile(np.asarray(lengths, dtype=np.int64), n_c * n_r),
        "repetition": np.tile(np.repeat(np.arange(n_r), n_l), n_c),
        "kappa": np.repeat(kappa.ravel(), n_l),
        "output_sq_error": output.ravel(),
        "grad_U_sq_error": grad_u.ravel(),
        "grad_V_sq_error": grad_v.ravel(),
    })
    write_parquet(frame, outputs["errors"], provenance(rule, params, base_seed=params["seed"], runtime=runtime))
