"""Training benchmarks (docs/experiments.md#training-protocol): the engine's step against its floor and the
naive step, the stacked engine against the single-run engine, and the cost of config/paper.yaml's training.

The engine is :class:`largeprompt.icl.engine.loop.PromptLengthTrainer`: one step draws a batch per batch stream
(:func:`largeprompt.icl.engine.runs.batch`) and advances every run of that stream with
:func:`largeprompt.icl.engine.stacked.loss_and_gradients` and the SGD update (``PromptLengthTrainer.advance``).
The single-run engine trains the same runs one at a time, each drawing its own batch, through
:func:`largeprompt.icl.models.predict` and autograd.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from largeprompt.bench.report import interleaved_seconds, line, peak_rss_mb, run_worker
from largeprompt.core.devices import DTYPES
from largeprompt.core.seeding import DRAWN, stream_generator
from largeprompt.icl import models
from largeprompt.icl.engine.loop import PromptLengthTrainer
from largeprompt.icl.engine.runs import batch, initial_parameters, run_specs, test_losses, whitened_batch
from largeprompt.icl.engine.stacked import RunStack
from largeprompt.icl.task import regression_task
from largeprompt.icl.test_set import load_test_set
from largeprompt.io.parquet_io import read_parquet

PROMPT_LENGTH, BATCH, DIM = 1000, 128, 6
TRAINING_SHAPE = f"L={PROMPT_LENGTH}, batch {BATCH}, D={DIM}"
TASK = {"dim": DIM - 1, "covariance_rho": 0.5, "task_variance": 0.2, "noise_variance": 0.1}  # the §6 task
PAPER_RUNS = (["softmax", "linear"], [327], [])  # the authors' §6 stack: 2 models x seed 327
DEFAULT_RUNS = (["softmax", "linear"], [0, 1, 2], [1])  # config/config.yaml: 2 models x (3 seeds + 1 replicate)
MULTI_SEED = 8  # n: config/paper.yaml trains seed 327 and init seeds 0..n−1 (≥ 5 converging flows: ≥ 5 ok runs per (model, L))
MULTI_SEED_RUNS = (["softmax", "linear"], [327, *range(MULTI_SEED)], [])  # 2 x (n + 1) runs on one batch stream
LR, MAX_STEPS = 1e-3, 100_000


def trainer(prompt_length: int, runs=PAPER_RUNS, dtype: str = "float32", batch_size: int = BATCH, task: dict = TASK,
            device="cpu") -> PromptLengthTrainer:
    """A trainer of ``runs`` (models, seeds, replicate seeds) at constant lr for MAX_STEPS steps (``task``: a config
    section ``icl``, with its ``token_measure``)."""
    specs = run_specs(*runs)
    return PromptLengthTrainer(regression_task(task), specs, [np.full(MAX_STEPS, LR)] * len(specs),
                               prompt_length=prompt_length, base_seed=0, batch_size=batch_size, n_log=1,
                               divergence_threshold=1e4, dtype=dtype, device=device)


def stepping(stepper: PromptLengthTrainer):
    """One step of ``stepper``: ``advance`` of every batch stream, as in PromptLengthTrainer.run."""
    specs = stepper.specs
    groups = [(j, [r for r, s in enumerate(specs) if s.stream == j]) for j in sorted({s.stream for s in specs})]

    def step():
        for stream, members in groups:
            stepper.advance(stream, members)
        stepper.step += 1

    return step


def engine(prompt_length: int, runs=PAPER_RUNS, dtype: str = "float32", batch_size: int = BATCH, task: dict = TASK):
    """One step of the stacked engine (:func:`stepping` of a fresh :func:`trainer`)."""
    return stepping(trainer(prompt_length, runs, dtype, batch_size, task))


def _autograd_runs(specs, dtype):
    """Each run's own leaf weights (the engine's initial weights) and its model."""
    out = []
    for spec in specs:
        params = initial_parameters(0, spec.seed, DIM, dtype=dtype)
        out.append(({n: p.requires_grad_(True) for n, p in params.items()}, spec.model))
    return out


def _sgd(params: dict, loss) -> None:
    grads = torch.autograd.grad(loss, list(params.values()))
    with torch.no_grad():
        for p, g in zip(params.values(), grads):
            p -= LR * g


def single_run_engine(prompt_length: int, runs=PAPER_RUNS, dtype=torch.float32):
    """One step of every run trained alone: its own batch (stream r), models.predict, autograd, SGD."""
    task, counter = regression_task(TASK), iter(range(10**9))
    trained = _autograd_runs(run_specs(*runs), dtype)

    def step():
        k = next(counter)
        for r, (params, model) in enumerate(trained):
            query, prompt, target = batch(task, 0, r, k, BATCH, prompt_length, dtype, "cpu")
            _sgd(params, models.mse(models.predict(params, query, prompt, model), target))

    return step


def naive_step(prompt_length: int, runs=PAPER_RUNS, dtype=torch.float32):
    """The engine's step done naively: one shared batch, every token projected through Q, K, V, autograd."""
    task, counter = regression_task(TASK), iter(range(10**9))
    trained = _autograd_runs(run_specs(*runs), dtype)

    def step():
        query, prompt, target = batch(task, 0, 0, next(counter), BATCH, prompt_length, dtype, "cpu")
        for params, model in trained:
            _sgd(params, models.mse(models.predict_naive(params, query, prompt, model), target))

    return step


