"""Rule ``make_affine_limit_queries``: the query points of R1 along a ray (docs/experiments.md#affine_limit)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.pipeline import settings_from
from largeprompt.io.provenance import provenance


@dataclass(frozen=True)
class Ray:
    """Config ``affine_limit.ray``: the query points z_q = t·e, e = direction/‖direction‖, |t| ≤ t_max."""

    direction: list
    t_max: float
    n_points: int


def ray_queries(ray: Ray) -> pd.DataFrame:
    """One row per query point t·e, t on a uniform grid in [−t_max, t_max]; columns z0…z{D−1}."""
    e = np.asarray(ray.direction, dtype=np.float64)
    e = e / np.linalg.norm(e)
    t = np.linspace(-ray.t_max, ray.t_max, ray.n_points)
    frame = pd.DataFrame({"point": np.arange(ray.n_points), "t": t})
    for j, ej in enumerate(e):
        frame[f"z{j}"] = t * ej
    return frame


def make_affine_limit_queries(inputs, outputs, params, rule="make_affine_limit_queries"):
    """Write results/<run>/affine_limit/queries.parquet."""
    ray = settings_from(Ray, params["affine_limit"]["ray"], "affine_limit.ray")
    write_parquet(ray_queries(ray), outputs["queries"], provenance(rule, params))
