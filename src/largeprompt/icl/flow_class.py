"""The stated rule that classifies a gradient flow of R∞ (docs/experiments.md#flow-classes,
docs/theory.md#drifting-flows).

A flow from torch-default weights starts on a plateau near R∞(0) and leaves it when it starts reading
the label coordinate. Its class over the horizon [0, T]:

* ``plateau``: R∞ never falls below the plateau midpoint ½(R∞(0) + σ²) before T;
* ``drifts``: it escapes, and at T det(u_y M_x) < 0. Every minimiser of R∞ has u_y M_x = Λ⁻¹, so
  det(u_y M_x) = det Λ⁻¹ > 0 there: a flow that stays where the determinant is negative can approach
  σ² only with weights that grow without bound;
* ``converges``: it escapes and det(u_y M_x) > 0 at T (it settles at a minimiser).

The escape time is the first logged time below the plateau midpoint; the training summary times the
escape of each run against the same threshold.
"""
from __future__ import annotations

import numpy as np

FLOW_CLASSES = ("converges", "drifts", "plateau")


def plateau_threshold(start_risk: float, noise_variance: float) -> float:
    """½(R∞(0) + σ²): halfway from the plateau to the infimum σ² of R∞."""
    return 0.5 * (float(start_risk) + float(noise_variance))


def escape_time(times, risks, threshold: float) -> float:
    """The first time at which ``risks`` falls below ``threshold`` (NaN if it never does)."""
    below = np.flatnonzero(np.asarray(risks) < threshold)
    return float(np.asarray(times)[below[0]]) if len(below) else float("nan")


def classify_flow(times, risks, readout_determinant, noise_variance: float) -> tuple[str, float]:
    """(class, escape time) of one flow logged at ``times`` [G] (increasing; the last is the horizon T) with
    R∞ ``risks`` [G] and det(u_y M_x) ``readout_determinant`` [G] (module docstring)."""
    risks = np.asarray(risks, dtype=np.float64)
    escape = escape_time(times, risks, plateau_threshold(risks[0], noise_variance))
    if np.isnan(escape):
        return "plateau", escape
    return ("drifts" if float(np.asarray(readout_determinant)[-1]) < 0 else "converges"), escape
