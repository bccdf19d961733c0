"""Step-size rules of §6 training: constant and flow_sharpness, the stability margin and the step-count estimate
(docs/theory.md#sgd-stability, docs/experiments.md#training-protocol)."""

import numpy as np
import pandas as pd
import pytest

from largeprompt.icl.engine.protocol import TrainSettings, schedules
from largeprompt.icl.engine.runs import run_specs
from largeprompt.icl.schedules import constant_schedule, estimated_steps, flow_sharpness_schedule, stability_margin, step_sizes
from largeprompt.io.parquet_io import write_parquet
from largeprompt.stages import train
from largeprompt.stages.make_icl_test_set import make_icl_test_set
from largeprompt.stages.train import load_flows
from tolerance import gamma, sum_tolerance

HORIZON = 4.0


def sharp_rise(times, low=1.0, high=40.0, at=0.6 * HORIZON, width=0.02 * HORIZON):
    """A synthetic flow sharpness λ(t): flat at ``low``, then a steep logistic rise to ``high`` around ``at``."""
    return low + (high - low) / (1.0 + np.exp(-(np.asarray(times) - at) / width))


def flow_grid(n_points=81, horizon=HORIZON):
    times = np.linspace(0.0, horizon, n_points)
    return times, sharp_rise(times)


@pytest.mark.parametrize("lr, horizon, n", [(0.1, 1.0, 10), (0.3, 1.0, 4), (0.25, 200.0, 800), (0.07, 3.3, 48),
                                         (2.0, 1.5, 1)])
def test_constant_schedule_has_ceil_steps_summing_to_the_horizon(lr, horizon, n):
    """⌈T/lr⌉ steps (counted by hand), all lr but the last, which is cut so that Σ lr_k = T."""
    steps = constant_schedule(lr, horizon)
    assert len(steps) == n == estimated_steps("constant", lr, horizon)
    assert np.all(steps[:-1] == lr) and 0 < steps[-1] <= lr * (1 + gamma(2))
    # lr·(n−1) (one rounding), T − that (one), then the sum of n terms (γ_{n−1}): γ_{n+2}·T in all
    assert abs(steps.sum() - horizon) <= sum_tolerance(len(steps) + 3, horizon)
    assert np.array_equal(step_sizes("constant", lr, horizon), steps)


def lookahead_sharpness(times, sharpness, t, lr_max, horizon):
    """max λ over the flow-grid cells that meet [t, min(t + lr_max, T)], by a plain scan of the grid.

    λ between grid points is bounded by the larger end, so this is the sup of the linear interpolant over the
    union of those cells (from the last grid point ≤ t to the first grid point ≥ the window's end).
    """
    end = min(t + lr_max, horizon)
    lo = max(i for i, g in enumerate(times) if g <= t)
    hi = min((i for i, g in enumerate(times) if g >= end), default=len(times) - 1)
    return float(np.max(sharpness[lo : hi + 1]))


