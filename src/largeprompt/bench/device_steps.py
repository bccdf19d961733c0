"""The engine's training step on an accelerator (docs/performance.md#training-gpu): ``python -m
largeprompt.bench.device_steps [--out FILE]`` times, on cuda (when there is one) and on one CPU thread, the step of
2 and 18 runs (the authors' stack and the multi-seed paper stack) at L = 10, 100, 1000, and its two parts: the
draw with its copy to the device, and ``loss_and_gradients`` on a batch already there; on cuda also the transfer
runs' float64 step (batch 32 768, L = 1000). Mean wall time after warm-ups, synchronised."""
from __future__ import annotations

import argparse
import json
import time

import torch

from largeprompt.bench import training
from largeprompt.icl.engine import stacked, tuning
from largeprompt.icl.engine.runs import batch

RUNS = {"2 runs": training.PAPER_RUNS, "18 runs": training.MULTI_SEED_RUNS}
TRANSFER = (32768, "float64")  # config/paper.yaml's transfer batch, in float64


def mean_seconds(fn, n: int, device: str) -> float:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - start) / n


def step_row(device: str, label: str, L: int, batch_size: int, dtype: str, n: int) -> dict:
    """One timed configuration: the whole step, its loss and gradients, its draw and copy (ms)."""
    stepper = training.trainer(L, RUNS[label], dtype, batch_size, training.TASK, device)
    task, specs, step = stepper.task, stepper.specs, training.stepping(stepper)
    query, prompt, target = batch(task, 0, 0, 0, batch_size, L, stepper.dtype, device)
    plan = tuning.plan_for(sum(s.model == "softmax" for s in specs), L, batch_size, task.token_dim, stepper.dtype, device)
    return dict(device=device, runs=label, L=L, batch=batch_size, dtype=dtype,
                step_ms=1e3 * mean_seconds(step, n, device),
                loss_and_gradients_ms=1e3 * mean_seconds(
                    lambda: stacked.loss_and_gradients(stepper.stack, query, prompt, target, plan), n, device),
                draw_and_copy_ms=1e3 * mean_seconds(
                    lambda: batch(task, 0, 0, 0, batch_size, L, stepper.dtype, device), n, device))


def device_rows(devices=("cuda", "cpu"), lengths=(10, 100, 1000), n: int = 50) -> list[dict]:
    """Every timed configuration on each of ``devices`` there is (the CPU with one thread, as a pipeline job)."""
    rows, threads = [], torch.get_num_threads()
    for device in devices:
        if device == "cuda" and not torch.cuda.is_available():
            continue
        torch.set_num_threads(1 if device == "cpu" else threads)
        for label in RUNS:
            for L in lengths:
                rows.append(step_row(device, label, L, 128, "float32", n))
                print(rows[-1], flush=True)
        if device == "cuda" and max(lengths) >= 1000:
            rows.append(step_row(device, "18 runs", 1000, *TRANSFER, n=5))
            print(rows[-1], flush=True)
    torch.set_num_threads(threads)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the rows as JSON to this file")
    args = parser.parse_args(argv)
    rows = device_rows()
    info = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "torch": torch.__version__}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({**info, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
