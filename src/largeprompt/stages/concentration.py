"""R2, R3 over random queries: Monte Carlo errors of outputs and gradients, and their rates
(docs/experiments.md#output_concentration, docs/theory.md#random-query-rate).

* :func:`simulate_errors` (one job per token measure and tilt strength c): each repetition draws a
  query z_q ~ N(0, I_D) and one prompt of length L_max, streamed in chunks; every L of the grid is a
  prefix of that prompt. It records ‖T_L − T_∞‖² and the squared Jacobian errors of ∇_U, ∇_V
  (docs/theory.md#jacobians).
* :func:`collect_errors` gathers the jobs into output_errors.parquet and gradient_errors.parquet.
* :func:`estimate_rates` fits exponents, local slopes, the asymptotic constant and the paper's bound form.

Scales (docs/theory.md#random-query-rate): Gaussian tokens N(0, σ² I) with σ² = c and U = I (the paper
varies the token scale σ at fixed U); Rademacher / uniform tokens have unit variance, so U = √c I. V = I_D.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from largeprompt.core.devices import dtype_of, resolve_device
from largeprompt.core.seeding import stream_generator
from largeprompt.io.parquet_io import distinct_keys, read_parquet, write_parquet, write_parquet_parts
from largeprompt.io.pipeline import DEFAULT_RUNTIME, settings_from
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress
from largeprompt.maths.attention import streaming_tilted_moments
from largeprompt.maths.gradients import jacobian_sq_errors
from largeprompt.maths.measures import make_measure
from largeprompt.stages.rate_tables import rate_rows


@dataclass(frozen=True)
class SweepSettings:
    """Config section ``bounds``: the random-query sweep's L grid and Monte Carlo sizes."""

    dim: int
    log2_min_prompt_length: int
    log2_max_prompt_length: int
    points_per_octave: int
    n_repetitions: int
    repetition_block: int
    chunk_size: int


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


def repetition_block_errors(measure, query, attention_matrix, value_matrix, lengths, gen, chunk_size):
    """Squared output, ∇_U and ∇_V errors [R, P] and log ρ(a) [R] of one block of repetitions."""
    tilt = query @ attention_matrix.T  # a = U z_q, [R, D]
    mean_l, cov_l = streaming_tilted_moments(
        tilt, measure, lengths[-1], gen, chunk_size=chunk_size,
        prefix_lengths=lengths, second_moment=True, prompt_batch_shape=(query.shape[0],),
    )  # [P, R, D], [P, R, D, D]
    mean_inf, cov_inf = measure.cgf_grad(tilt), measure.cgf_hess(tilt)  # [R, D], [R, D, D]
    gap = (mean_l - mean_inf) @ value_matrix.T  # T_L − T_∞, [P, R, Dout]
    err_u, err_v = jacobian_sq_errors(mean_l, cov_l, mean_inf, cov_inf, query, value_matrix)  # [P, R]
    kappa = measure.cgf(2 * tilt).sub(2 * measure.cgf(tilt))  # log E w²/(E w)², [R]
    return [x.T.cpu().numpy() for x in ((gap * gap).sum(-1), err_u, err_v)] + [kappa.cpu().numpy()]


def simulate_errors(inputs, outputs, params, rule="simulate_errors", runtime=DEFAULT_RUNTIME):
    """One (measure, c) job: rows (L, repetition) with output and gradient squared errors.

    Column ``kappa`` is log ρ(a) = K(2a) − 2K(a) of the repetition's query (= aᵀSa for Gaussian tokens):
    the effective prompt length is L e^{−kappa}.
    """
    cfg = settings_from(SweepSettings, params["bounds"], "bounds")
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
        q_gen = stream_generator(params["seed"], f"bounds/queries/{name}/c{c:g}", b, device=device)
        p_gen = stream_generator(params["seed"], f"bounds/prompts/{name}/c{c:g}", b, device=device)
        query = torch.randn(r, cfg.dim, generator=q_gen, dtype=dtype, device=device)  # z_q, [R, D]
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
    write_parquet(frame, outputs["result"], provenance(rule, params, base_seed=params["seed"], runtime=runtime))


ERROR_KEYS = ["measure", "c", "sigma_sq", "u", "prompt_length", "repetition", "kappa"]


def collect_errors(inputs, outputs, params, rule="collect_errors"):
    """Concatenate the per-(measure, c) jobs into output_errors.parquet and gradient_errors.parquet, one job's
    table in memory at a time (18 M rows each at paper scale)."""
    jobs, prov = list(inputs["jobs"]), provenance(rule, params)
    for output, values in (("output_errors", ["output_sq_error"]), ("gradient_errors", ["grad_U_sq_error", "grad_V_sq_error"])):
        write_parquet_parts((read_parquet(job, columns=ERROR_KEYS + values) for job in jobs), outputs[output], prov)


@dataclass(frozen=True)
class RateSettings:
    """Config section ``bounds``: the fits' bootstrap and the cells of the paper-form fit."""

    dim: int
    n_bootstrap: int
    ci_level: float
    paper_form_min_c: float


def estimate_rates(inputs, outputs, params, rule="estimate_rates"):
    """Write rates.parquet, one long table; the column ``quantity`` says what a row holds (see
    :func:`largeprompt.stages.rate_tables.rate_rows`). The error tables are read one (measure, c) cell at a
    time: at paper scale they hold 18 M rows each."""
    cfg = settings_from(RateSettings, params["bounds"], "bounds")
    keys = ["measure", "c", "prompt_length", "repetition"]

    def load_cell(name: str, c: float) -> pd.DataFrame:
        cell = [("measure", "==", name), ("c", "==", c)]
        errors = read_parquet(inputs["output_errors"], filters=cell)
        grads = read_parquet(inputs["gradient_errors"], columns=keys + ["grad_U_sq_error", "grad_V_sq_error"],
                             filters=cell)
        return errors.merge(grads, on=keys, validate="one_to_one")

    cells = distinct_keys(inputs["output_errors"], ["measure", "c"])
    out = rate_rows(cells, load_cell, cfg, int(params["seed"]))
    write_parquet(out, outputs["rates"], provenance(rule, params, base_seed=params["seed"]))
