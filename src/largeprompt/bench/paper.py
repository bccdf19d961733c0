"""The cost of config/paper.yaml (docs/experiments.md#configurations): its training in core-hours (part of every
``largeprompt bench``) and, with ``--paper``, its whole DAG on N cores, from timed slices of every stage.

Slices run the stages' library functions with the paper's params (config/paper.yaml merged over
config/config.yaml) at reduced repetitions, horizons or steps (:mod:`largeprompt.bench.costs`); each job's
CPU time is extrapolated linearly in its work, and the jobs are list-scheduled on N one-thread cores,
longest ready job first, in the order the DAG allows (:mod:`largeprompt.bench.schedule`).
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from largeprompt.bench import costs, floors
from largeprompt.bench.memory import mem_mb
from largeprompt.bench.pipeline import paper_config
from largeprompt.bench.report import machine_description
from largeprompt.bench.schedule import Job, critical_path, schedule

FIGURES = ("affine_limit", "output_concentration", "gradient_concentration", "rate_exponent", "fixed_query_bound",
           "balanced_flow", "training_vs_prompt_length", "init_dependence", "trajectory_transfer", "beyond_gaussian")
FIGURE_INPUTS = {"affine_limit": ("affine_limit",), "output_concentration": ("estimate_concentration_rates",),
                 "gradient_concentration": ("estimate_concentration_rates",), "rate_exponent": ("estimate_concentration_rates",),
                 "fixed_query_bound": ("fixed_query_bound",), "balanced_flow": ("balanced_flow",),
                 "training_vs_prompt_length": ("summarize_training", "summarize_init_dependence"),
                 "init_dependence": ("summarize_init_dependence",), "trajectory_transfer": ("summarize_trajectory_transfer", "train"),
                 "beyond_gaussian": ("summarize_beyond_gaussian",)}


def job_overhead_seconds() -> float:
    """CPU seconds of a job's interpreter start and imports (torch, pandas, the stages), added to every job."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import largeprompt.stages.simulate_concentration_errors, largeprompt.stages.train, "
                    "largeprompt.stages.full_model_flow, matplotlib.pyplot"], check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


SECTIONS = {  # config section → (stage, dtype, the stages its jobs wait for)
    "train": ("train", None, ("make_icl_test_set", "full_model_flow")),
    "transfer": ("train_trajectory_transfer", "float64", ("make_icl_test_set",)),  # train_trajectory_transfer runs in float64
}


def training_stage(config: dict, key: str, quick: bool, load_seconds: float = 0.0) -> tuple[str, list[Job], str]:
    """The jobs (one per L) of config section ``key`` (train: R6, trajectory_transfer: R4), from the engine's measured costs."""
    stage, dtype, after = SECTIONS[key]
    section = config[key]
    dtype = dtype or section["dtype"]
    fit = costs.engine_costs(section, quick, dtype=dtype)
    jobs = [replace(j, seconds=j.seconds + load_seconds) for j in costs.training_jobs(section, config, fit, stage, after)]
    n_runs = len(section["models"]) * (len(section["seeds"]) + len(section["replicate_seeds"]))
    (a, b), (c, d) = fit["step"], fit["test"]
    note = (f"{n_runs} runs, batch {section['batch_size']}, {dtype}: step {a * 1e3:.3g} ms + {b * 1e6:.3g} µs·L, "
            f"test pass {c * 1e3:.3g} ms + {d * 1e6:.3g} µs·L per {fit['n_test']} prompts")
    return f"{stage} (one job per L)", jobs, note


