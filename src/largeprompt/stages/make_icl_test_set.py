"""Rule ``make_icl_test_set``: the held-out prompts of the in-context regression task
(docs/experiments.md#training_vs_prompt_length; the format is :mod:`largeprompt.icl.test_set`)."""
from __future__ import annotations

from largeprompt.icl.task import regression_task
from largeprompt.icl.test_set import test_set_frame
from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.provenance import provenance


def make_icl_test_set(inputs, outputs, params, rule="make_icl_test_set"):
    """Write results/<run>/icl/test_set.parquet."""
    icl = params["icl"]
    frame = test_set_frame(regression_task(icl), int(icl["n_test"]), int(params["max_prompt_length"]), int(params["seed"]))
    write_parquet(frame, outputs["test_set"], provenance(rule, params, base_seed=params["seed"]))