def floor(prompt_length: int, dtype=torch.float32):
    """The floor of a step: the batch's Gaussians [B, L+1, D], drawn as one tensor, plus one pass over them."""
    probe, counter = torch.ones(DIM, dtype=dtype), iter(range(10**9))

    def fn():
        g = torch.randn(BATCH, prompt_length + 1, DIM, generator=stream_generator(0, "bench/floor", next(counter)),
                        dtype=dtype)
        return g @ probe

    return fn


def draw(prompt_length: int, dtype=torch.float32):
    """The engine's draw alone: runs.whitened_batch (RegressionTask.sample_whitened on a counter-based stream)."""
    task, counter = regression_task(TASK), iter(range(10**9))
    return lambda: whitened_batch(task, 0, 0, next(counter), BATCH, prompt_length, dtype, "cpu")


def test_set_loss(prompt_length: int, n_prompts: int, runs=PAPER_RUNS, dtype: str = "float32", task: dict = TASK):
    """One logging pass: every run's test loss on ``n_prompts`` held-out prompts (training.test_losses)."""

    specs, dtype = run_specs(*runs), DTYPES[dtype]
    stack = RunStack.from_parameters([initial_parameters(0, s.seed, int(task["dim"]) + 1, dtype=dtype) for s in specs],
                                     [s.model == "softmax" for s in specs])
    test_set = regression_task(task).sample(n_prompts, prompt_length, stream_generator(0, "bench/test"), dtype=dtype)
    return lambda: test_losses(stack, test_set)


def training_job_memory(extra: dict) -> dict:
    """Peak RSS and CPU seconds of a training job cut to 2 steps: read the test set, train, log twice.

    extra: ``section`` (a config train/transfer section), ``icl``, ``dtype``, ``prompt_length``, ``test_set`` (path).
    """

    start = time.process_time()
    section, L, dtype = extra["section"], int(extra["train_length"]), extra["dtype"]
    specs = run_specs(section["models"], section["seeds"], section["replicate_seeds"])
    test_set = load_test_set(read_parquet(extra["test_set"]), L, dtype=DTYPES[dtype], feature_major=True)
    trainer = PromptLengthTrainer(regression_task(extra["icl"]), specs, [np.full(2, section["lr"])] * len(specs),
                                  prompt_length=L, base_seed=0, batch_size=section["batch_size"], n_log=1,
                                  divergence_threshold=1e4, dtype=dtype)
    trainer.run(test_set)
    return {"cpu": time.process_time() - start, "rss_mb": peak_rss_mb()}


STEP_BURST = 25  # a training job takes its steps back to back: time them in bursts, with warm caches


def _burst(step, n: int):
    def run():
        for _ in range(n):
            step()

    return run


