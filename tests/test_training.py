"""§6 training at one prompt length: stacked runs, common random numbers, logging grid, divergence and
checkpoint/resume (docs/experiments.md#training-protocol, docs/experiments.md#seeds-and-streams)."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

from helpers import theta
from largeprompt.core.seeding import stream_generator
from largeprompt.icl import models
from largeprompt.icl.engine import loop as trainer_module
from largeprompt.icl.engine.loop import PromptLengthTrainer
from largeprompt.icl.engine.runs import RunSpec, TrainingDiverged, batch, initial_parameters, run_specs
from largeprompt.icl.schedules import constant_schedule, flow_sharpness_schedule
from largeprompt.icl.task import RegressionTask
from largeprompt.io.checkpoints import Checkpoint
from largeprompt.io.parquet_io import read_parquet
from largeprompt.maths.measures import toeplitz_covariance
from largeprompt.stages.bayes_risk import bayes_risk
from largeprompt.stages.full_model_flow import full_model_flow
from largeprompt.stages.make_icl_test_set import make_icl_test_set
from largeprompt.stages.summarize_training import summarize_training
from largeprompt.stages.train import train
from tolerance import assert_within, rounding_tolerance

L, B = 20, 8
TASK = RegressionTask(toeplitz_covariance(3, 0.5, dtype=torch.float64), 0.5, 0.1)  # D = 4
LOUD = RegressionTask(np.eye(3), 5.0, 0.1)  # τ² = 5: a large constant lr blows up within two steps


def held_out(task=TASK, dtype=torch.float64, n=32):
    return task.sample(n, L, stream_generator(9, "test/test_set"), dtype=dtype)


def make_trainer(specs, sizes, task=TASK, dtype="float64", n_log=5, threshold=1e4):
    return PromptLengthTrainer(task, specs, sizes, prompt_length=L, base_seed=3, batch_size=B, n_log=n_log,
                               divergence_threshold=threshold, dtype=dtype)


def run_frame(frame, spec):
    rows = frame[(frame["model"] == spec.model) & (frame["seed"] == spec.seed) & (frame["stream"] == spec.stream)]
    return rows.reset_index(drop=True)


class Bar:
    """Stands in for the tqdm bar: records its total, its start and every update."""

    made = []

    def __init__(self, total, initial=0):
        self.total, self.initial, self.updates, self.closed = total, initial, 0, False
        Bar.made.append(self)

    def update(self, n=1):
        self.updates += n

    def close(self):
        self.closed = True


@pytest.mark.parametrize("model", models.MODELS)
def test_efficient_forward_equals_the_naive_model(model):
    """ŷ via U = KᵀQ/√D and u = VᵀOᵀ equals projecting every token through Q, K, V, O, and so do the gradients."""
    gen = stream_generator(2, "test/naive")
    params = {k: (3.0 * v).requires_grad_(True) for k, v in models.init_parameters(4, gen).items()}
    query, prompt, target = TASK.sample(16, 50, gen)
    fast = models.predict(params, query, prompt, model)
    slow = models.predict_naive(params, query, prompt, model)
    assert fast.std() > 1e-3  # a non-trivial check
    # both are sums of L·D² products of O(|θ|²|z|²) terms; count every rounding of the two orders
    scale = float((prompt.abs().amax() ** 2) * max(float(p.detach().abs().max()) for p in params.values()) ** 4) * 10
    assert_within(fast, slow, rounding_tolerance(2 * 50 * 16, scale), "ŷ efficient vs naive")
    g_fast = torch.autograd.grad(models.mse(fast, target), list(params.values()))
    g_slow = torch.autograd.grad(models.mse(slow, target), list(params.values()))
    for name, a, b in zip(models.PARAMETER_NAMES, g_fast, g_slow):
        assert_within(a, b, rounding_tolerance(4 * 50 * 16, scale * float(fast.detach().abs().max() + target.abs().max())), name)


def test_run_specs_order_and_labels():
    specs = run_specs(["softmax", "linear"], [0, 2], [2])
    assert specs == [RunSpec("softmax", 0), RunSpec("linear", 0), RunSpec("softmax", 2), RunSpec("linear", 2),
                     RunSpec("softmax", 2, 1), RunSpec("linear", 2, 1)]
    assert specs[0].label == "softmax seed=0" and specs[-1].label == "linear seed=2 stream=1"
    assert [s.stream for s in run_specs(["softmax"], [0], [0, 1])] == [0, 1, 2]  # one stream per replicate


def test_initial_weights_are_torch_default_and_shared_by_both_models():
    p = initial_parameters(5, 3, 6)
    bound = 1 / math.sqrt(6)
    for name in models.PARAMETER_NAMES:
        assert p[name].abs().max() <= bound and p[name].abs().max() > 0.8 * bound  # U(−1/√fan_in, 1/√fan_in)
    q = initial_parameters(5, 3, 6)
    assert all(torch.equal(p[k], q[k]) for k in p)
    assert not torch.equal(p["Q"], initial_parameters(5, 4, 6)["Q"])
    assert not torch.equal(p["Q"], initial_parameters(6, 3, 6)["Q"])  # keyed by the base seed too


def test_stacked_runs_equal_runs_trained_alone():
    """[softmax, linear] × 2 seeds in one stack give each run's single-run trajectory up to float round-off."""
    specs = run_specs(["softmax", "linear"], [0, 1], [])
    sizes = [constant_schedule(0.1, 1.0)] * len(specs)
    ts = held_out()
    stacked = make_trainer(specs, sizes).run(ts)
    assert len(stacked) == 4 * 6  # steps 0, 2, …, 10 for each run
    K = len(sizes[0])
    for spec, size in zip(specs, sizes):
        alone = make_trainer([spec], [size]).run(ts)
        mine = run_frame(stacked, spec)
        pd.testing.assert_frame_equal(mine[["model", "seed", "stream", "step", "time", "status"]],
                                      alone[["model", "seed", "stream", "step", "time", "status"]])
        # The two differ only in the order of float64 sums (the batched products have another width). Every
        # rounding of the whole run counted once: K steps of B·L·D products each, on O(1 + |θ|) magnitudes.
        n_ops = K * B * L * TASK.token_dim
        scale = 1.0 + float(np.abs(theta(alone)).max())
        assert_within(theta(mine), theta(alone), rounding_tolerance(n_ops, scale), f"θ {spec}")
        # losses: ŷ is of degree 4 in the weights, so its error scales like scale⁴, times the residual (≤ 1 + loss)
        for col in ("train_loss", "test_loss", "infinite_prompt_risk"):
            first = 1 if col == "train_loss" else 0  # no batch loss before the first step
            a, b = mine[col].to_numpy()[first:], alone[col].to_numpy()[first:]
            assert_within(a, b, rounding_tolerance(n_ops, scale**4 * (1 + np.abs(b))), f"{col} {spec}")


