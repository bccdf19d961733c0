"""Rule ``train`` (R6; docs/experiments.md#training-protocol): every (model, seed) run at one prompt length in one
job, with the step-size rule of config ``train.step_size_rule`` (``flow_sharpness`` reads each seed's R∞ flow;
``constant`` is the paper's plain SGD)."""
from __future__ import annotations

from largeprompt.icl.bounded_risk import icl_quadrature, task_limits
from largeprompt.icl.engine.job import Job, Runs, train_and_write
from largeprompt.icl.engine.protocol import Flow, TrainSettings
from largeprompt.icl.flow_class import classify_flow
from largeprompt.icl.task import regression_task
from largeprompt.io.parquet_io import read_parquet
from largeprompt.io.pipeline import DEFAULT_RUNTIME, settings_from


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
    task = regression_task(params["icl"])
    runs = Runs(settings_from(TrainSettings, params["train"], "train"), task, read_parquet(inputs["test_set"]),
                load_flows(inputs["flows"], task.noise_variance), task_limits(task, icl_quadrature(params["icl"])),
                {"icl": params["icl"]})
    train_and_write(Job(rule, params, runtime, outputs["trajectories"]), runs, status_rule=runtime.status_rule)
