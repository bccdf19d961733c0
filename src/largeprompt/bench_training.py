"""Training-step workers for ``largeprompt bench`` (SPEC §4): the §6 step against its floor."""
from __future__ import annotations

import statistics
import time

import torch

from . import models
from .icl import RegressionTask
from .measures import toeplitz_covariance
from .seeding import stream_generator

PROMPT_LENGTH, BATCH, DIM = 1000, 128, 6
TRAINING_SHAPE = f"L={PROMPT_LENGTH}, batch {BATCH}, D={DIM}"
PAPER_PROMPT_LENGTHS = list(range(10, 101, 10)) + list(range(200, 1001, 100))  # the authors' 19 lengths
PAPER_STEPS, PAPER_MODELS = 300_000, 2


def paper_cost_hours(seconds_at: dict[int, float]) -> tuple[float, float, float]:
    """Least-squares per-step cost a + b·L from measured (L → seconds); core-hours of config/paper.yaml."""
    import numpy as np

    lengths = np.array(sorted(seconds_at), dtype=float)
    cost = np.array([seconds_at[int(L)] for L in lengths])
    slope, intercept = np.polyfit(lengths, cost, 1)
    total = sum(intercept + slope * L for L in PAPER_PROMPT_LENGTHS) * PAPER_STEPS * PAPER_MODELS
    return float(intercept), float(slope), float(total / 3600.0)


def training_worker(name: str, extra: dict, repeats: int) -> dict:
    """Median seconds of one step: draw a fresh batch, forward, backward, SGD update."""
    dtype = torch.float32 if extra.get("dtype", "float32") == "float32" else torch.float64
    prompt_length = int(extra.get("train_length", PROMPT_LENGTH))
    task = RegressionTask(toeplitz_covariance(DIM - 1, 0.5), 1.0 / (DIM - 1), 0.1)
    params = models.init_parameters(DIM, torch.Generator().manual_seed(0), dtype=dtype)
    for p in params.values():
        p.requires_grad_(True)
    counter = iter(range(10**9))

    def draw():
        return task.sample(BATCH, prompt_length, stream_generator(0, "bench/batch", next(counter)), dtype=dtype)

    def sgd_step(predict):
        query, prompt, target = draw()
        loss = models.mse(predict(params, query, prompt, "softmax"), target)
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for p, g in zip(params.values(), grads):
                p -= 1e-3 * g

    probe = torch.ones(DIM, dtype=dtype)

    def floor():  # the batch's Gaussians, drawn as one tensor, plus one pass over them
        g = torch.randn(BATCH, prompt_length + 1, DIM, generator=stream_generator(0, "bench/floor", next(counter)), dtype=dtype)
        return g @ probe

    fn = {
        "train_efficient": lambda: sgd_step(models.predict),
        "train_naive": lambda: sgd_step(models.predict_naive),
        "train_floor": floor,
    }[name]
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "rss_mb": 0.0, "baseline_rss_mb": 0.0}