def test_models_share_weights_and_batches_and_replicates_do_not(monkeypatch):
    """Softmax and linear of a seed: identical start, identical batches; a replicate (stream 1): other batches."""
    calls = []
    real_advance = PromptLengthTrainer.advance

    def spy(self, stream, runs):
        query, _, _ = batch(self.task, self.base_seed, stream, self.step, self.batch_size, self.L, self.dtype, "cpu")
        calls.append((stream, self.step, [self.specs[r] for r in runs], query))
        return real_advance(self, stream, runs)

    monkeypatch.setattr(PromptLengthTrainer, "advance", spy)
    seen = []
    real_batch = trainer_module.whitened_batch
    monkeypatch.setattr(trainer_module, "whitened_batch", lambda *a, **k: seen.append(a[2:4]) or real_batch(*a, **k))
    specs = run_specs(["softmax", "linear"], [0, 1], [1])
    frame = make_trainer(specs, [constant_schedule(0.1, 0.5)] * len(specs)).run(held_out())
    # one batch per (stream, step), drawn by the trainer itself: every run of a stream takes the same one
    assert seen == [(j, k) for k in range(5) for j in (0, 1)]
    for stream, step, runs, _ in calls:
        want = [s for s in specs if s.stream == stream]
        assert runs == want, (stream, step)
    stream0 = {step: q for stream, step, _, q in calls if stream == 0}
    stream1 = {step: q for stream, step, _, q in calls if stream == 1}
    assert all(not torch.equal(stream0[k], stream1[k]) for k in stream0)
    first = {s: theta(run_frame(frame, s))[0] for s in specs}
    assert np.array_equal(first[RunSpec("softmax", 0)], first[RunSpec("linear", 0)])
    assert np.array_equal(first[RunSpec("softmax", 1)], first[RunSpec("softmax", 1, 1)])  # a replicate: same start
    assert not np.array_equal(first[RunSpec("softmax", 0)], first[RunSpec("softmax", 1)])
    last = {s: theta(run_frame(frame, s))[-1] for s in specs}
    assert not np.array_equal(last[RunSpec("softmax", 1)], last[RunSpec("softmax", 1, 1)])  # … other batches
    assert not np.array_equal(last[RunSpec("softmax", 0)], last[RunSpec("linear", 0)])  # … another model