def worker(name: str, extra: dict, repeats: int) -> dict:
    """Median CPU seconds of interleaved calls: ``train_step``, ``train_engines`` or ``train_costs``."""
    L = int(extra.get("train_length", PROMPT_LENGTH))
    if name == "train_memory":
        return training_job_memory(extra)
    if name == "train_step":
        fns = {"floor": floor(L), "draw": draw(L), "engine": engine(L), "naive": naive_step(L),
               "stack": engine(L, MULTI_SEED_RUNS)}
        return interleaved_seconds(fns, repeats)
    if name == "train_engines":
        fns = {"stacked": engine(L, DEFAULT_RUNS), "single": single_run_engine(L, DEFAULT_RUNS)}
        return interleaved_seconds(fns, repeats)
    if name == "train_costs":  # the engine's step and one test-loss pass at each L, for the cost of a config
        lengths, n_test = [int(x) for x in extra["lengths"]], int(extra.get("n_test", 1024))
        runs, dtype, batch_size = extra.get("runs", PAPER_RUNS), extra.get("dtype", "float32"), extra.get("batch", BATCH)
        burst, task = int(extra.get("burst", STEP_BURST)), extra.get("task", TASK)
        fns = {f"step{L}": _burst(engine(L, runs, dtype, batch_size, task), burst) for L in lengths}
        fns |= {f"test{L}": test_set_loss(L, n_test, runs, dtype, task) for L in lengths}
        out = interleaved_seconds(fns, repeats, warmup=1)
        for clock in out.values():
            clock.update({f"step{L}": clock[f"step{L}"] / burst for L in lengths})
        out["drawn"] = {}
        for L in lengths:  # the numbers a step draws, per sampler (bench.floors)
            DRAWN.clear()
            fns[f"step{L}"]()
            out["drawn"][str(L)] = {name: n / burst for name, n in DRAWN.items()}
        return out
    raise ValueError(f"unknown benchmark worker {name!r}")


def bench_step(quick: bool) -> list[str]:
    """The engine's step against its floor (docs/performance.md#training-step): the paper's stack (softmax + linear)
    and the multi-seed stack of 2 x (n + 1) runs, and against the naive step."""
    reps = 10 if quick else 40
    cpu = run_worker("train_step", repeats=reps)["cpu"]
    eng, naive, fl, drawn, stack = cpu["engine"], cpu["naive"], cpu["floor"], cpu["draw"], cpu["stack"]
    n_stack = len(run_specs(*MULTI_SEED_RUNS))
    return [
        f"# one §6 training step of the engine (draw, loss_and_gradients, SGD update), 2 runs (softmax + linear), "
        f"{TRAINING_SHAPE}, float32, 1 thread, median CPU time of {reps} interleaved rounds",
        line("efficient step: engine, 2 runs (s)", eng, "s", "floor: draw batch + one pass", fl, eng / fl, "<=1.3"),
        line(f"engine, {n_stack} runs = 2 x ({MULTI_SEED} + 1) (s)", stack, "s", "floor: draw batch + one pass", fl,
             stack / fl, "<=2.0"),
        line("naive Q/K/V projection step, 2 runs (s)", naive, "s", "floor: draw batch + one pass", fl, naive / fl, None),
        line("efficient step: engine, 2 runs (s)", eng, "s", "naive step", naive, eng / naive, "<=1.0"),
        f"  of the engine's step: the draw (RegressionTask.sample_whitened) {drawn * 1e3:.3f} ms = {drawn / fl:.2f}x the floor "
        f"by itself; forward, gradients and update {(eng - drawn) * 1e3:.3f} ms = {(eng - drawn) / fl:.2f}x the floor "
        f"(2 runs), {(stack - drawn) * 1e3:.3f} ms = {(stack - drawn) / fl:.2f}x ({n_stack} runs): a marginal pair of "
        f"runs {(stack - eng) / MULTI_SEED * 1e3:.3f} ms",
    ]


def bench_engines(quick: bool) -> list[str]:
    """run·steps/s of the stacked engine against the single-run engine, default shape, at L = 10 and 1000."""
    reps = 10 if quick else 30
    n_runs = len(run_specs(*DEFAULT_RUNS))
    out = [f"# stacked engine (one batch per stream, shared by its runs) against the single-run engine (each run its "
           f"own batch, models.predict + autograd): batch {BATCH}, {n_runs} runs = 2 models x (3 seeds + 1 replicate "
           f"on a second batch stream), float32, 1 thread, median CPU time of {reps} interleaved rounds"]
    for L in (10, 1000):
        cpu = run_worker("train_engines", repeats=reps, train_length=L)["cpu"]
        stacked, single = n_runs / cpu["stacked"], n_runs / cpu["single"]
        out.append(line(f"stacked engine, L={L} (run·steps/s)", stacked, "run·steps/s", "single-run engine", single,
                        stacked / single, ">=1.0"))
    return out
