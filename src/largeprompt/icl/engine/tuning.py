"""Per-machine plan of the stacked engine's step (:class:`largeprompt.icl.engine.stacked.Plan`,
docs/performance.md#training-step).

How many prompts go through at a time (per-block overhead against the cache hierarchy) and whether the
exponential is exp or exp2 of log₂e-scaled scores (which is faster depends on the CPU and its math library:
3× apart on an AMD EPYC) change a step's results only by round-off, and their best values depend on the
machine. Like the attention kernel (:mod:`largeprompt.kernel.autotune`), a plan is fixed once per machine and
regime (dtype, device, D, softmax runs S, prompt length L and batch B, counts rounded up to powers of two):

1. ``LARGEPROMPT_TRAINING_PLAN=block=<n>,exp=e|2[,readout=native]`` in the environment wins;
2. else this process's earlier choice (kept with the attention kernels': :func:`largeprompt.kernel.autotune.forget`
   drops both), else the per-machine cache (the attention kernels' file);
3. else every candidate is timed on a synthetic step of the regime (at most TUNING_BATCH prompts; best CPU time of
   interleaved rounds, well under a second) under the cache's lock, and the winner is cached.

The choice is recorded with the attention kernels (:func:`largeprompt.kernel.autotune.kernels_used`) in every
Parquet file's provenance, so a rerun on the same machine is bit-identical, and setting the variable to a
recorded value reproduces another run's bits. Devices other than the CPU get the default plan.
"""
from __future__ import annotations

import math
import os
import time
import warnings

import torch

from largeprompt.icl import models
from largeprompt.icl.engine import native_step, stacked
from largeprompt.kernel import autotune
from largeprompt.kernel.kernel_cache import cache_file, cached_or_tuned

ENV_PLAN = "LARGEPROMPT_TRAINING_PLAN"
PLAN_REVISION = 6  # bump when the step's hot loop changes: plans tuned for an older loop are then retuned
BLOCKS = (4, 8, 16, 32, 64, 128)  # candidate prompts per block (powers of two: the tuned regime's batch rounds up)
ROUNDS = 3
TUNING_BATCH = 256  # prompts of the synthetic step: a block's speed does not depend on the batch around it, and a
# transfer batch (32 768 prompts of L = 1000) would take minutes and gigabytes to time


def regime_key(n_softmax: int, prompt_length: int, batch: int, dim: int, dtype, device) -> str:
    """'training/<dtype>/<device>/D<dim>/s<S>/l<L>/p<B>/r<revision>', counts rounded up to powers of two."""
    up = autotune._pow2_at_least  # noqa: SLF001 (the same buckets as the attention regimes)
    dtype_name = str(dtype).removeprefix("torch.")
    return (f"training/{dtype_name}/{torch.device(device).type}/D{dim}/s{up(n_softmax)}/l{up(prompt_length)}"
            f"/p{up(batch)}/r{PLAN_REVISION}")


def candidates(n_softmax: int, batch: int) -> list[stacked.Plan]:
    """Every block up to the batch, in both bases (linear runs only: no exponential), and the native readout where
    this machine builds it (:mod:`largeprompt.icl.engine.native_step`; it streams every prompt: no blocks, base 2)."""
    blocks = [b for b in BLOCKS if b < batch] + [batch]
    bases = (False, True) if n_softmax else (False,)
    plans = [stacked.Plan(b, base2) for b in blocks for base2 in bases]
    return plans + ([stacked.Plan(batch, bool(n_softmax), native=True)] if native_step.library() is not None else [])


def time_plans(plans, n_softmax: int, prompt_length: int, batch: int, dim: int, dtype) -> dict[stacked.Plan, float]:
    """Best-of-ROUNDS CPU seconds of one loss_and_gradients per plan, S softmax runs and one linear run, on the
    same synthetic batch."""
    gen = torch.Generator().manual_seed(0)
    weights = [models.init_parameters(dim, gen, dtype=dtype) for _ in range(n_softmax + 1)]
    stack = stacked.RunStack.from_parameters(weights, [True] * n_softmax + [False])
    query = torch.randn(batch, dim, generator=gen, dtype=dtype)
    prompt = torch.randn(batch, dim, prompt_length, generator=gen, dtype=dtype).mT  # feature-major, as drawn
    target = torch.randn(batch, generator=gen, dtype=dtype)
    best = {plan: math.inf for plan in plans}
    for _ in range(ROUNDS):
        for plan in plans:
            start = time.process_time()
            stacked.loss_and_gradients(stack, query, prompt, target, plan)
            best[plan] = min(best[plan], time.process_time() - start)
    return best


def _parse_cached(text: str) -> stacked.Plan | None:
    try:
        return stacked.Plan.parse(text)
    except ValueError:
        return None


def tune(n_softmax: int, prompt_length: int, batch: int, dim: int, dtype):
    """The fastest candidate plan and every candidate's best time (s), at the regime's bucket sizes."""
    up = autotune._pow2_at_least  # noqa: SLF001
    S, L, B = (up(n_softmax) if n_softmax else 0), up(prompt_length), min(up(batch), TUNING_BATCH)
    seconds = time_plans(candidates(S, B), S, L, B, dim, dtype)
    return min(seconds, key=seconds.get), seconds


def plan_for(n_softmax: int, prompt_length: int, batch: int, dim: int, dtype, device="cpu") -> stacked.Plan:
    """The plan of a step of ``n_softmax`` softmax runs (module docstring), recorded for provenance."""
    regime = regime_key(n_softmax, prompt_length, batch, dim, dtype, device)
    raw = os.environ.get(ENV_PLAN, "").strip()
    if raw:
        try:
            plan, source = stacked.Plan.parse(raw), "env"
        except ValueError as exc:
            raise ValueError(f"{ENV_PLAN}={raw!r}: {exc}") from None
    elif autotune.recorded(regime) is not None:
        return autotune.recorded(regime)
    elif torch.device(device).type != "cpu":
        plan, source = stacked.default_plan(n_softmax, prompt_length, dim), "default"
    else:
        try:
            plan, source = cached_or_tuned(autotune.machine_key(), regime, "plan", _parse_cached,
                                           lambda: tune(n_softmax, prompt_length, batch, dim, dtype))
        except OSError as exc:  # unwritable cache folder: tune for this process only
            warnings.warn(f"kernel cache {cache_file()} unusable ({exc}); tuning without caching", stacklevel=2)
            plan, source = tune(n_softmax, prompt_length, batch, dim, dtype)[0], "tuned"
    autotune.record(regime, plan, source)
    return plan
