"""The outcome of a §6 training run: its final loss, its status, and the modes of the ok runs
(docs/experiments.md#run-status, docs/experiments.md#modes).

A run's status follows from its own outcome, compared within its (model, L):

* ``diverged``: training stopped on a blown-up batch loss;
* ``trapped``: its final test loss exceeds ``loss_ratio`` times the reference, the reference being the
  lowest final loss of the (model, L)'s runs, or for linear attention R(Γ*) if lower (the best risk
  linear attention can reach). The reason is ``no readout`` when its readout |u_y|·‖U_xx‖ is below
  ``readout_fraction`` times that of the best run (it never left the plateau), else ``worse equilibrium``;
* ``unconverged``: not trapped, but still moving at the end: its own test loss changes by more than
  ``unconverged_change`` (relative) over the last ``window`` of its time (:func:`final_change`), so its final loss is
  not an end point;
* ``ok`` otherwise. Means and intervals are over the ok runs only.

The flow of the run's initial weights (:mod:`largeprompt.icl.flow_class`) explains a status; it never decides it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

FINAL_FRACTION = 0.1  # the final loss averages the rows logged in the last tenth of the run's own time
CHANGE_WINDOW = 0.2  # final_change compares the run's last twentieth with the twentieth where its last fifth starts
STATUSES = ("ok", "unconverged", "trapped", "diverged")
TRAP_REASONS = ("no readout", "worse equilibrium")


@dataclass(frozen=True)
class StatusRule:
    """Config ``train.trapped_loss_ratio``, ``train.trapped_readout_fraction`` and ``train.unconverged_change``."""

    loss_ratio: float
    readout_fraction: float
    unconverged_change: float = np.inf


def status_rule(train: dict, model: str) -> StatusRule:
    """The rule of config section ``train`` (keys ``trapped_loss_ratio`` per model, ``trapped_readout_fraction`` and
    ``unconverged_change``; without the last no run is unconverged) for ``model``. The window a run's change is
    measured over, ``convergence_window``, goes to :func:`run_outcome` (:func:`change_window`)."""
    return StatusRule(float(train["trapped_loss_ratio"][model]), float(train["trapped_readout_fraction"]),
                      float(train.get("unconverged_change", np.inf)))


def change_window(train: dict) -> float:
    """Config ``train.convergence_window``: the end of a run over which :func:`final_change` is measured."""
    return float(train.get("convergence_window", CHANGE_WINDOW))


def status_counts(runs: pd.DataFrame) -> dict:
    """``n_ok``, ``n_unconverged``, ``n_trapped``, ``n_diverged``: the runs of each status (STATUSES order)."""
    return {f"n_{status}": int((runs["status"] == status).sum()) for status in STATUSES}


def final_loss(times, losses) -> float:
    """Mean of ``losses`` over the rows logged in the last FINAL_FRACTION of the run's time."""
    times, losses = np.asarray(times, dtype=np.float64), np.asarray(losses, dtype=np.float64)
    return float(losses[times >= (1 - FINAL_FRACTION) * times[-1]].mean())


def final_change(times, losses, window: float = CHANGE_WINDOW) -> float:
    """|m(end) − m(start)| / m(end): m the mean of ``losses`` over a twentieth of the run's time, at its end and where
    its last ``window`` starts (docs/experiments.md#run-status); NaN when the rows are too sparse to tell the two
    apart (both fall back on the same rows)."""
    times, losses = np.asarray(times, dtype=np.float64), np.asarray(losses, dtype=np.float64)
    horizon = times[-1]
    width = horizon / 20

    def rows(t0):  # the rows in [t0, t0 + width], or the row nearest its middle when none was logged there
        inside = (times >= t0 - 1e-12 * horizon) & (times <= t0 + width * (1 + 1e-12))
        return np.flatnonzero(inside) if inside.any() else np.array([np.abs(times - t0 - width / 2).argmin()])

    end, start = rows(horizon - width), rows((1 - window) * horizon)
    if np.array_equal(end, start):
        return float("nan")
    level = losses[end].mean()
    return float(abs(level - losses[start].mean()) / level)


