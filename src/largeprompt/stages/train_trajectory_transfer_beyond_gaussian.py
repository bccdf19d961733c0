"""Rule ``train_trajectory_transfer_beyond_gaussian`` (R4 per token measure; docs/experiments.md#beyond_gaussian): the transfer runs of
section ``transfer`` (constant small lr, large batch, float64, a replicate seed on a second batch stream) with the
covariates of one measure, at the budget of ``beyond_gaussian.trajectory_transfer``, each with its coupled L = ∞ run
(docs/theory.md#coupled-limit)."""
from __future__ import annotations

from largeprompt.icl.beyond_gaussian import measure_task, measure_test_set
from largeprompt.icl.coupled_limit import coupled_weights_of
from largeprompt.icl.engine.protocol import TrainSettings, transfer_section
from largeprompt.io.pipeline import DEFAULT_RUNTIME, settings_from
from largeprompt.stages.measure_training import train_measure_runs


def train_trajectory_transfer_beyond_gaussian(inputs, outputs, params, rule="train_trajectory_transfer_beyond_gaussian", runtime=DEFAULT_RUNTIME):
    """Write results/<run>/beyond_gaussian/<measure>/trajectory_transfer_L{L}.parquet for every L, in turn."""
    overrides = params["beyond_gaussian"]["trajectory_transfer"]
    cfg = settings_from(TrainSettings, transfer_section({**params["trajectory_transfer"], **overrides}), "trajectory_transfer")
    task = measure_task(params["beyond_gaussian"], params["token_measure"])
    test_frame = measure_test_set(params, task, max(overrides["prompt_lengths"]))  # every L reads a prefix of it
    for L, path in zip(overrides["prompt_lengths"], outputs["trajectories"]):
        train_measure_runs(path, dict(params, prompt_length=L), cfg, {}, rule, runtime, test_frame, then=coupled_weights_of)
