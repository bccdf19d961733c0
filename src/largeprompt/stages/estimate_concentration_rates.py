"""Rule ``estimate_concentration_rates`` (R2, R3; docs/experiments.md#output_concentration,
docs/experiments.md#rate_exponent): the rate tables of :mod:`largeprompt.maths.rate_tables` from the collected
error tables, read one (measure, c) cell at a time (18 M rows each at paper scale)."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from largeprompt.io.parquet_io import distinct_keys, read_parquet, write_parquet
from largeprompt.io.pipeline import settings_from
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress
from largeprompt.maths.rate_tables import TABLES, rate_tables


@dataclass(frozen=True)
class RateSettings:
    """Config section ``concentration``: the fits' bootstrap and the cells of the paper-form fit."""

    dim: int
    n_bootstrap: int
    ci_level: float
    paper_form_min_c: float


def estimate_concentration_rates(inputs, outputs, params, rule="estimate_concentration_rates"):
    """Write results/<run>/concentration/{exponents, local_exponents, …}.parquet (one table per kind of row)."""
    cfg = settings_from(RateSettings, params["concentration"], "concentration")
    keys = ["token_measure", "c", "prompt_length", "repetition"]

    def load_cell(name: str, c: float) -> pd.DataFrame:
        cell = [("token_measure", "==", name), ("c", "==", c)]
        errors = read_parquet(inputs["output_errors"], filters=cell)
        grads = read_parquet(inputs["gradient_errors"], columns=keys + ["grad_U_sq_error", "grad_V_sq_error"],
                             filters=cell)
        return errors.merge(grads, on=keys, validate="one_to_one")

    cells = distinct_keys(inputs["output_errors"], ["token_measure", "c"])
    tables = rate_tables(progress(cells, desc="rates"), load_cell, cfg, int(params["seed"]))
    prov = provenance(rule, params, base_seed=params["seed"])
    for name in TABLES:
        write_parquet(tables[name], outputs[name], prov)
    for r in tables["exponents"].itertuples():
        print(f"{r.token_measure} {r.metric} c={r.c:g} {r.statistic}: exponent {r.estimate:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]"
              f" (predicted {r.predicted:.3f})")