@pytest.mark.parametrize("lr_max, fraction", [(0.2, 0.8), (0.05, 0.5), (1.0, 0.9)])
def test_flow_sharpness_steps_are_stable_over_their_lookahead(lr_max, fraction):
    times, sharpness = flow_grid()
    steps = flow_sharpness_schedule(lr_max, HORIZON, times, sharpness, fraction)
    assert np.all(steps > 0) and np.all(steps <= lr_max)
    # the schedule accumulates t sequentially (K roundings) and ends with T − t (one more); np.sum adds γ_{K−1}
    assert abs(steps.sum() - HORIZON) <= sum_tolerance(2 * len(steps) + 2, HORIZON)
    t, dense = 0.0, np.linspace(0.0, 1.0, 201)
    for k, lr in enumerate(steps):
        bound = lookahead_sharpness(times, sharpness, t, lr_max, HORIZON)
        end = min(t + lr_max, HORIZON)
        lo = max(g for g in times if g <= t)
        hi = min((g for g in times if g >= end), default=times[-1])
        sampled = np.interp(lo + dense * (hi - lo), times, sharpness)  # λ anywhere in the look-ahead cells
        # 2f/λ̂ and lr·λ: two roundings each, relative
        assert lr * sampled.max() <= 2 * fraction * (1 + gamma(4)), (k, t, lr)
        assert lr * bound <= 2 * fraction * (1 + gamma(4)), (k, t, lr)
        # and not needlessly small: the largest step the rule allows (the last one may be cut at the horizon)
        allowed = min(lr_max, 2 * fraction / bound)
        if k < len(steps) - 1:
            assert lr >= allowed * (1 - gamma(4)), (k, t, lr, allowed)
        t += lr
    # the flat start runs at lr_max (2f/λ_low ≥ lr_max in every case here) and the top at 2f/λ_high
    assert 2 * fraction / sharpness[0] >= lr_max and steps[0] == lr_max
    assert steps[-2] == pytest.approx(min(lr_max, 2 * fraction / sharpness[-2:].max()), rel=gamma(4))


def test_flow_sharpness_takes_the_larger_end_of_every_cell():
    """On a coarse grid with one spike the steps whose look-ahead meets the spike's cells are all cut to 2f/λ_spike."""
    times = np.linspace(0.0, 1.0, 5)  # cells of 0.25
    sharpness = np.array([1.0, 1.0, 100.0, 1.0, 1.0])
    steps = flow_sharpness_schedule(0.1, 1.0, times, sharpness, 0.5)
    clock = np.concatenate([[0.0], np.cumsum(steps)[:-1]])
    spike_cells = (clock + 0.1 > 0.25) & (clock < 0.75)  # the look-ahead meets (0.25, 0.5] or [0.5, 0.75)
    assert np.allclose(steps[spike_cells], 2 * 0.5 / 100.0, rtol=gamma(4), atol=0)
    far = (clock + 0.1 < 0.25 - 1e-9) | (clock > 0.75 + 1e-9)
    assert np.all(steps[far][:-1] == 0.1)


def test_flow_sharpness_takes_no_sliver_step_at_the_horizon():
    times = np.linspace(0.0, 1.0, 11)
    steps = flow_sharpness_schedule(0.1, 1.0, times, np.ones_like(times), 0.8)  # never limited by λ
    assert len(steps) == len(constant_schedule(0.1, 1.0)) == 10
    assert steps.min() > 0.5 * 0.1


def test_flow_grid_must_cover_the_horizon_and_sharpness_be_positive():
    times, sharpness = flow_grid()
    with pytest.raises(ValueError, match="not the training horizon"):
        flow_sharpness_schedule(0.2, 2 * HORIZON, times, sharpness, 0.8)
    with pytest.raises(ValueError, match="not the training horizon"):
        flow_sharpness_schedule(0.2, HORIZON, times + 0.1, sharpness, 0.8)
    for bad in (0.0, -1.0, np.nan, np.inf):
        broken = sharpness.copy()
        broken[10] = bad
        with pytest.raises(ValueError, match="finite and positive"):
            flow_sharpness_schedule(0.2, HORIZON, times, broken, 0.8)
    with pytest.raises(ValueError, match="needs the run's infinite-prompt flow"):
        step_sizes("flow_sharpness", 0.2, HORIZON, 0.8)
    with pytest.raises(ValueError, match="train.step_size_rule"):
        step_sizes("cosine", 0.2, HORIZON)


