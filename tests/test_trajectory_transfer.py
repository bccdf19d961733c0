"""The floor-corrected R4 gap and its slope (docs/theory.md#floor-corrected-gap) on synthetic gaps: a part A/L
that falls with L plus constant SGD-noise and Euler floors."""
import numpy as np
import pandas as pd

from largeprompt.icl.trajectory_transfer import corrected_fit, slopes
from tolerance import assert_within, eps

LENGTHS = np.array([20, 40, 80, 160, 320, 640, 1000])
NOISE, EULER = 1.0e-3, 1.25e-3


def gaps(amplitudes=(1.6, 1.8, 2.0)) -> pd.DataFrame:
    """Per seed s, sup_distance = A_s/L + noise + Euler floor, as full_model_gaps writes its columns."""
    rows = [{"experiment": "full_model", "model": "softmax", "prompt_length": int(L), "seed": s,
             "sup_distance": a / L + NOISE + EULER, "noise_floor": NOISE, "euler_floor": EULER,
             "floor": max(NOISE, EULER), "status": "ok"} for s, a in enumerate(amplitudes) for L in LENGTHS]
    frame = pd.DataFrame(rows)
    return frame.assign(corrected_distance=frame["sup_distance"] - frame["noise_floor"] - frame["euler_floor"])


def test_floors_that_add_to_the_gap_flatten_the_raw_slope_and_the_corrected_slope_is_minus_one():
    row = slopes(gaps(), floor_factor=4.0).iloc[0]
    assert row["n_points_above_floor"] < row["n_points"]  # the cut drops the largest L …
    assert row["slope"] > -0.95 and row["slope_hi"] < -0.5  # … and the kept points still bend the raw fit
    assert row["n_corrected_points"] == row["n_points_above_floor"]
    tol = 1e3 * eps(np.float64)  # exact A/L up to the rounding of one subtraction per point and the fit
    assert_within([row["corrected_slope"], row["corrected_slope_lo"], row["corrected_slope_hi"]], [-1.0] * 3, tol,
                  "floor-corrected slope of an exact 1/L law")


def test_the_raw_slope_gets_shallower_as_the_smallest_length_grows():
    """The signature of an additive floor (docs/theory.md#floor-corrected-gap): fitted from larger L on, the raw
    slope moves away from −1, the corrected one stays on it."""
    frame = gaps()
    early = slopes(frame, floor_factor=0.0).iloc[0]
    late = slopes(frame[frame["prompt_length"] >= 160], floor_factor=0.0).iloc[0]
    assert late["slope"] > early["slope"] + 0.1
    assert_within(late["corrected_slope"], -1.0, 1e3 * eps(np.float64), "corrected slope from L = 160 on")


def test_corrected_fit_skips_non_positive_distances_and_missing_floors():
    frame = gaps()
    frame.loc[frame["prompt_length"] == 1000, "corrected_distance"] = -1e-4  # a gap below its floors: no log
    out = corrected_fit(frame)
    assert out["n_corrected_points"] == len(frame) - 3
    assert_within(out["corrected_slope"], -1.0, 1e3 * eps(np.float64), "without the non-positive points")
    none = corrected_fit(frame.drop(columns="corrected_distance"))  # the reduced model: no floors measured
    assert none["n_corrected_points"] == 0 and np.isnan(none["corrected_slope"])
    one_length = corrected_fit(frame[frame["prompt_length"] == 20])
    assert np.isnan(one_length["corrected_slope"]) and one_length["n_corrected_points"] == 3
