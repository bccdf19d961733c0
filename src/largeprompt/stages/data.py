"""Stage 1, data generation: the fixed query points for R1–R3 (SPEC §3.1 stage 1)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..parquet_io import write_parquet
from ..provenance import provenance


def ray_queries(direction, t_max: float, n_points: int) -> pd.DataFrame:
    """Query points z_q = t·e on a ray, e = direction/‖direction‖, t on a uniform grid in [−t_max, t_max]."""
    e = np.asarray(direction, dtype=np.float64)
    e = e / np.linalg.norm(e)
    t = np.linspace(-t_max, t_max, n_points)
    frame = pd.DataFrame({"experiment": "affine_limit", "point": np.arange(n_points), "t": t})
    for j, ej in enumerate(e):
        frame[f"z{j}"] = t * ej
    return frame


def make_queries(inputs, outputs, params, rule="make_queries"):
    """Write results/data/queries.parquet: one row per query point, columns z0…z{D−1}."""
    ray = params["ray"]
    frame = ray_queries(ray["direction"], ray["t_max"], ray["n_points"])
    write_parquet(frame, outputs["queries"], provenance(rule, params, seed=None))
