"""The body shared by rules ``train_beyond_gaussian`` (R6) and ``train_trajectory_transfer_beyond_gaussian`` (R4): every (model, seed)
run of one section at one (measure, L), trained and written (docs/experiments.md#beyond_gaussian). Not a rule."""
from __future__ import annotations

from largeprompt.icl.beyond_gaussian import measure_task
from largeprompt.icl.bounded_risk import icl_quadrature, limit_risk
from largeprompt.icl.engine.job import Job, Runs, train_and_write


def train_measure_runs(path, params, cfg, flows, rule, runtime, test_frame, then=None):
    """Train ``cfg``'s runs at this (measure, L) and write them to ``path`` (``test_frame``:
    :func:`largeprompt.icl.beyond_gaussian.measure_test_set`, drawn once per job); ``then``: the columns added before
    writing (:func:`largeprompt.icl.engine.job.train_and_write`)."""
    section = params["beyond_gaussian"]
    task = measure_task(section, params["token_measure"])
    limits = {m: limit_risk(task, m, icl_quadrature(section)) for m in cfg.models}
    runs = Runs(cfg, task, test_frame, flows, limits, {"beyond_gaussian": section})
    train_and_write(Job(rule, params, runtime, path), runs, then=then, measure_column=True)