def readout(u_y, norm_U_xx):
    """|u_y|·‖U_xx‖: how strongly the prediction reads the prompt's labels (0 on the plateau's saddle)."""
    return np.abs(np.asarray(u_y, dtype=np.float64)) * np.asarray(norm_U_xx, dtype=np.float64)


def run_outcome(run: pd.DataFrame, keys, window: float = CHANGE_WINDOW) -> dict:
    """Where one run ended, from its trajectory rows: the columns ``keys`` of its last row, its readout, whether it
    diverged, its final test loss and R∞ (:func:`final_loss`; where it blew up, for a diverged run) and how much its
    test loss still moves at the end (:func:`final_change` over ``window``; NaN if it diverged)."""
    run = run.sort_values("step")
    last = run.iloc[-1]
    row = {k: last[k] for k in keys}
    row["readout"] = float(readout(last["u_y"], last["norm_U_xx"]))
    row["diverged"] = bool((run["status"] == "diverged").any())
    if row["diverged"]:
        row["final_test_loss"], row["final_infinite_prompt_risk"] = float(last["test_loss"]), float(last["infinite_prompt_risk"])
        row["final_change"] = np.nan
    else:
        row["final_test_loss"] = final_loss(run["time"], run["test_loss"])
        row["final_infinite_prompt_risk"] = final_loss(run["time"], run["infinite_prompt_risk"])
        row["final_change"] = final_change(run["time"], run["test_loss"], window)
    return row


def judge(runs: pd.DataFrame, rule: StatusRule, theory_floor: float = np.inf) -> pd.DataFrame:
    """Status of the runs of one (model, L) (module docstring).

    ``runs`` has columns final_test_loss, readout and diverged (bool), and final_change where the runs' ends are
    checked (without it, or where it is NaN, no run is unconverged); ``theory_floor`` is the lowest risk the
    model can reach in theory (R(Γ*) for linear attention; +inf where none is known). Returns columns
    status, trap_reason (None for ok and diverged runs) and reference_loss, on the index of ``runs``.
    """
    alive = runs[~runs["diverged"]]
    out = pd.DataFrame(index=runs.index)
    out["status"], out["trap_reason"] = np.where(runs["diverged"], "diverged", "ok"), None
    out["reference_loss"] = np.nan
    if alive.empty:
        return out
    best = alive["final_test_loss"].idxmin()
    reference = min(float(alive.loc[best, "final_test_loss"]), float(theory_floor))
    out["reference_loss"] = reference
    worse = ~runs["diverged"] & (runs["final_test_loss"] > rule.loss_ratio * reference)
    out.loc[worse, "status"] = "trapped"
    no_readout = runs["readout"] < rule.readout_fraction * float(alive.loc[best, "readout"])
    out.loc[worse, "trap_reason"] = np.where(no_readout[worse], "no readout", "worse equilibrium")
    if "final_change" in runs:
        moving = ~runs["diverged"] & ~worse & (runs["final_change"] > rule.unconverged_change)
        out.loc[moving, "status"] = "unconverged"
    return out


@dataclass(frozen=True)
class Modes:
    """The ok runs' final losses as one mode, or split into a lower and an upper mode at their largest gap."""

    n_modes: int
    lower_mean: float = np.nan
    lower_runs: int = 0
    upper_mean: float = np.nan
    upper_runs: int = 0


def split_modes(values, gap_factor: float) -> Modes:
    """Two modes when the largest gap between consecutive sorted ``values`` exceeds ``gap_factor`` times the
    wider of the two groups it separates, each holding at least two runs (docs/experiments.md#modes)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    if len(v) < 4:
        return Modes(1)
    gaps = np.diff(v)[1:-1]  # gaps leaving at least two runs on each side
    cut = int(np.argmax(gaps)) + 2  # lower = v[:cut], upper = v[cut:]
    lower, upper = v[:cut], v[cut:]
    width = max(lower[-1] - lower[0], upper[-1] - upper[0])
    if gaps.max() <= gap_factor * width:
        return Modes(1)
    return Modes(2, float(lower.mean()), len(lower), float(upper.mean()), len(upper))
