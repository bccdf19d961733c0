"""Benchmark (not a test) of one SGD step of the §6 model (SPEC §4 "Training step").

Prints steps/s at batch 128, D = 6 for the efficient step (U = KᵀQ/√D and the weighted token mean),
the naive Q/K/V/O step, and the floor: drawing the batch's Gaussians plus one pass over it.
Then extrapolates the cost of config/paper.yaml (19 L × 2 models × steps) on this machine.

    .venv/bin/python benchmarks/train_step.py [--dtype float32] [--threads 1] [--lengths 10 100 1000]
"""
from __future__ import annotations

import argparse
import time

import torch

from largeprompt import models
from largeprompt.icl import RegressionTask
from largeprompt.measures import toeplitz_covariance
from largeprompt.seeding import stream_generator

DTYPES = {"float32": torch.float32, "float64": torch.float64}
PAPER_LENGTHS = list(range(10, 101, 10)) + list(range(200, 1001, 100))


def time_steps(task, L, batch, dtype, forward, n):
    params = {k: v.to(dtype).requires_grad_(True) for k, v in models.init_parameters(6, stream_generator(0, "bench/init")).items()}
    def step(s):
        q, p, y = task.sample(batch, L, stream_generator(0, "bench/batch", s), dtype=dtype)
        if forward is None:  # floor: the Gaussians plus one pass over the prompt
            return float((p @ q.unsqueeze(-1)).sum())
        loss = models.mse(forward(params, q, p, "softmax"), y)
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for w, g in zip(params.values(), grads):
                w -= 1e-3 * g
    step(0)
    t0 = time.perf_counter()
    for s in range(1, n + 1):
        step(s)
    return (time.perf_counter() - t0) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lengths", type=int, nargs="+", default=[10, 100, 1000])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    task = RegressionTask(toeplitz_covariance(5, 0.5, dtype=torch.float64), 0.2, 0.1)
    cost = {}
    for L in args.lengths:
        floor = time_steps(task, L, args.batch, dtype, None, args.steps)
        fast = time_steps(task, L, args.batch, dtype, models.predict, args.steps)
        naive = time_steps(task, L, args.batch, dtype, models.predict_naive, args.steps)
        cost[L] = fast
        print(f"L={L:5d} batch={args.batch} {args.dtype}: efficient {fast * 1e3:7.3f} ms ({1 / fast:7.1f} steps/s), "
              f"naive {naive * 1e3:7.3f} ms, floor {floor * 1e3:7.3f} ms; efficient/floor {fast / floor:4.2f}, naive/efficient {naive / fast:4.2f}")
    if len(cost) >= 2:
        Ls = sorted(cost)
        slope = (cost[Ls[-1]] - cost[Ls[0]]) / (Ls[-1] - Ls[0])
        base = cost[Ls[0]] - slope * Ls[0]
        total = sum(base + slope * L for L in PAPER_LENGTHS) * 2 * 300_000
        print(f"per-step model: {base * 1e3:.3f} ms + {slope * 1e6:.3f} µs·L; paper.yaml (19 L × 2 models × 300k steps, "
              f"batch {args.batch}): {total / 3600:.1f} core-hours on this machine (excluding test-loss logging)")


if __name__ == "__main__":
    main()