def sharp_flow(horizon):
    times = np.linspace(0.0, horizon, 17)
    return times, 1.0 + 30.0 / (1.0 + np.exp(-(times - 0.5 * horizon) / (0.03 * horizon)))


def mixed_schedules(specs, horizon=1.0):
    """Constant lr = 1/8 for softmax runs; the flow_sharpness rule on a sharp rise (more, shorter steps) for linear."""
    flow = sharp_flow(horizon)
    adaptive = flow_sharpness_schedule(0.125, horizon, *flow, 0.8)
    return [constant_schedule(0.125, horizon) if s.model == "softmax" else adaptive for s in specs]


def expected_logged_steps(sizes, n_log):
    """The first step whose clock reaches each grid time T·j/n_log, j = 0…n_log (exact comparisons)."""
    clock = np.concatenate([[0.0], np.cumsum(sizes)])
    horizon = clock[-1]
    return sorted({int(np.argmax(clock >= horizon * j / n_log)) for j in range(n_log + 1)})


def test_logging_is_on_the_time_grid_with_first_and_last_steps():
    specs = run_specs(["softmax", "linear"], [0], [])
    sizes = mixed_schedules(specs)
    assert len(sizes[1]) > len(sizes[0]) and sizes[1].min() > 1e-3  # per-run clocks; no sliver steps
    horizon = max(np.sum(s) for s in sizes)
    for s in sizes:  # no clock within rounding of a grid time it does not equal: exact comparisons are safe
        clock = np.cumsum(s)
        gaps = np.abs(clock[:, None] - horizon * np.arange(5)[None, :] / 4)
        assert np.all((gaps == 0) | (gaps > 1e-9))
    Bar.made.clear()
    frame = make_trainer(specs, sizes, n_log=4).run(held_out(), progress=Bar)
    for spec, size in zip(specs, sizes):
        rows = run_frame(frame, spec)
        clock = np.concatenate([[0.0], np.cumsum(size)])
        assert rows["step"].iloc[0] == 0 and rows["time"].iloc[0] == 0.0 and math.isnan(rows["train_loss"].iloc[0])
        assert rows["step"].iloc[-1] == len(size) and rows["time"].iloc[-1] == clock[-1]
        assert list(rows["step"]) == expected_logged_steps(size, 4)
        assert np.array_equal(rows["time"].to_numpy(), clock[rows["step"].to_numpy()])
        assert rows["status"].eq("ok").all()
    (bar,) = Bar.made
    assert bar.total == max(len(s) for s in sizes) and bar.initial == 0  # steps, not steps + 1
    assert bar.updates == bar.total and bar.closed


def test_a_run_logs_its_final_step_even_after_a_sliver_step():
    times = np.linspace(0.0, 1.0, 11)
    sizes = [flow_sharpness_schedule(0.1, 1.0, times, np.ones_like(times), 0.8)]  # 0.1 × 10 sums to 1 − 1 ulp
    frame = make_trainer([RunSpec("softmax", 0)], sizes, n_log=5).run(held_out())
    assert frame["step"].iloc[-1] == len(sizes[0])


def interrupt_at(monkeypatch, trainer, step):
    """Make ``trainer`` die (as a killed job would) when it reaches ``step``."""
    real = trainer.advance

    def advance(stream, runs):
        if trainer.step == step:
            raise KeyboardInterrupt("killed")
        return real(stream, runs)

    monkeypatch.setattr(trainer, "advance", advance)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_resume_is_bit_identical(tmp_path, monkeypatch, capsys, dtype):
    specs = run_specs(["softmax", "linear"], [0], [0])  # with a replicate stream and per-run clocks
    sizes = mixed_schedules(specs)
    ts = held_out(dtype=getattr(torch, dtype))
    full = make_trainer(specs, sizes, dtype=dtype).run(ts)
    ckpt = Checkpoint(tmp_path / "ckpt" / "L20.pt")
    killed = make_trainer(specs, sizes, dtype=dtype)
    interrupt_at(monkeypatch, killed, 11)
    with pytest.raises(KeyboardInterrupt):
        killed.run(ts, checkpoint=ckpt, checkpoint_every=4)
    assert ckpt.path.exists() and not ckpt.path.with_name("L20.pt.tmp").exists()
    capsys.readouterr()
    Bar.made.clear()
    resumed = make_trainer(specs, sizes, dtype=dtype).run(ts, checkpoint=ckpt, checkpoint_every=4, progress=Bar)
    assert f"resumed all {len(specs)} runs from {ckpt} at step 8" in capsys.readouterr().out
    pd.testing.assert_frame_equal(resumed, full, check_exact=True)
    (bar,) = Bar.made
    assert bar.initial == 8 and bar.initial + bar.updates == bar.total


