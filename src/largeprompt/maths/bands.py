"""Mean and central percentile band of a value over repetitions, per group (docs/experiments.md#affine_limit: the
band over prompts that the R1 figure draws)."""
from __future__ import annotations

import pandas as pd


def percentile_bands(frame: pd.DataFrame, keys: list[str], value: str, level: float = 0.90) -> pd.DataFrame:
    """One row per group of ``keys``: the mean of ``value``, its empirical (1 − level)/2 and (1 + level)/2 quantiles
    (linear interpolation) as ``<value>_lo`` and ``<value>_hi``, and the group's size ``n``."""
    if not 0 < level < 1:
        raise ValueError(f"percentile band: level must be in (0, 1), got {level}")
    grouped = frame.groupby(keys, sort=True)[value]
    out = grouped.agg(["mean", "size"]).rename(columns={"mean": f"{value}_mean", "size": "n"})
    out[f"{value}_lo"] = grouped.quantile((1 - level) / 2)
    out[f"{value}_hi"] = grouped.quantile((1 + level) / 2)
    return out.reset_index()
