"""One training job (docs/experiments.md#training-protocol): every run of one section at one prompt length trained,
logged and written with its provenance, checkpointed beside its output. The body of the rules ``train``,
``train_trajectory_transfer``, ``train_beyond_gaussian`` and ``train_trajectory_transfer_beyond_gaussian``; an R4 job also writes, at each logged
step, the weights of the run's coupled L = ∞ run (``then``: ``coupled_theta``, docs/theory.md#coupled-limit)."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from largeprompt.core.devices import dtype_of, resolve_device
from largeprompt.icl.engine.protocol import TrainSettings, train_runs
from largeprompt.icl.engine.run_log import report_runs
from largeprompt.icl.task import RegressionTask
from largeprompt.icl.test_set import load_test_set
from largeprompt.io.checkpoints import Checkpoint
from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.pipeline import Runtime, checkpoint_path
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress


@dataclass(frozen=True)
class Job:
    """What a job records and where it writes: its rule, its params (with ``seed`` and ``prompt_length``), the
    runtime settings and the output file."""

    rule: str
    params: dict
    runtime: Runtime
    path: str


@dataclass(frozen=True)
class Runs:
    """What the runs are: the section's settings, the task, the test prompts (a frame of
    :func:`largeprompt.icl.test_set.load_test_set`), the flows by seed or (model, seed), the R∞ per model the rows
    log, and the config section recorded in the checkpoint's key."""

    cfg: TrainSettings
    task: RegressionTask
    test_frame: pd.DataFrame
    flows: dict
    limits: dict | None
    key_extra: dict


def train_and_write(job: Job, runs: Runs, *, then: Callable | None = None, measure_column: bool = False,
                    status_rule: dict | None = None) -> pd.DataFrame:
    """Train ``runs`` at ``job.params["prompt_length"]``, log one line per run (with ``status_rule``, what the summary
    will call it), and write the trajectory rows to ``job.path``. ``then(frame, runs, base_seed, L, progress)``: the
    rows with columns added before they are written (R4: :func:`largeprompt.icl.coupled_limit.coupled_weights_of`);
    ``measure_column``: with a first column ``token_measure``."""
    cfg, task = runs.cfg, runs.task
    L, base_seed = int(job.params["prompt_length"]), int(job.params["seed"])
    device = resolve_device(job.runtime.device)
    test = load_test_set(runs.test_frame, L, dtype=dtype_of(cfg.dtype), device=device, feature_major=True)
    checkpoint = Checkpoint(checkpoint_path(job.path))
    label = f"{task.token_measure} " if measure_column else ""
    frame = train_runs(cfg, task, L, base_seed, test, runs.flows, checkpoint=checkpoint,
                       checkpoint_every=job.runtime.checkpoint_every, key_extra=runs.key_extra, device=device,
                       progress=functools.partial(progress, None, desc=f"{job.rule} {label}L={L}"), limits=runs.limits)
    if then is not None:
        frame = then(frame, runs, base_seed, L, functools.partial(progress, None, desc=f"{job.rule} {label}L={L} then"))
    classes = {k: f.kind for k, f in runs.flows.items() if not isinstance(k, tuple)}
    report_runs(frame, classes, status_rule, runs.test_frame, L, task)
    if measure_column:
        frame.insert(0, "token_measure", task.token_measure)
    write_parquet(frame, job.path, provenance(job.rule, job.params, base_seed=base_seed,
                                              run_seeds=sorted(set(frame["seed"])), runtime=job.runtime))
    checkpoint.remove()  # the job is complete: its checkpoint is spent
    return frame
