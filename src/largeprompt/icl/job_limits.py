"""Cluster time limits of the compute jobs (docs/cluster.md): a generous wall-clock limit per job, from its estimated
step count (:func:`largeprompt.icl.schedules.estimated_steps`) and a per-step cost; `largeprompt bench` measures the
real cost. Read by the rules' ``resources: runtime`` (workflow/rules/common.smk); never a number of a result."""
from __future__ import annotations

import math

from largeprompt.icl.schedules import estimated_steps


def estimated_runtime_minutes(steps: int, prompt_length: int, n_runs: int = 1) -> int:
    """A generous time limit for one job: 10 min plus 3× ≈ (0.3 ms + 3 µs·L)(1 + n_runs/4) per step at batch 128
    (`largeprompt bench` measures the current cost)."""
    per_step = (0.3e-3 + 3e-6 * int(prompt_length)) * (1 + int(n_runs) / 4)
    return 10 + math.ceil(3 * int(steps) * per_step / 60)


def _n_runs(section: dict) -> int:
    """Runs of a training job of config section ``section``: models × (seeds + replicate seeds)."""
    return len(section["models"]) * (len(section["seeds"]) + len(section["replicate_seeds"]))


def training_job_minutes(section: dict, prompt_length: int) -> int:
    """Cluster time limit of one R6 training job of config section ``section`` (``train``, or ``train`` overridden by
    ``beyond_gaussian.train``) at ``prompt_length``, from its estimated step count."""
    steps = estimated_steps(section["step_size_rule"], section["lr"], section["horizon"], section["stability_fraction"],
                            section["final_lr"])
    return estimated_runtime_minutes(steps, prompt_length, _n_runs(section))


def transfer_job_minutes(section: dict, prompt_length: int) -> int:
    """Cluster time limit of one R4 transfer job of config section ``section`` at ``prompt_length``: constant-lr steps,
    each costing batch_size/128 training steps."""
    steps = estimated_steps("constant", section["lr"], section["horizon"]) * max(1, int(section["batch_size"]) // 128)
    return estimated_runtime_minutes(steps, prompt_length, _n_runs(section))


def transfer_jobs_minutes(section: dict) -> int:
    """Cluster time limit of a job that runs the R4 transfer of ``section`` at every one of its prompt lengths in turn."""
    return sum(transfer_job_minutes(section, L) for L in section["prompt_lengths"])


def init_dependence_minutes(n_seeds: int) -> int:
    """Cluster time limit of the init_dependence job: 10 min plus 2 s per seed's flows."""
    return 10 + int(n_seeds) // 30
