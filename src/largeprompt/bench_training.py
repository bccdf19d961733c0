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


def training_worker(name: str, extra: dict, repeats: int) -> dict:
    """Median seconds of one step: draw a fresh batch, forward, backward, SGD update."""
    dtype = torch.float32 if extra.get("dtype", "float32") == "float32" else torch.float64
    task = RegressionTask(toeplitz_covariance(DIM - 1, 0.5), 1.0 / (DIM - 1), 0.1)
    params = models.init_parameters(DIM, torch.Generator().manual_seed(0), dtype=dtype)
    for p in params.values():
        p.requires_grad_(True)
    counter = iter(range(10**9))

    def draw():
        return task.sample(BATCH, PROMPT_LENGTH, stream_generator(0, "bench/batch", next(counter)), dtype=dtype)

    def sgd_step(predict):
        query, prompt, target = draw()
        loss = models.mse(predict(params, query, prompt, "softmax"), target)
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for p, g in zip(params.values(), grads):
                p -= 1e-3 * g

    probe = torch.ones(DIM, dtype=dtype)

    def floor():  # the batch's Gaussians, drawn as one tensor, plus one pass over them
        g = torch.randn(BATCH, PROMPT_LENGTH + 1, DIM, generator=stream_generator(0, "bench/floor", next(counter)), dtype=dtype)
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
