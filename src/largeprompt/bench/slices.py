"""Workers of ``largeprompt bench --paper``: run one pipeline stage on given params in this fresh process and
report its CPU seconds and the process's peak RSS; or write the inputs such a run reads.

``stage_prepare`` writes inputs (queries, test set, synthetic error tables of the schema of ``simulate_concentration_errors``)
in one process; ``stage_run`` then runs the stage on them in another, so that preparing never counts in the
measured peak. ``stage_run`` calls the stage as ``runlog.run_stage`` does (threads, allocator), stdout discarded.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from largeprompt.bench.report import peak_rss_mb
from largeprompt.core.seeding import DRAWN
from largeprompt.icl.test_set import load_test_set as cut
from largeprompt.io.parquet_io import read_parquet, write_parquet
from largeprompt.io.runlog import keep_freed_memory, set_threads
from largeprompt.maths.rate_tables import TABLES

STAGES = {  # rule → (module, function, output names)
    "make_affine_limit_queries": ("largeprompt.stages.make_affine_limit_queries", "make_affine_limit_queries", ["queries"]),
    "make_icl_test_set": ("largeprompt.stages.make_icl_test_set", "make_icl_test_set", ["test_set"]),
    "bayes_risk": ("largeprompt.stages.bayes_risk", "bayes_risk", ["bayes_risk"]),
    "simulate_affine_limit": ("largeprompt.stages.simulate_affine_limit", "simulate_affine_limit", ["outputs", "bands"]),
    "simulate_concentration_errors": ("largeprompt.stages.simulate_concentration_errors", "simulate_concentration_errors", ["errors"]),
    "collect_concentration_errors": ("largeprompt.stages.collect_concentration_errors", "collect_concentration_errors",
                                     ["output_errors", "gradient_errors"]),
    "estimate_concentration_rates": ("largeprompt.stages.estimate_concentration_rates", "estimate_concentration_rates",
                                     list(TABLES)),
    "simulate_fixed_query_bound": ("largeprompt.stages.simulate_fixed_query_bound", "simulate_fixed_query_bound", ["quantiles"]),
    "full_model_flow": ("largeprompt.stages.full_model_flow", "full_model_flow", ["flow"]),
    "balanced_flow": ("largeprompt.stages.balanced_flow", "balanced_flow", ["flow"]),
    "reduced_model": ("largeprompt.stages.reduced_model", "reduced_model", ["result"]),
    "train": ("largeprompt.stages.train", "train", ["trajectories"]),
    "simulate_init_dependence": ("largeprompt.stages.simulate_init_dependence", "simulate_init_dependence", ["flows"]),
    "flow_beyond_gaussian": ("largeprompt.stages.flow_beyond_gaussian", "flow_beyond_gaussian", ["flows"]),
    "load_test_set": ("largeprompt.bench.slices", "load_test_set", []),  # what every training job reads first
    "plot_affine_limit": ("largeprompt.plots.affine_limit", "plot_affine_limit", ["pdf", "png"]),
}


def stage_function(rule: str):
    module, function, _ = STAGES[rule]
    return getattr(importlib.import_module(module), function)


def load_test_set(inputs, outputs, params, rule="load_test_set"):
    """A training job's first step: read the test set and cut it at params['prompt_length'] (float32)."""

    return cut(read_parquet(inputs["test_set"]), int(params["prompt_length"]), dtype=torch.float32)


def synthetic_errors(measure: str, c: float, lengths: list[int], n_repetitions: int, seed: int = 0) -> pd.DataFrame:
    """A table of the schema of ``simulate_concentration_errors`` (one row per (L, repetition)) with positive errors ∝ 1/L.

    For timing and memory only: its values are random, of the right size and type.
    """
    rng = np.random.default_rng([seed, int(c * 1e6), len(measure)])
    n_l = len(lengths)
    scale = 1.0 / np.tile(np.asarray(lengths, dtype=np.float64), n_repetitions)
    def noisy():
        return scale * rng.chisquare(2.0, size=n_l * n_repetitions)
    return pd.DataFrame({
        "token_measure": measure, "c": float(c), "sigma_sq": float(c), "u": 1.0,
        "prompt_length": np.tile(np.asarray(lengths, dtype=np.int64), n_repetitions),
        "repetition": np.repeat(np.arange(n_repetitions, dtype=np.int64), n_l),
        "kappa": np.repeat(rng.chisquare(2.0, size=n_repetitions), n_l),
        "output_sq_error": noisy(), "grad_U_sq_error": noisy(), "grad_V_sq_error": noisy(),
    })


def prepare(kind: str, folder: Path, spec: dict) -> dict:
    """Write the inputs ``kind`` into ``folder``: ``queries``, ``test_set`` (by running their stages on
    spec['params']) or ``errors`` (synthetic simulate_concentration_errors files, one per (measure, c) in spec['cells'])."""

    folder.mkdir(parents=True, exist_ok=True)
    if kind in ("queries", "test_set"):
        rule = "make_affine_limit_queries" if kind == "queries" else "make_icl_test_set"
        path = folder / f"{kind}.parquet"
        stage_function(rule)({}, {kind: str(path)}, spec["params"], rule=rule)
        return {kind: str(path)}
    if kind == "errors":
        jobs = []
        for measure, c in spec["cells"]:
            path = folder / f"errors_{measure}_c{c:g}.parquet"
            write_parquet(synthetic_errors(measure, c, spec["lengths"], spec["n_repetitions"]), path, {"rule": "bench"})
            jobs.append(str(path))
        return {"jobs": jobs}
    raise ValueError(f"unknown input kind {kind!r}")


def run(rule: str, inputs: dict, folder: Path, params: dict) -> dict:
    """CPU seconds of ``rule``'s stage on ``inputs`` and ``params`` (outputs into ``folder``), and the peak RSS."""

    set_threads(1)
    keep_freed_memory()
    outputs = {name: str(folder / f"{name}.{name if name in ('pdf', 'png') else 'parquet'}") for name in STAGES[rule][2]}
    fn = stage_function(rule)
    DRAWN.clear()
    start = time.process_time()
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        fn(inputs, outputs, params, rule=rule)
    return {"cpu": time.process_time() - start, "rss_mb": peak_rss_mb(), "drawn": dict(DRAWN)}


def worker(name: str, extra: dict) -> dict:
    """``stage_prepare`` (extra: kind, folder, spec) or ``stage_run`` (extra: rule, inputs, folder, params)."""
    if name == "stage_prepare":
        return prepare(extra["kind"], Path(extra["folder"]), extra["spec"])
    if name == "stage_run":
        return run(extra["rule"], extra["inputs"], Path(extra["folder"]), extra["params"])
    raise ValueError(f"unknown benchmark worker {name!r}")
