"""Each stage's floor (docs/performance.md#paper-cost): the random numbers it must draw, at the rates of this
machine's samplers measured in the same run, so that a stage's cost over its floor means the same on any machine.

Every draw of the package goes through :mod:`largeprompt.core.seeding`, which counts the numbers drawn per sampler
(``normal/numpy/float64``: numpy's ziggurat; ``normal/torch/float32``: torch's randn; ``uniform/…``, ``bits/…``).
A timed slice reports what it drew; its floor is Σ count × seconds per number of that sampler. The ODE stages
(flows, init_dependence) and the summaries draw nothing: no floor.
"""
from __future__ import annotations

import functools
import math
import time

import numpy as np
import torch

from largeprompt.bench.report import run_worker
from largeprompt.bench.schedule import fit_linear
from largeprompt.core.seeding import draw

SAMPLERS = ("normal/numpy/float64", "normal/torch/float32", "normal/torch/float64", "uniform/numpy/float64",
            "uniform/torch/float32", "uniform/torch/float64", "bits/numpy/int64", "bits/torch/int64")
N_TIMED = 1 << 20  # numbers per timed draw: far past any per-call overhead
ROUNDS = 7


def sampler_seconds() -> dict[str, float]:
    """Seconds per number of every sampler (best CPU time of ROUNDS interleaved draws of N_TIMED numbers), in this
    process: the ``sampler_rates`` worker."""
    gens = {"numpy": np.random.Generator(np.random.SFC64(0)), "torch": torch.Generator().manual_seed(0)}
    best = dict.fromkeys(SAMPLERS, math.inf)
    for _ in range(ROUNDS):
        for name in SAMPLERS:
            start = time.process_time()
            draw(name, N_TIMED, gens[name.split("/")[1]])
            best[name] = min(best[name], time.process_time() - start)
    return {name: seconds / N_TIMED for name, seconds in best.items()}


@functools.lru_cache(maxsize=1)
def rates() -> dict[str, float]:
    """Seconds per number of every sampler, measured once per ``largeprompt bench`` run in a one-thread worker."""
    return run_worker("sampler_rates")


def floor_seconds(drawn: dict[str, float]) -> float:
    """Σ count × seconds per number over the samplers in ``drawn`` (counts, possibly per unit of work)."""
    per_number = rates()
    unknown = set(drawn) - set(per_number)
    if unknown:
        raise ValueError(f"no timed rate for sampler(s) {sorted(unknown)}: add them to largeprompt.bench.floors.SAMPLERS")
    return sum(n * per_number[name] for name, n in drawn.items())


def floor_fit(sizes, runs):
    """The fitted floor a + b·w (seconds) of timed slices ``runs`` at work ``sizes``, each with its ``drawn`` counts."""
    return fit_linear(sizes, [floor_seconds(r["drawn"]) for r in runs])
