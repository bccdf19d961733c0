"""Rule ``train`` (R6; docs/experiments.md#training-protocol): every (model, seed) run at one prompt length in one
job, with the step-size rule of config ``train.step_size_rule`` (``flow_sharpness`` reads each seed's R∞ flow;
``constant`` is the paper's plain SGD)."""
from __future__ import annotations

import functools

from largeprompt.core.devices import dtype_of, resolve_device
from largeprompt.icl.bounded_risk import icl_quadrature, task_limits
from largeprompt.icl.engine.protocol import Flow, TrainSettings, train_runs
from largeprompt.icl.flow_class import classify_flow
from largeprompt.icl.task import regression_task
from largeprompt.icl.test_set import load_test_set
from largeprompt.io.checkpoints import Checkpoint
from largeprompt.io.parquet_io import read_parquet, write_parquet
from largeprompt.io.pipeline import DEFAULT_RUNTIME, checkpoint_path, settings_from
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress
from largeprompt.io.training_log import report_runs


def load_flows(paths, noise_variance: float) -> dict[int, Flow]:
    """seed → :class:`Flow` of each seed's infinite-prompt flow file."""
    flows = {}
    for path in paths:
        f = read_parquet(path, columns=["seed", "time", "sharpness", "infinite_prompt_risk", "readout_determinant"])
        f = f.sort_values("time")
        kind, _ = classify_flow(f["time"], f["infinite_prompt_risk"], f["readout_determinant"], noise_variance)
        flows[int(f["seed"].iloc[0])] = Flow(f["time"].to_numpy(), f["sharpness"].to_numpy(), kind)
    return flows


def train(inputs, outputs, params, rule="train", runtime=DEFAULT_RUNTIME):
    """Write results/<run>/train/L{L}.parquet: every R6 run at this L (checkpointed beside it, io.pipeline.checkpoint_path)."""
    cfg = settings_from(TrainSettings, params["train"], "train")
    L, base_seed, task = int(params["prompt_length"]), int(params["seed"]), regression_task(params["icl"])
    flows = load_flows(inputs["flows"], task.noise_variance)
    device = resolve_device(runtime.device)
    test_frame = read_parquet(inputs["test_set"])
    checkpoint = Checkpoint(checkpoint_path(outputs["trajectories"]))
    frame = train_runs(cfg, task, L, base_seed, load_test_set(test_frame, L, dtype=dtype_of(cfg.dtype), device=device, feature_major=True),
                       flows, checkpoint=checkpoint, checkpoint_every=runtime.checkpoint_every,
                       key_extra={"icl": params["icl"]}, device=device,
                       progress=functools.partial(progress, None, desc=f"{rule} L={L}"),
                       limits=task_limits(task, icl_quadrature(params["icl"])))
    report_runs(frame, {s: f.kind for s, f in flows.items()}, runtime.status_rule, test_frame, L, task)
    write_parquet(frame, outputs["trajectories"],
                  provenance(rule, params, base_seed=base_seed, run_seeds=sorted(set(frame["seed"])), runtime=runtime))
    checkpoint.remove()  # the job is complete: its checkpoint is spent
