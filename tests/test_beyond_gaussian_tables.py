"""The beyond-Gaussian R6 tables on synthetic rows (docs/experiments.md#beyond_gaussian): where the converging softmax
flows end, and the per-(measure, model, L) statistics of the ok runs."""
import math

import numpy as np
import pandas as pd
from scipy import stats

from largeprompt.icl.beyond_gaussian import flow_end_scales, prompt_length_stats
from tolerance import assert_within, rounding_tolerance


def flows(measure, model, seed, end_scale, flow_class, horizon=10.0):
    times = np.linspace(0.0, horizon, 6)
    return pd.DataFrame({"token_measure": measure, "model": model, "seed": seed, "time": times,
                         "norm_U_xx": np.linspace(0.1, end_scale, len(times)), "flow_class": flow_class})


def test_flow_end_scales_take_the_median_of_the_converging_softmax_flows_at_the_horizon():
    frame = pd.concat([
        flows("rademacher", "softmax", 0, 1.0, "converges"), flows("rademacher", "softmax", 1, 3.0, "converges"),
        flows("rademacher", "softmax", 2, 2.5, "converges"), flows("rademacher", "softmax", 3, 50.0, "drifts"),
        flows("rademacher", "linear", 0, 9.0, "converges"),  # another model: not counted
        flows("uniform", "softmax", 0, 4.0, "plateau"),  # no converging flow: NaN
    ], ignore_index=True)
    table = flow_end_scales(frame.sample(frac=1.0, random_state=1)).set_index("token_measure")  # row order is free
    assert table.loc["rademacher", "n_converging_flows"] == 3
    assert table.loc["rademacher", "flow_end_attention_scale"] == 2.5  # median of 1.0, 3.0, 2.5 at t = 10
    assert table.loc["uniform", "n_converging_flows"] == 0
    assert math.isnan(table.loc["uniform", "flow_end_attention_scale"])


def test_prompt_length_stats_count_statuses_and_average_the_ok_shared_runs():
    rng = np.random.default_rng(0)
    finals = rng.uniform(0.2, 0.3, 5)
    runs = pd.DataFrame({"token_measure": "uniform", "model": "softmax", "prompt_length": 40, "seed": np.arange(5),
                         "stream": 0, "status": ["ok", "ok", "ok", "trapped", "diverged"],
                         "final_test_loss": finals, "attention_scale": finals * 10})
    replicate = runs.iloc[:1].assign(stream=1, final_test_loss=9.0)  # another batch stream: never averaged
    row = prompt_length_stats(pd.concat([runs, replicate], ignore_index=True)).iloc[0]
    assert (row["n_seeds"], row["n_ok"], row["n_trapped"], row["n_diverged"]) == (5, 3, 1, 1)
    ok = finals[:3]
    half = stats.t.ppf(0.975, 2) * ok.std(ddof=1) / math.sqrt(3)
    tol = rounding_tolerance(10, 1.0)
    assert_within([row["final_test_loss_lo"], row["final_test_loss_mean"], row["final_test_loss_hi"]],
                  [ok.mean() - half, ok.mean(), ok.mean() + half], tol, "final test loss and its interval")
    assert_within(row["attention_scale_mean"], 10 * ok.mean(), 10 * tol, "attention scale")
