"""Rule ``balanced_flow`` (R5, paper Thm 5.1; docs/theory.md#balanced-flow): the (A, b) flow for several balanced
starts α, to the Bayes point."""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from largeprompt.icl.dynamics import balanced_flow as balanced_flow_path
from largeprompt.icl.dynamics import bayes_point
from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.provenance import provenance
from largeprompt.maths.measures import toeplitz_covariance


def balanced_flow(inputs, outputs, params, rule="balanced_flow"):
    """Write results/<run>/infinite/balanced_flow.parquet: R∞(t), b(t), ‖A(t)‖_F for each α, and the Bayes point."""
    icl, cfg = params["icl"], params["infinite"]["balanced_flow"]
    sigma = toeplitz_covariance(icl["dim"], icl["covariance_rho"], dtype=torch.float64).numpy()
    b_star, A_star = bayes_point(sigma)
    times = np.linspace(0.0, cfg["horizon"], cfg["n_times"])
    tol = {k: params["infinite"][k] for k in ("rtol", "atol")}
    frames = []
    for alpha in cfg["alphas"]:
        A, b, risk = balanced_flow_path(sigma, alpha, times, **tol)
        frames.append(pd.DataFrame({
            "alpha": float(alpha),
            "time": times,
            "infinite_prompt_risk": risk,  # R∞ along the flow
            "b": b,
            "norm_A": np.linalg.norm(A, axis=(1, 2)),
            "distance_to_bayes": np.sqrt((b - b_star) ** 2 + ((A - A_star) ** 2).sum(axis=(1, 2))),
            "b_star": b_star,
            "norm_A_star": float(np.linalg.norm(A_star)),
        }))
        print(f"alpha={alpha}: b(T)={b[-1]:.6f} (b*={b_star:.6f}), R(T)={risk[-1]:.3e}")
    write_parquet(pd.concat(frames, ignore_index=True), outputs["flow"], provenance(rule, params))


