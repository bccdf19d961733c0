"""Rule ``collect_concentration_errors`` (docs/experiments.md#output_concentration): the per-(measure, c) error
tables of ``simulate_concentration_errors`` gathered into output_errors.parquet and gradient_errors.parquet."""
from __future__ import annotations

from largeprompt.io.parquet_io import read_parquet, write_parquet_parts
from largeprompt.io.provenance import provenance
from largeprompt.maths.concentration import ERROR_KEYS


def collect_concentration_errors(inputs, outputs, params, rule="collect_concentration_errors"):
    """Concatenate the per-(measure, c) jobs into output_errors.parquet and gradient_errors.parquet, one job's
    table in memory at a time (18 M rows each at paper scale)."""
    jobs, prov = list(inputs["jobs"]), provenance(rule, params)
    for output, values in (("output_errors", ["output_sq_error"]), ("gradient_errors", ["grad_U_sq_error", "grad_V_sq_error"])):
        write_parquet_parts((read_parquet(job, columns=ERROR_KEYS + values) for job in jobs), outputs[output], prov)
