"""Rule ``simulate_concentration_errors`` (R2, R3 over random queries; docs/experiments.md#output_concentration):
one job per (token measure, tilt strength c). Each repetition draws a query z_q ~ N(0, I_D) and one prompt of
length L_max, streamed in chunks; every L of the grid is a prefix of that prompt. It records ‖T_L − T_∞‖² and
the squared Jacobian errors of ∇_U, ∇_V (docs/theory.md#jacobians)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from largeprompt.core.devices import dtype_of, resolve_device
from largeprompt.core.seeding import standard_normal, stream_rng
from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.pipeline import DEFAULT_RUNTIME, settings_from
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress
from largeprompt.maths.concentration import prompt_length_grid, repetition_block_errors, sweep_measure, tilt_scales


@dataclass(frozen=True)
class SweepSettings:
    """Config section ``concentration``: the random-query sweep's L grid and Monte Carlo sizes."""

    dim: int
    log2_min_prompt_length: int
    log2_max_prompt_length: int
    points_per_octave: int
    n_repetitions: int
    repetition_block: int
    chunk_size: int


def simulate_concentration_errors(inputs, outputs, params, rule="simulate_concentration_errors",
                                  runtime=DEFAULT_RUNTIME):
    """One (measure, c) job: rows (L, repetition) with output and gradient squared errors.

    Column ``kappa`` is log ρ(a) = K(2a) − 2K(a) of the repetition's query (= aᵀSa for Gaussian tokens):
    the effective prompt length is L e^{−kappa}.
    """
    cfg = settings_from(SweepSettings, params["concentration"], "concentration")
    dtype, device = dtype_of(params["dtype"]), resolve_device(runtime.device)
    name, c = params["measure"], float(params["c"])
    sigma_sq, u = tilt_scales(name, c)
    measure = sweep_measure(name, cfg.dim, sigma_sq, dtype, device)
    lengths = prompt_length_grid(cfg.log2_min_prompt_length, cfg.log2_max_prompt_length, cfg.points_per_octave)
    attention_matrix = u * torch.eye(cfg.dim, dtype=dtype, device=device)  # U = u·O with O = I
    value_matrix = torch.eye(cfg.dim, dtype=dtype, device=device)  # V = I_D
    blocks = []
    starts = range(0, cfg.n_repetitions, cfg.repetition_block)
    for b, start in enumerate(progress(starts, desc=f"errors {name} c={c:g}")):
        r = min(cfg.repetition_block, cfg.n_repetitions - start)
        q_gen = stream_rng(params["seed"], f"concentration/queries/{name}/c{c:g}", b)
        p_gen = stream_rng(params["seed"], f"concentration/prompts/{name}/c{c:g}", b)  # numpy's ziggurat (theory#token-sampler)
        query = standard_normal((r, cfg.dim), q_gen, dtype, device)  # z_q, [R, D]
        blocks.append(repetition_block_errors(measure, query, attention_matrix, value_matrix, lengths, p_gen,
                                              cfg.chunk_size) + [np.arange(start, start + r)])
    output, grad_u, grad_v, kappa, reps = (np.concatenate(cols) for cols in zip(*blocks))
    n_l = len(lengths)
    frame = pd.DataFrame({
        "measure": name, "c": c, "sigma_sq": sigma_sq, "u": u,
        "prompt_length": np.tile(np.asarray(lengths, dtype=np.int64), len(reps)),
        "repetition": np.repeat(reps, n_l),
        "kappa": np.repeat(kappa, n_l),
        "output_sq_error": output.ravel(),
        "grad_U_sq_error": grad_u.ravel(),
        "grad_V_sq_error": grad_v.ravel(),
    })
    write_parquet(frame, outputs["errors"], provenance(rule, params, base_seed=params["seed"], runtime=runtime))
