"""The body shared by rules ``train_beyond_gaussian`` (R6) and ``transfer_beyond_gaussian`` (R4): every (model, seed)
run of one section at one (measure, L), trained and written (docs/experiments.md#beyond_gaussian). Not a rule."""
from __future__ import annotations

import functools

from largeprompt.core.devices import dtype_of, resolve_device
from largeprompt.icl.beyond_gaussian import measure_task
from largeprompt.icl.bounded_risk import icl_quadrature, limit_risk
from largeprompt.icl.engine.protocol import train_runs
from largeprompt.icl.test_set import load_test_set
from largeprompt.io.checkpoints import Checkpoint
from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.pipeline import checkpoint_path
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress


def train_measure_runs(path, params, cfg, flows, rule, runtime, test_frame):
    """Train ``cfg``'s runs at this (measure, L) and write them to ``path`` (``test_frame``:
    :func:`largeprompt.icl.beyond_gaussian.measure_test_set`, drawn once per job)."""
    section, L = params["beyond_gaussian"], int(params["prompt_length"])
    task = measure_task(section, params["token_measure"])
    device = resolve_device(runtime.device)
    test = load_test_set(test_frame, L, dtype=dtype_of(cfg.dtype), device=device, feature_major=True)
    limits = {m: limit_risk(task, m, icl_quadrature(section)) for m in cfg.models}
    checkpoint = Checkpoint(checkpoint_path(path))
    frame = train_runs(cfg, task, L, int(params["seed"]), test, flows, checkpoint=checkpoint,
                       checkpoint_every=runtime.checkpoint_every, key_extra={"beyond_gaussian": section}, device=device,
                       progress=functools.partial(progress, None, desc=f"{rule} {task.token_measure} L={L}"), limits=limits)
    frame.insert(0, "token_measure", task.token_measure)
    write_parquet(frame, path, provenance(rule, params, base_seed=params["seed"],
                                          run_seeds=sorted(set(frame["seed"])), runtime=runtime))
    checkpoint.remove()
