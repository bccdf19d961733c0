"""Rule ``flow_beyond_gaussian`` (docs/experiments.md#beyond_gaussian): the infinite-prompt flows of softmax on one token
measure's limit from every R6 seed's initial weights, with the sharpness that sets the runs' step sizes and the stated
quadrature error. Linear attention's limit is the Gaussian closed form for every measure: the gaussian file also holds
its flows (the same as Gaussian softmax's), and the R6 runs of every measure read them there."""
from __future__ import annotations

import numpy as np
import pandas as pd

from largeprompt.icl.beyond_gaussian import flow_rows, measure_task
from largeprompt.icl.bounded_risk import icl_quadrature
from largeprompt.io.parquet_io import write_parquet
from largeprompt.io.provenance import provenance


def flow_beyond_gaussian(inputs, outputs, params, rule="flow_beyond_gaussian"):
    """Write results/<run>/beyond_gaussian/<measure>/flows.parquet: one row per (model, seed, grid time)."""
    section, measure = params["beyond_gaussian"], params["token_measure"]
    task = measure_task(section, measure)
    seeds = section["train"]["seeds"]
    times = np.linspace(0.0, float(section["train"]["horizon"]), int(section["flow_points"]))
    tol = {k: params["infinite"][k] for k in ("rtol", "atol")}
    frames = []
    for seed in seeds:
        softmax = flow_rows(task, "softmax", seed, params["seed"], times, tol, icl_quadrature(section))
        # linear attention's limit is the Gaussian closed form for every measure, that of Gaussian softmax: its flows
        # are in the gaussian file only (the rows of both models there are one flow)
        flows = (softmax, softmax.assign(model="linear")) if measure == "gaussian" else (softmax,)
        for f in flows:
            last = f.iloc[-1]
            print(f"{measure} {last['model']:8s} seed {seed}: R_inf {f['infinite_prompt_risk'].iloc[0]:.4f} -> "
                  f"{last['infinite_prompt_risk']:.6f} at t = {times[-1]:g}, |U_xx| {last['norm_U_xx']:.3f}, "
                  f"the flow {last['flow_class']}; quadrature error <= {f['quadrature_error'].max():.2e}")
        frames += list(flows)
    frame = pd.concat(frames, ignore_index=True).assign(token_measure=measure)
    write_parquet(frame, outputs["flows"], provenance(rule, params, base_seed=params["seed"], run_seeds=list(seeds)))