def test_a_checkpoint_of_other_settings_is_ignored(tmp_path, monkeypatch, capsys):
    specs = run_specs(["softmax", "linear"], [0], [])
    ts, ckpt = held_out(), Checkpoint(tmp_path / "L20.pt")
    killed = make_trainer(specs, [constant_schedule(0.1, 1.0)] * 2)
    interrupt_at(monkeypatch, killed, 7)
    with pytest.raises(KeyboardInterrupt):
        killed.run(ts, checkpoint=ckpt, checkpoint_every=3, key_extra={"icl": {"dim": 3}})
    capsys.readouterr()
    other_lr = [constant_schedule(0.05, 1.0)] * 2
    fresh = make_trainer(specs, other_lr).run(ts)
    again = make_trainer(specs, other_lr).run(ts, checkpoint=ckpt, checkpoint_every=0, key_extra={"icl": {"dim": 3}})
    assert "made with other settings" in capsys.readouterr().out
    pd.testing.assert_frame_equal(again, fresh, check_exact=True)
    # the same runs under another task (what the stage passes as key_extra) do not resume either
    same = [constant_schedule(0.1, 1.0)] * 2
    make_trainer(specs, same).run(ts, checkpoint=ckpt, key_extra={"icl": {"dim": 4}})
    assert "made with other settings" in capsys.readouterr().out
    ckpt.path.write_bytes(b"half a checkpoint")
    pd.testing.assert_frame_equal(make_trainer(specs, same).run(ts, checkpoint=ckpt), make_trainer(specs, same).run(ts))
    assert "is corrupt" in capsys.readouterr().out


def diverging_setup(dtype="float64", bad_lr=0.25):
    """softmax seed 0 and 1 at a small lr; linear seed 0 at ``bad_lr``, which blows up on the τ² = 5 task."""
    specs = [RunSpec("softmax", 0), RunSpec("linear", 0), RunSpec("softmax", 1)]
    sizes = [constant_schedule(0.02, 2.0), constant_schedule(bad_lr, 2.0), constant_schedule(0.02, 2.0)]
    return specs, sizes, held_out(LOUD, getattr(torch, dtype))


def test_a_diverging_run_is_recorded_and_the_others_finish(capsys):
    specs, sizes, ts = diverging_setup()
    frame = make_trainer(specs, sizes, task=LOUD, n_log=3, threshold=1e3).run(ts)
    bad = run_frame(frame, specs[1])
    assert bad["status"].iloc[-1] == "diverged" and bad["status"].iloc[:-1].eq("ok").all()
    step = int(bad["step"].iloc[-1])
    assert 0 < step < len(sizes[1])
    assert f"linear seed=0 L={L}: diverged at step {step}" in capsys.readouterr().out
    assert bad["train_loss"].iloc[-1] > 1e3  # the batch loss that blew up is in the window of that row
    for spec, size in zip(specs[::2], sizes[::2]):
        rows = run_frame(frame, spec)
        assert rows["status"].eq("ok").all() and rows["step"].iloc[-1] == len(size)
    # frozen where the loss blew up: the weights of a run that stopped at that step on the same batches
    stopped = make_trainer(specs, [sizes[0], sizes[1][:step], sizes[2]], task=LOUD, n_log=3, threshold=1e3).run(ts)
    assert np.array_equal(theta(bad)[-1], theta(run_frame(stopped, specs[1]))[-1])


def test_a_run_whose_loss_overflows_is_frozen_at_finite_weights():
    """With a threshold no finite loss crosses, divergence is the first overflowed batch loss: inf, or NaN where
    overflowed terms of opposite signs meet (inf − inf); which one depends on the batch draws."""
    specs, sizes, ts = diverging_setup()
    frame = make_trainer(specs, sizes, task=LOUD, n_log=3, threshold=1e300).run(ts)
    bad = run_frame(frame, specs[1])
    assert bad["status"].iloc[-1] == "diverged" and not math.isfinite(bad["train_loss"].iloc[-1])
    assert np.isfinite(bad["train_loss"].iloc[1:-1]).all()  # every earlier logged loss was finite (step 0 has none)
    assert np.isfinite(theta(bad)[-1]).all()


