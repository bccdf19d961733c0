"""Rule ``transfer_beyond_gaussian`` (R4 per token measure; docs/experiments.md#beyond_gaussian): the transfer runs of
section ``transfer`` (constant small lr, large batch, float64, a replicate seed on a second batch stream) with the
covariates of one measure, at the budget of ``beyond_gaussian.transfer``."""
from __future__ import annotations

from largeprompt.icl.fit import TrainSettings
from largeprompt.io.pipeline import DEFAULT_RUNTIME, settings_from
from largeprompt.stages.train_beyond_gaussian import train_measure_runs
from largeprompt.stages.train_transfer import TRANSFER_FIXED


def transfer_beyond_gaussian(inputs, outputs, params, rule="transfer_beyond_gaussian", runtime=DEFAULT_RUNTIME):
    """Write results/<run>/beyond_gaussian/<measure>/transfer_L{L}.parquet for every L, in turn."""
    overrides = params["beyond_gaussian"]["transfer"]
    section = {**params["transfer"], **overrides}
    cfg = settings_from(TrainSettings, dict(section, final_lr=section["lr"], **TRANSFER_FIXED), "transfer")
    for L, path in zip(overrides["prompt_lengths"], outputs["trajectories"]):
        train_measure_runs(inputs, {"trajectories": path}, dict(params, prompt_length=L), cfg, {}, rule, runtime,
                           max(overrides["prompt_lengths"]))