def paper_stages(config: dict, folder: Path, quick: bool) -> list[tuple[str, list[Job], str]]:
    """(label, jobs, what was timed) of every stage of the DAG, every job's cost in CPU seconds."""
    data_jobs, data_note, load = costs.data(config, folder / "data", quick)
    stages = [("data (test set, Bayes risk)", data_jobs, data_note)]
    for label, estimate in (("flows (full model, balanced, reduced, gaps)", costs.flows),
                            ("affine_limit (R1)", costs.affine_limit),
                            ("concentration sweep (R2, R3)", costs.concentration),
                            ("fixed-query bounds (R2)", costs.fixed_query),
                            ("init_dependence (flows of N inits)", costs.init_dependence)):
        jobs, note = estimate(config, folder / label.split()[0], quick)
        stages.append((label, jobs, note))
    stages += [training_stage(config, key, quick, load) for key in SECTIONS]
    jobs, note = costs.beyond_gaussian(config, folder / "beyond_gaussian", quick)
    stages.append(("beyond_gaussian (R4, R6 per token measure)", jobs, note))
    summary = Job("summarize_training", "summarize_training", 0.0, ("train", "full_model_flow", "bayes_risk"))
    plots = [Job(f"plot_{f}", "figures", 0.0, FIGURE_INPUTS[f]) for f in FIGURES]
    stages.append(("summaries and figures", [summary] + plots, "interpreter start and imports only"))
    return stages


def job_floor(job: Job) -> float:
    """CPU seconds of the random numbers ``job`` must draw, fitted from its slices' draws (0 for a job that draws
    nothing or was never sliced)."""
    return job.floor or 0.0


def _floor_text(hours: float, floor: float) -> str:
    return f"floor {floor:6.2f}, ratio {hours / floor:5.1f}x" if floor > 1e-6 * max(hours, 1e-9) else f"{'no draws':>26}"


def report_lines(stages, cores: int, overhead: float) -> list[str]:
    """One line per stage (jobs, core-hours, its floor and their ratio, longest job) and the total with its wall
    time on ``cores``."""
    out, every = [], []
    for label, jobs, note in stages:
        floor = sum(job_floor(j) for j in jobs) / 3600
        jobs = [replace(j, seconds=j.seconds + overhead) for j in jobs]
        every += jobs
        hours = sum(j.seconds for j in jobs) / 3600
        out.append(f"{label:<44} {len(jobs):>3} jobs {hours:>9.2f} core-hours, {_floor_text(hours, floor)}; longest "
                   f"job {max(j.seconds for j in jobs) / 3600:5.2f} h  ({note})")
    total, floor = sum(j.seconds for j in every) / 3600, sum(job_floor(j) for j in every) / 3600
    wall, path = schedule(every, cores) / 3600, critical_path(every) / 3600
    out.append(f"{'total: config/paper.yaml':<44} {len(every):>3} jobs {total:>9.2f} core-hours, {_floor_text(total, floor)}; "
               f"on {cores} cores ≈ {wall:.2f} h wall (longest ready job first; critical path {path:.2f} h)")
    rates = ", ".join(f"{name} {seconds * 1e9:.2f}" for name, seconds in floors.rates().items())
    out.append(f"  floor: the random numbers each stage draws, at this run's sampler rates (ns per number: {rates})")
    return out


def prediction_record(stages, cores: int, overhead: float) -> dict:
    """Every job's predicted CPU seconds (overhead included) with its rule, for ``--save`` (what
    :mod:`largeprompt.commands.publish` compares with the measured benchmark files of a run)."""
    jobs = [dict(name=j.name, rule=j.name.split()[0], stage=label, seconds=j.seconds + overhead, floor=job_floor(j))
            for label, stage_jobs, _ in stages for j in stage_jobs]
    every = [replace(j, seconds=j.seconds + overhead) for _, stage_jobs, _ in stages for j in stage_jobs]
    return {"cores": cores, "overhead_seconds": overhead, "total_core_hours": sum(j["seconds"] for j in jobs) / 3600,
            "wall_hours": schedule(every, cores) / 3600, "machine": machine_description(), "jobs": jobs}