def test_a_diverged_run_has_one_row_per_step():
    specs, sizes, ts = diverging_setup()
    frame = make_trainer(specs, sizes, task=LOUD, n_log=8, threshold=1e3).run(ts)  # every bad step is on the grid
    bad = run_frame(frame, specs[1])
    assert bad["status"].iloc[-1] == "diverged"
    assert bad["step"].is_unique


def test_fatal_divergence_raises():
    specs, sizes, ts = diverging_setup()
    with pytest.raises(TrainingDiverged, match=r"linear seed=0 L=20: diverged at step \d+.*fatal_divergence"):
        make_trainer(specs, sizes, task=LOUD, threshold=1e3).run(ts, fatal_divergence=True)


@pytest.mark.slow
@pytest.mark.parametrize("rho", [0.0, 0.5])
def test_status_follows_the_outcome_on_two_covariances_and_two_horizons(tmp_path, rho):
    """Real training of seeds 0–5 at L = 20 on Λ_ij = rho^|i−j|, at two horizons (docs/experiments.md#run-status): a run
    whose own flow converges and escapes within half the horizon is never trapped; every trapped run has its
    explanation, a drifting flow or no readout of y; a converging seed's status does not change with the horizon; and on
    the isotropic task (rho = 0), where drifting flows' runs end level with the best, those runs are ok."""
    icl = {"dim": 5, "covariance_rho": rho, "task_variance": 0.2, "noise_variance": 0.1}
    seeds, L = list(range(6)), 20
    make_icl_test_set({}, {"test_set": tmp_path / "t.parquet"}, {"seed": 3, "icl": dict(icl, n_test=200),
                                                                "max_prompt_length": L})
    bayes_risk({"test_set": tmp_path / "t.parquet"}, {"bayes_risk": tmp_path / "b.parquet"},
               {"icl": icl, "train": {"prompt_lengths": [L]}})
    rule = {"trapped_loss_ratio": {"softmax": 1.25, "linear": 1.1}, "trapped_readout_fraction": 0.1}
    status = {}
    for horizon in (100.0, 200.0):
        folder = tmp_path / f"T{horizon:g}"
        folder.mkdir()
        flows = [folder / f"flow{s}.parquet" for s in seeds]
        for s, path in zip(seeds, flows):
            full_model_flow({}, {"flow": path}, {"run_seed": s, "seed": 3, "icl": icl, "train": {"horizon": horizon},
                                                 "infinite": {"rtol": 1e-9, "atol": 1e-11, "flow_points": 121}})
        run = {"models": ["softmax", "linear"], "seeds": seeds, "replicate_seeds": [], "batch_size": 128, "lr": 0.25,
               "step_size_rule": "flow_sharpness", "stability_fraction": 0.8, "horizon": horizon, "decay_start": 0.5,
               "decay_end": 0.7, "final_lr": 0.03, "n_log": 30, "divergence_threshold": 1e4, "fatal_divergence": False,
               "dtype": "float32"}
        train({"test_set": tmp_path / "t.parquet", "flows": flows}, {"trajectories": folder / "L.parquet"},
              {"prompt_length": L, "seed": 3, "icl": icl, "train": run})
        summarize_training(
            {"trajectories": [folder / "L.parquet"], "flows": flows, "bayes_risk": tmp_path / "b.parquet"},
            {"runs": folder / "runs.parquet", "prompt_lengths": folder / "table.parquet"},
            {"seed": 3, "icl": icl, "train": dict(rule, batch_size=128, convergence_window=0.2, mode_gap_factor=2.0,
                                                  unconverged_change=0.05)})
        runs = read_parquet(folder / "runs.parquet")
        covered = (runs["flow_class"] == "converges") & (runs["flow_escape_time"] <= horizon / 2)
        assert covered.any() and (runs.loc[covered, "status"] == "ok").all(), runs[["model", "seed", "status"]]
        trapped = runs[runs["status"] == "trapped"]
        assert ((trapped["flow_class"] == "drifts") | (trapped["trap_reason"] == "no readout")).all()
        if rho == 0.0:
            assert (runs.loc[runs["flow_class"] == "drifts", "status"] == "ok").any()
        status[horizon] = runs.set_index(["model", "seed"])[["status", "flow_class"]]
    both = status[100.0].join(status[200.0], suffixes=("_short", "_long"))
    steady = both[(both["flow_class_short"] == "converges") & (both["flow_class_long"] == "converges")]
    assert len(steady) and (steady["status_short"] == steady["status_long"]).all()
