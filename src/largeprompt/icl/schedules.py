"""Step-size rules of §6 training; the clock is t = Σ_k lr_k (docs/theory.md#sgd-stability).

Plain SGD with step lr follows the gradient flow only where lr · λ < 2, λ being the largest
Hessian eigenvalue (the sharpness) of the risk. The pipeline knows λ(t) along each run's own
infinite-prompt flow, so the ``flow_sharpness`` rule takes

    lr_k = min(lr_max, f · 2 / λ̂(t_k)),   λ̂(t) = max of λ over the flow-grid cells that meet [t, t + lr_max],

with f < 1 (``stability_fraction``): every step stays a factor f inside the stability limit of the
flow it tracks, and the look-ahead covers the growth of λ within one step. A decay cap then lowers
the step geometrically from lr_max at t = a₀T to ``final_lr`` at t = a₁T and holds it there: plain
SGD with step η sits O(η) above the minimum it hovers around, and the decay removes that bias before
the last part of the horizon, over which convergence is judged. The ``constant`` rule is the paper's
plain SGD, lr_k = lr. Both stop exactly at the horizon T (the last step is shortened).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

RULES = ("constant", "flow_sharpness")


def constant_schedule(lr: float, horizon: float) -> np.ndarray:
    """lr_k = lr for ⌈T/lr⌉ steps, the last one shortened so that Σ lr_k = T."""
    n = max(1, math.ceil(horizon / lr - 1e-9))
    steps = np.full(n, float(lr))
    steps[-1] = horizon - lr * (n - 1)
    return steps


@dataclass(frozen=True)
class Decay:
    """The decay cap: lr_max until start·T, geometric down to final_lr at end·T, then final_lr."""

    start: float = 1.0
    end: float = 1.0
    final_lr: float = float("inf")

    def cap(self, t: float, lr_max: float, horizon: float) -> float:
        a, b = self.start * horizon, self.end * horizon
        if t <= a or self.final_lr >= lr_max:
            return lr_max
        if t >= b:
            return self.final_lr
        return lr_max * (self.final_lr / lr_max) ** ((t - a) / (b - a))


def flow_sharpness_schedule(lr_max: float, horizon: float, times, sharpness, stability_fraction: float,
                            decay: Decay = Decay()) -> np.ndarray:
    """The ``flow_sharpness`` rule (module docstring) on a flow sampled at ``times`` [G] with ``sharpness`` [G].

    ``times`` must start at 0 and reach the horizon; λ between grid points is bounded by the larger end.
    """
    times, sharpness = np.asarray(times, dtype=np.float64), np.asarray(sharpness, dtype=np.float64)
    if times[0] > 0 or times[-1] < horizon * (1 - 1e-12):
        raise ValueError(f"the flow grid covers [{times[0]}, {times[-1]}], not the training horizon [0, {horizon}]")
    if not np.all(np.isfinite(sharpness)) or np.any(sharpness <= 0):
        raise ValueError("the flow's sharpness must be finite and positive on its whole grid")
    grid, lam = times.tolist(), sharpness.tolist()
    out, t, end, last_cell = [], 0.0, horizon * (1 - 1e-12), len(grid) - 1
    while t < end:
        first = max(bisect.bisect_right(grid, t) - 1, 0)
        last = min(bisect.bisect_left(grid, min(t + lr_max, horizon)), last_cell)
        step = min(decay.cap(t, lr_max, horizon), 2.0 * stability_fraction / max(lam[first:last + 1]))
        if t + step >= end:  # the last step lands exactly on the horizon (no round-off sliver after it)
            step = horizon - t
        out.append(step)
        t += step
    return np.asarray(out)


def step_sizes(rule: str, lr: float, horizon: float, stability_fraction: float = 1.0, flow=None,
               decay: Decay = Decay()) -> np.ndarray:
    """lr_k for one run: ``flow`` = (times, sharpness) of its own infinite-prompt flow for ``flow_sharpness``."""
    if rule == "constant":
        return constant_schedule(lr, horizon)
    if rule == "flow_sharpness":
        if flow is None:
            raise ValueError("the flow_sharpness rule needs the run's infinite-prompt flow")
        return flow_sharpness_schedule(lr, horizon, *flow, stability_fraction, decay)
    raise ValueError(f"config key 'train.step_size_rule' = {rule!r}: allowed {', '.join(RULES)}")


def stability_margin(step_sizes: np.ndarray, times, sharpness) -> float:
    """max_k lr_k · λ(t_k) along the run, λ interpolated on the flow grid: below 2 means stable."""
    clock = np.concatenate([[0.0], np.cumsum(step_sizes)[:-1]])
    lam = np.interp(clock, np.asarray(times, dtype=np.float64), np.asarray(sharpness, dtype=np.float64))
    return float(np.max(step_sizes * lam))


def estimated_steps(rule: str, lr: float, horizon: float, stability_fraction: float = 1.0, final_lr: float = float("inf"),
                    sharpness_growth: float = 2.0) -> int:
    """An upper estimate of a run's step count before its flow is known (for cluster time limits).

    ``flow_sharpness``: T/lr for the start plus ∫ λ(t)/(2f) dt with λ(t) ≤ sharpness_growth · t, the
    fastest growth seen on the default seeds (docs/experiments.md#training-protocol).
    """
    if rule == "constant":
        return math.ceil(horizon / lr)
    return math.ceil(horizon / min(lr, final_lr) + sharpness_growth * horizon**2 / (4 * stability_fraction))
