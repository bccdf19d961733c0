"""Pure helpers of the cost extrapolation: linear cost fits and list scheduling of a DAG's jobs on N cores."""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np


def fit_linear(units, seconds) -> tuple[float, float]:
    """(a, b) of the least-squares line seconds ≈ a + b·units, both ≥ 0: a negative intercept is noise (refitted
    through 0), and so is a negative slope (the cost does not fall with the work: its mean, as a constant).

    With a single point, the line through the origin.
    """
    x, y = np.asarray(units, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if x.shape != y.shape or x.size == 0:
        raise ValueError("fit_linear needs as many costs as work sizes, at least one")
    if x.size > 1 and np.ptp(x) > 0:
        b, a = np.polyfit(x, y, 1)
        if b < 0:
            return float(max(0.0, y.mean())), 0.0
        if a >= 0:
            return float(a), float(b)
    return 0.0, float(max(0.0, (x @ y) / (x @ x)))


def predict_linear(fit: tuple[float, float], units) -> float:
    """a + b·units of a :func:`fit_linear` result."""
    a, b = fit
    return float(a + b * float(units))


@dataclass(frozen=True)
class Job:
    """One job of the DAG: its stage, its cost in CPU seconds on one core, and the stages it waits for."""

    name: str
    stage: str
    seconds: float
    after: tuple[str, ...] = field(default=())
    floor: float | None = None  # CPU seconds of the random numbers it must draw (bench.floors); None: none


def schedule(jobs: list[Job], cores: int) -> float:
    """Wall seconds of the DAG on ``cores`` one-thread slots: list scheduling, longest ready job first.

    A job is ready once every job of each stage in its ``after`` has finished (as Snakemake starts a job once
    its inputs exist); a free core takes the longest ready job.
    """
    if cores < 1:
        raise ValueError(f"cores must be ≥ 1, got {cores}")
    stages = {j.stage for j in jobs}
    missing = {s for j in jobs for s in j.after} - stages
    if missing:
        raise ValueError(f"jobs wait for stages that have no job: {sorted(missing)}")
    left = {s: sum(1 for j in jobs if j.stage == s) for s in stages}  # unfinished jobs per stage
    waiting, ready, running = list(jobs), [], []  # running: heap of (finish time, tie, job)
    now, tie = 0.0, 0
    while waiting or ready or running:
        still = []
        for job in waiting:
            (heapq.heappush(ready, (-job.seconds, job.name, job)) if all(left[s] == 0 for s in job.after)
             else still.append(job))
        waiting = still
        while ready and len(running) < cores:
            _, _, job = heapq.heappop(ready)
            heapq.heappush(running, (now + job.seconds, tie, job))
            tie += 1
        if not running:
            raise ValueError("the jobs' stage dependencies form a cycle")
        now, _, done = heapq.heappop(running)
        left[done.stage] -= 1
    return now


def critical_path(jobs: list[Job]) -> float:
    """The longest chain of job costs through the stage dependencies: the wall time on unlimited cores."""
    finish: dict[str, float] = {}
    pending = list(jobs)
    while pending:
        done_stages = {s for s in {j.stage for j in jobs} if s not in {p.stage for p in pending}}
        now = [j for j in pending if set(j.after) <= done_stages]
        if not now:
            raise ValueError("the jobs' stage dependencies form a cycle")
        for j in now:
            start = max((finish[s] for s in j.after), default=0.0)
            finish[j.stage] = max(finish.get(j.stage, 0.0), start + j.seconds)
        pending = [j for j in pending if j not in now]
    return max(finish.values(), default=0.0)
