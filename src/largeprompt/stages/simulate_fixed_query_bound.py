"""Rule ``simulate_fixed_query_bound`` (R2 at fixed queries; docs/experiments.md#fixed_query_bound): per κ, the
errors ‖T_L − T_∞‖ of n_repetitions prompts, streamed in blocks, and the rows of :mod:`largeprompt.maths.fixed_query`
(empirical quantiles against the δ-method prediction and the rigorous bound)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from largeprompt.core.devices import dtype_of, resolve_device
from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.pipeline import DEFAULT_RUNTIME, settings_from
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress
from largeprompt.maths.concentration import prompt_length_grid
from largeprompt.maths.fixed_query import FixedQuery, kappa_rows


@dataclass(frozen=True)
class FixedQuerySettings:
    """Config section ``fixed_query_bound``."""

    kappas: list
    rho: float
    dim: int
    log2_min_prompt_length: int
    log2_max_prompt_length: int
    n_repetitions: int
    repetition_block: int
    deltas: list
    n_limit_law_draws: int
    chunk_size: int
    ci_level: float


def sorted_errors(cfg: FixedQuerySettings, setup: FixedQuery, lengths, seed) -> np.ndarray:
    """‖T_L − T_∞‖ of every prompt at every L, sorted per L: [R, P] (blocks of repetitions, with a progress bar)."""
    starts = range(0, cfg.n_repetitions, cfg.repetition_block)
    errors = [setup.block_errors(seed, b, min(cfg.repetition_block, cfg.n_repetitions - start), lengths, cfg.chunk_size)
              for b, start in enumerate(progress(starts, desc=f"fixed query kappa={setup.kappa:g}"))]
    return np.sort(np.concatenate(errors), axis=0)


def simulate_fixed_query_bound(inputs, outputs, params, rule="simulate_fixed_query_bound", runtime=DEFAULT_RUNTIME):
    """Write fixed_query_bound/quantiles.parquet: per (κ, L, δ) the empirical quantile, the δ-method prediction and the bounds."""
    cfg = settings_from(FixedQuerySettings, params["fixed_query_bound"], "fixed_query_bound")
    dtype, device = dtype_of(params["dtype"]), resolve_device(runtime.device)
    lengths = prompt_length_grid(cfg.log2_min_prompt_length, cfg.log2_max_prompt_length, 1)
    deltas = [float(d) for d in cfg.deltas]
    rows = []
    for kappa in map(float, cfg.kappas):
        setup = FixedQuery(kappa, cfg.dim, cfg.rho, dtype, device)
        errors = sorted_errors(cfg, setup, lengths, params["seed"])
        law_q = setup.limit_law_quantiles(params["seed"], [1 - d for d in deltas], cfg.n_limit_law_draws)  # [Δ]
        rows += kappa_rows(kappa, errors, lengths, setup.terms, law_q, deltas, float(cfg.ci_level))
    out = pd.DataFrame(rows)
    broken = out[~out["bound_holds"]]
    if len(broken):
        print(f"WARNING: empirical quantile above the rigorous bound in {len(broken)} cells:\n{broken}")
    write_parquet(out, outputs["quantiles"], provenance(rule, params, base_seed=params["seed"], runtime=runtime))
