"""Rule ``summarize_beyond_gaussian`` (docs/experiments.md#beyond_gaussian): per token measure, R4 (each transfer run's
sup-distance to the flow of its own model's limit, the floors and the slope over L), R6 (every run's outcome and
status, the statistics per L against R(Γ*) and the Bayes risk), and what the limit predicts (softmax's L = ∞ optimum or
infimum and its profile along the attention scale, beside where its converging flows end)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from largeprompt.icl.beyond_gaussian import flow_end_scales, measure_task, measure_test_set, prompt_length_stats, run_outcomes
from largeprompt.icl.bounded_optima import scale_profile, softmax_optimum
from largeprompt.icl.bounded_risk import icl_quadrature, limit_risk
from largeprompt.icl.sgd_excess import run_excesses
from largeprompt.icl.test_set import load_test_set, reference_risks
from largeprompt.icl.trajectory_transfer import full_model_gaps, slopes, with_floor_threshold
from largeprompt.io.parquet_io import read_parquet, write_parquet
from largeprompt.io.provenance import provenance

PROFILE_SCALES = np.geomspace(0.01, 3.0, 61)  # attention scales c of the L = ∞ profile


def references(params, measures, lengths) -> pd.DataFrame:
    """One row per (measure, L): Bayes risk, R(Γ*) in closed form and on the test prompts (as the training rows)."""
    section, rows = params["beyond_gaussian"], []
    for measure in measures:
        task = measure_task(section, measure)
        test = load_test_set(measure_test_set(params, task, max(lengths)))
        for L in lengths:
            rows.append({"token_measure": measure, **reference_risks(task, test, L, task.noise_variance / task.task_variance)})
    return pd.DataFrame(rows)


def transfer_tables(params, trajectories: pd.DataFrame):
    """(gaps, slopes) of the transfer runs, per measure against the flows of each model's limit."""
    section, parts = params["beyond_gaussian"], []
    tol = {k: params["infinite"][k] for k in ("rtol", "atol")}
    lr = float(params["trajectory_transfer"]["lr"])
    for measure, runs in trajectories.groupby("token_measure"):
        task = measure_task(section, measure)
        risks = {m: limit_risk(task, m, icl_quadrature(section)) for m in runs["model"].unique()}
        parts.append(full_model_gaps(runs, task, int(params["seed"]), tol, lr, risks).assign(token_measure=measure))
    factor, by = float(params["trajectory_transfer"]["floor_factor"]), ("token_measure", "model")
    gaps = with_floor_threshold(pd.concat(parts, ignore_index=True), factor, by)
    return gaps, slopes(gaps, factor, by=by)


def summarize_beyond_gaussian(inputs, outputs, params, rule="summarize_beyond_gaussian"):
    """Write the stage's tables under results/<run>/beyond_gaussian/ (docs/architecture.md#tables)."""
    section = params["beyond_gaussian"]
    measures, lengths = section["token_measures"], section["train"]["prompt_lengths"]
    refs = references(params, measures, lengths)
    floor = {(r.token_measure, r.prompt_length): r.optimal_linear_attention_test_risk for r in refs.itertuples()}
    trained = pd.concat([read_parquet(p) for p in inputs["train"]], ignore_index=True)
    runs = run_outcomes(trained, params["train"], floor)
    excess = pd.concat([run_excesses(g, trained[trained["token_measure"] == m], measure_task(section, m),
                                     int(params["train"]["batch_size"]), int(params["seed"])).assign(token_measure=m)
                        for m, g in runs.groupby("token_measure")], ignore_index=True)
    runs = runs.merge(excess, on=["token_measure", "model", "prompt_length", "seed", "stream"], how="left")
    table = prompt_length_stats(runs).merge(refs, on=["token_measure", "prompt_length"])
    table["softmax_infimum"] = float(section["noise_variance"])
    gaps, fits = transfer_tables(params, pd.concat([read_parquet(p) for p in inputs["trajectory_transfer"]], ignore_index=True))
    args = (int(section["dim"]), float(section["task_variance"]), float(section["noise_variance"]))
    optima = pd.DataFrame([softmax_optimum(m, *args, PROFILE_SCALES) for m in measures])
    flows = pd.concat([read_parquet(p) for p in inputs["flows"]], ignore_index=True)
    optima = optima.merge(flow_end_scales(flows), on="token_measure", how="left")
    profiles = pd.concat([scale_profile(m, *args, PROFILE_SCALES) for m in measures], ignore_index=True)
    for r in table.itertuples():
        print(f"{r.token_measure:10s} {r.model:8s} L={r.prompt_length:5d}: test {r.final_test_loss_mean:.4f} "
              f"[{r.final_test_loss_lo:.4f}, {r.final_test_loss_hi:.4f}] ok {r.n_ok}/{r.n_seeds} unconverged {r.n_unconverged} "
              f"|U_xx| {r.attention_scale_mean:.3f}; on the test prompts R(Γ*) {r.optimal_linear_attention_test_risk:.4f}, "
              f"Bayes {r.bayes_risk:.4f}")
    prov = provenance(rule, params, base_seed=params["seed"], run_seeds=sorted(runs["seed"].unique()))
    for name, frame in (("runs", runs), ("prompt_lengths", table), ("gaps", gaps), ("slopes", fits), ("optima", optima),
                        ("scale_profiles", profiles)):
        write_parquet(frame, outputs[name], prov)