def test_stability_margin_detects_an_unstable_constant_lr():
    times, sharpness = flow_grid()  # λ rises from 1 to 40
    unstable = constant_schedule(0.25, HORIZON)  # 0.25·40 = 10 near the end
    stable = constant_schedule(0.04, HORIZON)  # 0.04·40 = 1.6
    clock = np.concatenate([[0.0], np.cumsum(unstable)[:-1]])
    want = float(np.max(unstable * sharp_rise(clock)))  # λ at each step's start, from the formula itself
    # the flow grid interpolates λ linearly: within the largest |λ''|·h²/8 of the formula (h = grid spacing)
    h = times[1] - times[0]
    fine = np.linspace(0, HORIZON, 20001)
    curvature = np.abs(np.gradient(np.gradient(sharp_rise(fine), fine), fine)).max()
    assert abs(stability_margin(unstable, times, sharpness) - want) <= 0.25 * curvature * h**2 / 8 * 1.1
    assert stability_margin(unstable, times, sharpness) >= 2.0
    assert stability_margin(stable, times, sharpness) < 2.0
    rule = flow_sharpness_schedule(0.25, HORIZON, times, sharpness, 0.8)
    assert stability_margin(rule, times, sharpness) <= 2 * 0.8 * (1 + gamma(4))


@pytest.mark.parametrize("lr, fraction, growth", [(0.25, 0.8, 2.0), (0.1, 0.5, 1.0), (0.5, 0.9, 4.0)])
def test_estimated_steps_bound_the_flow_sharpness_step_count(lr, fraction, growth):
    """For λ(t) ≤ growth·t (the estimate's assumption) the rule never takes more steps than estimated."""
    horizon = 20.0
    times = np.linspace(0.0, horizon, 401)
    sharpness = growth * np.maximum(times, times[1])  # positive at t = 0
    steps = flow_sharpness_schedule(lr, horizon, times, sharpness, fraction)
    estimate = estimated_steps("flow_sharpness", lr, horizon, fraction, sharpness_growth=growth)
    assert len(steps) <= estimate
    assert estimate <= 2 * len(steps)  # an estimate, not a blanket overshoot


def write_flow(path, seed, times, sharpness, determinant=1.0):
    """A flow that escapes the plateau at t = T/2 and ends with det(u_y M_x) = ``determinant`` (< 0: it drifts)."""
    risk = np.where(times < 0.5 * times[-1], 1.1, 0.15)
    frame = pd.DataFrame({"seed": seed, "time": times, "sharpness": sharpness, "infinite_prompt_risk": risk,
                          "readout_determinant": determinant})
    write_parquet(frame, path, {"rule": "full_model_flow"})


def test_train_stage_warns_about_an_unstable_constant_lr(tmp_path, capsys):
    """The train stage names the config key 'train.lr' when a constant lr crosses 2/λ of a run's flow."""
    icl = {"dim": 2, "covariance_rho": 0.5, "task_variance": 0.5, "noise_variance": 0.1, "n_test": 8}
    make_icl_test_set({}, {"test_set": tmp_path / "t.parquet"}, {"seed": 1, "icl": icl, "max_prompt_length": 6})
    times = np.linspace(0.0, 1.0, 11)
    write_flow(tmp_path / "f0.parquet", 0, times, 1.0 + 20.0 * times)  # 0.25·21 = 5.25 ≥ 2
    run = {"models": ["softmax"], "seeds": [0], "replicate_seeds": [], "batch_size": 4, "lr": 0.25,
           "step_size_rule": "constant", "stability_fraction": 0.8, "horizon": 1.0, "decay_start": 1.0, "decay_end": 1.0,
           "final_lr": 0.25, "n_log": 2,
           "divergence_threshold": 1e4, "fatal_divergence": False, "dtype": "float64"}
    params = {"prompt_length": 6, "seed": 1, "icl": icl, "train": run}
    inputs = {"test_set": tmp_path / "t.parquet", "flows": [tmp_path / "f0.parquet"]}
    train.train(inputs, {"trajectories": tmp_path / "a.parquet"}, params)
    out = capsys.readouterr().out
    assert "WARNING" in out and "'train.lr'" in out and "unstable for seed 0" in out
    stable = dict(params, train=dict(run, lr=0.05))  # 0.05·21 = 1.05
    train.train(inputs, {"trajectories": tmp_path / "b.parquet"}, stable)
    assert "WARNING" not in capsys.readouterr().out