def bench_paper(cores: int, quick: bool = False, validate: bool = False, save: str | None = None) -> list[str]:
    """``largeprompt bench --paper``: one line per stage and the total, and optionally the validation; ``save``:
    a JSON file of every job's prediction."""
    config = paper_config()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        stages = paper_stages(config, folder, quick)
        overhead = job_overhead_seconds()
        if save:
            Path(save).write_text(json.dumps(prediction_record(stages, cores, overhead), indent=1))
        out = [f"# config/paper.yaml on {cores} cores: CPU time of slices of each stage, 1 thread per job, "
               f"extrapolated linearly in the work; +{overhead:.1f} s per job for interpreter start and imports"]
        out += report_lines(stages, cores, overhead)
        if validate:
            out += validation_lines(config, folder / "validation", stages, overhead)
    return out + slice_memory_lines()


def slice_memory_lines() -> list[str]:
    """The peak RSS of each rule's timed slices, and the mem_mb it implies. For the streamed stages (prompts drawn
    chunk by chunk, repetitions in blocks) the slices run the paper's chunk and block sizes, so their peak is the
    paper job's; for the test set, bayes_risk and the error tables, ``--paper-memory`` measures at full size."""

    out = [f"# peak RSS (VmHWM) of the timed slices, per rule: {'rule':<28} {'peak RSS (MB)':>14} {'mem_mb':>8}"]
    out += [f"  {rule:<56} {peak:>14.0f} {mem_mb(peak):>8}" for rule, peak in sorted(costs.SLICE_PEAKS.items())]
    return out


VALIDATION_PROMPT_LENGTH = 100  # the training job run for real by --validate (≈ 5 min on one core)


def validation_lines(config: dict, folder: Path, stages, overhead: float) -> list[str]:
    """Two jobs run for real at paper scale against their extrapolated cost: full_model_flow, and one training
    job with the real test set and flow as inputs (the simulate_concentration_errors jobs take 10 to 40 min each)."""
    predicted = {j.name: j.seconds for _, jobs, _ in stages for j in jobs}
    seed, L = config["train"]["seeds"][0], VALIDATION_PROMPT_LENGTH
    cfg = costs.with_values(config, run_seed=seed, max_prompt_length=max(config["train"]["prompt_lengths"]),
                            prompt_length=L, checkpoint=str(folder / "checkpoint.pt"))
    runs = [(f"full_model_flow seed={seed}", costs.timed("full_model_flow", cfg, folder / "flow"),
             f"horizon {config['train']['horizon']}, {config['infinite']['flow_points']} flow points")]
    costs.timed("make_icl_test_set", cfg, folder / "data")
    inputs = {"test_set": str(folder / "data" / "test_set.parquet"), "flows": [str(folder / "flow" / "flow.parquet")]}
    runs.append((f"train L={L}", costs.timed("train", cfg, folder / "train", inputs),
                 f"{config['train']['horizon'] / config['train']['lr']:.0f} steps, reading the test set and logging"))
    out = ["# validation: jobs run for real at paper scale, CPU seconds (each also pays the per-job overhead above)"]
    for name, measured, what in runs:
        guess = predicted[name]
        out.append(f"  {name:<24} measured {measured['cpu']:8.1f} s, predicted {guess:8.1f} s: error "
                   f"{guess / measured['cpu'] - 1:+.0%}  ({what}; peak RSS {measured['rss_mb']:.0f} MB)")
    return out


def bench_paper_training(quick: bool) -> list[str]:
    """The extrapolated cost of config/paper.yaml's training (one job per L) on 2 cores, in core-hours."""
    config = paper_config()
    section = config["train"]
    _, jobs, note = training_stage(config, "train", quick)
    jobs = [replace(j, after=()) for j in jobs]  # the training alone: its inputs are there
    hours, wall = sum(j.seconds for j in jobs) / 3600, schedule(jobs, 2) / 3600
    return [f"# config/paper.yaml training: {len(jobs)} jobs (one per L) x {len(section['models'])} models x "
            f"{len(section['seeds'])} seed, {section['horizon'] / section['lr']:.0f} steps, test loss logged "
            f"{section['n_log']} times on {config['icl']['n_test']} prompts, 1 thread per job",
            f"  paper.yaml training ≈ {hours:.2f} core-hours on this machine, ≈ {wall:.2f} h wall on 2 cores "
            f"(longest job first; {note}; reading the test set not included)"]
