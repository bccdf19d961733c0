"""Rule ``train_beyond_gaussian`` (R6 per token measure; docs/experiments.md#beyond_gaussian): every (model, seed) run at
one prompt length with the covariates of one measure, by the §6 protocol of section ``train`` (step sizes from each
run's own flow, decay, status rule) at the budget of ``beyond_gaussian.train``."""
from __future__ import annotations

import functools

from largeprompt.core.devices import dtype_of, resolve_device
from largeprompt.icl.beyond_gaussian import measure_task
from largeprompt.icl.bounded_risk import icl_quadrature, limit_risk
from largeprompt.icl.engine.protocol import Flow, TrainSettings, train_runs
from largeprompt.icl.test_set import load_test_set, test_set_frame
from largeprompt.io.checkpoints import Checkpoint
from largeprompt.io.parquet_io import read_parquet, write_parquet
from largeprompt.io.pipeline import DEFAULT_RUNTIME, checkpoint_path, settings_from
from largeprompt.io.provenance import provenance
from largeprompt.io.runlog import progress

TEST_STREAM = "beyond_gaussian/test"  # test prompts of measure m: stream (seed, "beyond_gaussian/test/<m>", 0)


def measure_test_set(params, task, max_prompt_length: int):
    """The held-out prompts of this measure at ``max_prompt_length`` (shorter L read prefixes)."""
    section = params["beyond_gaussian"]
    return test_set_frame(task, int(section["n_test"]), max_prompt_length, int(params["seed"]),
                          stream=f"{TEST_STREAM}/{task.token_measure}")


def load_measure_flows(softmax_path, linear_path) -> dict:
    """(model, seed) → :class:`Flow`: softmax's flows from the measure's file, linear attention's from the gaussian one."""
    flows = {}
    for model, path in (("softmax", softmax_path), ("linear", linear_path)):
        frame = read_parquet(path, columns=["model", "seed", "time", "sharpness", "flow_class"])
        frame = frame[frame["model"] == model].sort_values("time")
        flows.update({(model, int(s)): Flow(g["time"].to_numpy(), g["sharpness"].to_numpy(), g["flow_class"].iloc[0])
                      for s, g in frame.groupby("seed")})
    return flows


def train_measure_runs(path, params, cfg, flows, rule, runtime, test_frame):
    """Train ``cfg``'s runs at this (measure, L) and write them to ``path``: shared by the R6 and R4 rules of the stage
    (``test_frame``: :func:`measure_test_set`, drawn once per job)."""
    section, L = params["beyond_gaussian"], int(params["prompt_length"])
    task = measure_task(section, params["token_measure"])
    device = resolve_device(runtime.device)
    test = load_test_set(test_frame, L, dtype=dtype_of(cfg.dtype), device=device)
    limits = {m: limit_risk(task, m, icl_quadrature(section)) for m in cfg.models}
    checkpoint = Checkpoint(checkpoint_path(path))
    frame = train_runs(cfg, task, L, int(params["seed"]), test, flows, checkpoint=checkpoint,
                       checkpoint_every=runtime.checkpoint_every, key_extra={"beyond_gaussian": section}, device=device,
                       progress=functools.partial(progress, None, desc=f"{rule} {task.token_measure} L={L}"), limits=limits)
    frame.insert(0, "token_measure", task.token_measure)
    write_parquet(frame, path, provenance(rule, params, base_seed=params["seed"],
                                                             run_seeds=sorted(set(frame["seed"])), runtime=runtime))
    checkpoint.remove()


def train_beyond_gaussian(inputs, outputs, params, rule="train_beyond_gaussian", runtime=DEFAULT_RUNTIME):
    """Write results/<run>/beyond_gaussian/<measure>/train_L{L}.parquet."""
    overrides = params["beyond_gaussian"]["train"]
    cfg = settings_from(TrainSettings, {**params["train"], **overrides}, "train")
    task = measure_task(params["beyond_gaussian"], params["token_measure"])
    train_measure_runs(outputs["trajectories"], params, cfg, load_measure_flows(inputs["flows"], inputs["linear_flows"]), rule, runtime,
                       measure_test_set(params, task, max(overrides["prompt_lengths"])))
