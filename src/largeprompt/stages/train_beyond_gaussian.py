"""Rule ``train_beyond_gaussian`` (R6 per token measure; docs/experiments.md#beyond_gaussian): every (model, seed) run at
one prompt length with the covariates of one measure, by the §6 protocol of section ``train`` (step sizes from each
run's own flow, decay, status rule) at the budget of ``beyond_gaussian.train``."""
from __future__ import annotations

from largeprompt.icl.beyond_gaussian import measure_task, measure_test_set
from largeprompt.icl.engine.protocol import Flow, TrainSettings
from largeprompt.io.parquet_io import read_parquet
from largeprompt.io.pipeline import DEFAULT_RUNTIME, settings_from
from largeprompt.stages.measure_training import train_measure_runs


def load_measure_flows(softmax_path, linear_path) -> dict:
    """(model, seed) → :class:`Flow`: softmax's flows from the measure's file, linear attention's from the gaussian one."""
    flows = {}
    for model, path in (("softmax", softmax_path), ("linear", linear_path)):
        frame = read_parquet(path, columns=["model", "seed", "time", "sharpness", "flow_class"])
        frame = frame[frame["model"] == model].sort_values("time")
        flows.update({(model, int(s)): Flow(g["time"].to_numpy(), g["sharpness"].to_numpy(), g["flow_class"].iloc[0])
                      for s, g in frame.groupby("seed")})
    return flows


def train_beyond_gaussian(inputs, outputs, params, rule="train_beyond_gaussian", runtime=DEFAULT_RUNTIME):
    """Write results/<run>/beyond_gaussian/<measure>/train_L{L}.parquet."""
    overrides = params["beyond_gaussian"]["train"]
    cfg = settings_from(TrainSettings, {**params["train"], **overrides}, "train")
    task = measure_task(params["beyond_gaussian"], params["token_measure"])
    train_measure_runs(outputs["trajectories"], params, cfg, load_measure_flows(inputs["flows"], inputs["linear_flows"]), rule, runtime,
                       measure_test_set(params, task, max(overrides["prompt_lengths"])))
