"""Rule ``train_transfer`` (R4; docs/experiments.md#trajectory_transfer): the runs of one prompt length at a
constant small lr, large batch and short horizon, each seed also on an independent batch stream to measure the
SGD-noise floor."""
from __future__ import annotations

import functools

from largeprompt.core.devices import dtype_of, resolve_device
from largeprompt.icl.bounded_risk import icl_quadrature, task_limits
from largeprompt.icl.engine.protocol import TrainSettings, train_runs, transfer_section
from largeprompt.icl.task import regression_task
from largeprompt.icl.test_set import load_test_set
from largeprompt.io.checkpoints import Checkpoint
from largeprompt.io.parquet_io import read_parquet, write_parquet
from largeprompt.io.pipeline import DEFAULT_RUNTIME, checkpoint_path, settings_from
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress
from largeprompt.io.training_log import report_runs


def train_transfer(inputs, outputs, params, rule="train_transfer", runtime=DEFAULT_RUNTIME):
    """Write results/<run>/transfer/L{L}.parquet: the R4 runs at this L, constant lr."""
    cfg = settings_from(TrainSettings, transfer_section(params["transfer"]), "transfer")
    L, base_seed, task = int(params["prompt_length"]), int(params["seed"]), regression_task(params["icl"])
    device = resolve_device(runtime.device)
    test_frame = read_parquet(inputs["test_set"])
    checkpoint = Checkpoint(checkpoint_path(outputs["trajectories"]))
    frame = train_runs(cfg, task, L, base_seed, load_test_set(test_frame, L, dtype=dtype_of(cfg.dtype), device=device, feature_major=True), {},
                       checkpoint=checkpoint, checkpoint_every=runtime.checkpoint_every, key_extra={"icl": params["icl"]},
                       device=device, progress=functools.partial(progress, None, desc=f"{rule} L={L}"),
                       limits=task_limits(task, icl_quadrature(params["icl"])))
    report_runs(frame, {}, None, test_frame, L, task)
    write_parquet(frame, outputs["trajectories"],
                  provenance(rule, params, base_seed=base_seed, run_seeds=sorted(set(frame["seed"])), runtime=runtime))
    checkpoint.remove()