def test_a_drifting_run_stops_at_the_step_count_of_the_longest_other_run(tmp_path):
    """Seed 0's flow drifts (its sharpness grows 50-fold): its own stable schedule is cut at the step count of seed 1,
    whose flow converges (docs/experiments.md#drifting-runs); both stay stable for their own flows."""
    times = np.linspace(0.0, 10.0, 101)
    write_flow(tmp_path / "f0.parquet", 0, times, 1.0 + 5.0 * times, determinant=-0.3)
    write_flow(tmp_path / "f1.parquet", 1, times, np.full_like(times, 2.0), determinant=0.9)
    flows = load_flows([tmp_path / "f0.parquet", tmp_path / "f1.parquet"], noise_variance=0.1)
    assert (flows[0].kind, flows[1].kind) == ("drifts", "converges")
    cfg = TrainSettings(models=["softmax", "linear"], seeds=[0, 1], replicate_seeds=[], batch_size=4, lr=0.25,
                        step_size_rule="flow_sharpness", stability_fraction=0.8, horizon=10.0, decay_start=1.0,
                        decay_end=1.0, final_lr=0.25, n_log=4, divergence_threshold=1e4, fatal_divergence=False,
                        dtype="float64")
    specs = run_specs(cfg.models, cfg.seeds, cfg.replicate_seeds)
    sizes = dict(zip([(s.model, s.seed) for s in specs], schedules(cfg, specs, flows)))
    full = flow_sharpness_schedule(0.25, 10.0, times, 1.0 + 5.0 * times, 0.8)
    budget = len(sizes[("softmax", 1)])
    assert len(full) > budget and np.array_equal(sizes[("softmax", 0)], full[:budget])
    assert np.array_equal(sizes[("softmax", 0)], sizes[("linear", 0)])
    for seed in (0, 1):
        assert stability_margin(sizes[("softmax", seed)], flows[seed].times, flows[seed].sharpness) <= 1.6 * (1 + gamma(4))


def test_job_time_limits_count_runs_steps_and_batch():
    """The cluster time limits of the rules (workflow/rules/common.smk): runs = models × (seeds + replicates), the
    transfer step costs batch/128 training steps, a per-measure transfer job sums its L, and longer prompts, more
    runs or a larger batch never get less time."""
    from largeprompt.icl.job_limits import (
        estimated_runtime_minutes,
        init_dependence_minutes,
        training_job_minutes,
        transfer_job_minutes,
        transfer_jobs_minutes,
    )
    train = {"models": ["softmax", "linear"], "seeds": [327, *range(8)], "replicate_seeds": [], "lr": 1e-3,
             "horizon": 300, "step_size_rule": "constant", "stability_fraction": 1.0, "final_lr": 1e-3}
    assert training_job_minutes(train, 1000) == estimated_runtime_minutes(300_000, 1000, 18)
    assert training_job_minutes(train, 1000) > training_job_minutes(train, 10)
    assert training_job_minutes({**train, "replicate_seeds": [0]}, 100) > training_job_minutes(train, 100)
    transfer = {"models": ["softmax"], "seeds": [0, 1], "replicate_seeds": [0], "lr": 0.01, "horizon": 2,
                "batch_size": 1024, "prompt_lengths": [20, 40]}
    assert transfer_job_minutes(transfer, 40) == estimated_runtime_minutes(200 * 8, 40, 3)
    assert transfer_job_minutes({**transfer, "batch_size": 100}, 40) == estimated_runtime_minutes(200, 40, 3)
    assert transfer_jobs_minutes(transfer) == transfer_job_minutes(transfer, 20) + transfer_job_minutes(transfer, 40)
    assert init_dependence_minutes(512) == 10 + 512 // 30
