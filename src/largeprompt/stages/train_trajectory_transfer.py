"""Rule ``train_trajectory_transfer`` (R4; docs/experiments.md#trajectory_transfer): the runs of one prompt length at a
constant small lr, large batch and short horizon, each seed also on an independent batch stream to measure the
SGD-noise floor, each with its coupled L = ∞ run on the same batches (docs/theory.md#coupled-limit)."""
from __future__ import annotations

from largeprompt.icl.bounded_risk import icl_quadrature, task_limits
from largeprompt.icl.coupled_limit import coupled_weights_of
from largeprompt.icl.engine.job import Job, Runs, train_and_write
from largeprompt.icl.engine.protocol import TrainSettings, transfer_section
from largeprompt.icl.task import regression_task
from largeprompt.io.parquet_io import read_parquet
from largeprompt.io.pipeline import DEFAULT_RUNTIME, settings_from


def train_trajectory_transfer(inputs, outputs, params, rule="train_trajectory_transfer", runtime=DEFAULT_RUNTIME):
    """Write results/<run>/trajectory_transfer/L{L}.parquet: the R4 runs at this L, constant lr, with their coupled weights."""
    task = regression_task(params["icl"])
    runs = Runs(settings_from(TrainSettings, transfer_section(params["trajectory_transfer"]), "trajectory_transfer"), task,
                read_parquet(inputs["test_set"]), {}, task_limits(task, icl_quadrature(params["icl"])), {"icl": params["icl"]})
    train_and_write(Job(rule, params, runtime, outputs["trajectories"]), runs, then=coupled_weights_of)
