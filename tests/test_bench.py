"""The benchmark's helpers (no timing or memory assertions): report lines, targets, cost fits and their
extrapolation, DAG scheduling, the paper config, mem_mb rounding, synthetic tables and the fresh copy."""
import math
import runpy
import sys

import numpy as np
import pytest

from largeprompt.bench import costs, memory, paper, pipeline, report, schedule, slices
from largeprompt.bench.schedule import Job
from largeprompt.maths.concentration import ERROR_KEYS, prompt_length_grid
from tolerance import rounding_tolerance


def test_line_shows_value_reference_ratio_and_verdict():
    text = report.line("engine step (s)", 0.0123, "s", "floor", 0.00456, 2.7, "<=2.0")
    assert text.startswith("engine step (s)")
    assert "0.0123" in text and "0.00456" in text and "ratio   2.70" in text
    assert text.endswith("(target <=2.0) MISSED")
    assert report.line("x", 1.0, "s", "y", 1.0, 1.0, ">=1.0").endswith("(target >=1.0) ok")
    assert report.line("x", 1.0, "s", "y", 1.0, 1.0, None).endswith("(no target)")


def test_targets_include_their_bound_and_reject_other_operators():
    assert report.eval_target(2.0, "<=2.0") and not report.eval_target(2.0001, "<=2.0")
    assert report.eval_target(0.5, ">=0.5") and not report.eval_target(0.4999, ">=0.5")
    with pytest.raises(ValueError):
        report.eval_target(1.0, "==1.0")


def test_interleaved_seconds_calls_each_function_in_turns():
    calls = []
    out = report.interleaved_seconds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3, warmup=1)
    assert calls == ["a", "b"] + ["a", "b"] * 3
    assert set(out) == {"cpu", "wall"} and set(out["cpu"]) == {"a", "b"}


def test_linear_fit_recovers_a_line_and_extrapolates_it():
    a, b = 0.25, 3e-6
    units = np.array([10.0, 100.0, 1000.0])
    fit = schedule.fit_linear(units, a + b * units)
    # polyfit on 3 points of O(1) values: a few dozen roundings of quantities up to 1e3·b + a
    tol = rounding_tolerance(100, a + b * 1e3 * 10)
    assert abs(fit[0] - a) <= tol and abs(fit[1] - b) <= tol / 1e2
    at = 3e5
    assert abs(schedule.predict_linear(fit, at) - (a + b * at)) <= tol * at / 1e2 + tol


def test_linear_fit_never_returns_a_negative_fixed_cost():
    assert schedule.fit_linear([2.0], [4.0]) == (0.0, 2.0)  # one point: through the origin
    a, b = schedule.fit_linear([1.0, 2.0], [0.5, 2.5])  # the line would cross at −1.5: refit through 0
    assert a == 0.0 and math.isclose(b, (0.5 + 5.0) / 5.0)
    with pytest.raises(ValueError):
        schedule.fit_linear([1.0, 2.0], [1.0])


def test_linear_fit_never_predicts_a_negative_cost():
    """A slice that took less time at more work (noise, a first run that tuned a kernel) gives no falling line."""
    a, b = schedule.fit_linear([1.0, 3.0], [4.0, 2.0])
    assert (a, b) == (3.0, 0.0) and schedule.predict_linear((a, b), 1e6) == 3.0
    assert schedule.fit_linear([1.0], [-2.0]) == (0.0, 0.0)


def test_longest_job_first_on_two_cores():
    jobs = [Job(f"j{i}", "s", t) for i, t in enumerate([3.0, 3.0, 2.0, 2.0, 2.0])]
    assert schedule.schedule(jobs, 2) == 7.0  # LPT: {3, 2, 2} and {3, 2}
    assert schedule.schedule(jobs, 1) == 12.0
    assert schedule.schedule(jobs, 10) == 3.0


def test_schedule_waits_for_whole_stages():
    jobs = [Job("a1", "a", 5.0), Job("a2", "a", 1.0), Job("b", "b", 4.0, ("a",)), Job("c", "c", 2.0)]
    # cores: a1 [0, 5]; a2 [0, 1], then c [1, 3]; b waits for a1: [5, 9]
    assert schedule.schedule(jobs, 2) == 9.0
    assert schedule.critical_path(jobs) == 9.0
    with pytest.raises(ValueError, match="no job"):
        schedule.schedule([Job("b", "b", 1.0, ("missing",))], 2)
    with pytest.raises(ValueError, match="cycle"):
        schedule.schedule([Job("x", "x", 1.0, ("y",)), Job("y", "y", 1.0, ("x",))], 2)


def test_deep_merge_overlays_mappings_and_replaces_lists():
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 4}
    merged = pipeline.deep_merge(base, {"a": {"c": [3]}, "e": 5})
    assert merged == {"a": {"b": 1, "c": [3]}, "d": 4, "e": 5}
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 4}


def test_paper_config_is_paper_yaml_over_the_default():
    config = pipeline.paper_config()
    assert config["run"] == "paper"
    assert config["train"]["prompt_lengths"] == list(range(10, 101, 10)) + list(range(200, 1001, 100))
    assert config["train"]["lr"] == 1e-3 and config["train"]["horizon"] == 300 and config["icl"]["n_test"] == 10000
    assert config["train"]["divergence_threshold"] == 1e4  # numbers read as numbers
    assert config["concentration"]["chunk_size"] == 8192 and config["fixed_query_bound"]["chunk_size"] == 8192  # inherited
    assert "bounds" not in config  # config/config.yaml: the sections of this release


def test_with_values_sets_nested_keys_on_a_copy():
    config = {"concentration": {"n": 1, "inner": {"m": 2}}, "seed": 0}
    out = costs.with_values(config, concentration__inner__m=5, seed=3, measure="gaussian")
    assert out == {"concentration": {"n": 1, "inner": {"m": 5}}, "seed": 3, "measure": "gaussian"}
    assert config["concentration"]["inner"]["m"] == 2


def test_training_jobs_add_steps_and_logging():
    section = {"lr": 1e-3, "horizon": 300, "n_log": 300, "prompt_lengths": [10, 1000]}
    fit = {"step": (2e-3, 4e-6), "test": (1e-3, 2e-6), "n_test": 1000, "floor": (1e-4, 3e-6)}
    jobs = costs.training_jobs(section, {"icl": {"n_test": 10000}}, fit, "train")
    assert [j.name for j in jobs] == ["train L=10", "train L=1000"]
    for job, L in zip(jobs, (10, 1000)):
        want = 300_000 * (2e-3 + 4e-6 * L) + 301 * 10 * (1e-3 + 2e-6 * L)
        assert job.seconds == pytest.approx(want, rel=rounding_tolerance(10, 1.0))
        assert job.floor == pytest.approx(300_000 * (1e-4 + 3e-6 * L), rel=rounding_tolerance(10, 1.0))  # steps draw
        assert job.after == ("make_icl_test_set",)


def test_the_paper_training_line_names_the_config_and_core_hours(monkeypatch):
    fit = {"step": (1e-3, 5e-6), "test": (0.0, 0.0), "n_test": 1000, "floor": (5e-4, 2e-6)}
    monkeypatch.setattr(costs, "engine_costs", lambda *a, **k: fit)
    lines = paper.bench_paper_training(quick=True)
    text = "\n".join(lines)
    assert "paper.yaml" in text and "core-hours" in text
    lengths = pipeline.paper_config()["train"]["prompt_lengths"]
    hours = sum(300_000 * (1e-3 + 5e-6 * L) for L in lengths) / 3600
    assert f"≈ {hours:.2f} core-hours" in text


def test_the_paper_beyond_gaussian_stage_has_every_flow_run_and_transfer_job(monkeypatch, tmp_path):
    """Section beyond_gaussian of config/paper.yaml: a flow job per measure (gaussian's always), an R6 job per
    (measure, L) at the section's step count and n_test, one R4 job per measure summing its L, then the summary."""
    fit = {"step": (1e-3, 5e-6), "test": (1e-2, 1e-5), "n_test": 1000, "floor": (1e-4, 1e-6)}
    tasks = []
    monkeypatch.setattr(costs, "engine_costs", lambda section, quick, **k: tasks.append(k["task"]) or fit)
    monkeypatch.setattr(costs, "_sliced", lambda rule, config, *a: (((2.0, 0.5)), None))
    config = pipeline.paper_config()
    b = config["beyond_gaussian"]
    jobs, _ = costs.beyond_gaussian(config, tmp_path, quick=True)
    by_stage = {}
    for job in jobs:
        by_stage.setdefault(job.stage, []).append(job)
    measures = b["token_measures"]
    assert len(by_stage["flow_beyond_gaussian"]) == len({"gaussian", *measures})
    assert all(j.seconds == pytest.approx(len(b["train"]["seeds"]) * (2.0 + 0.5 * b["train"]["horizon"]))
               for j in by_stage["flow_beyond_gaussian"])
    r6 = by_stage["train_beyond_gaussian"]
    assert [j.name for j in r6] == [f"train_beyond_gaussian measure={m} L={L}" for m in measures
                                    for L in b["train"]["prompt_lengths"]]
    steps = b["train"]["horizon"] / config["train"]["lr"]  # paper.yaml: the §6 constant step
    L = b["train"]["prompt_lengths"][-1]
    want = steps * (1e-3 + 5e-6 * L) + (b["train"]["n_log"] + 1) * b["n_test"] / 1000 * (1e-2 + 1e-5 * L)
    assert r6[len(b["train"]["prompt_lengths"]) - 1].seconds == pytest.approx(want, rel=rounding_tolerance(10, 1.0))
    assert all(j.after == ("flow_beyond_gaussian",) for j in r6)
    transfer = {**config["trajectory_transfer"], **b["trajectory_transfer"]}
    one = sum(transfer["horizon"] / transfer["lr"] * (1e-3 + 5e-6 * L)
              + (transfer["n_log"] + 1) * b["n_test"] / 1000 * (1e-2 + 1e-5 * L) for L in transfer["prompt_lengths"])
    assert [j.seconds for j in by_stage["train_trajectory_transfer_beyond_gaussian"]] == pytest.approx([one] * len(measures))
    floor = sum(transfer["horizon"] / transfer["lr"] * (1e-4 + 1e-6 * L) for L in transfer["prompt_lengths"])
    assert [j.floor for j in by_stage["train_trajectory_transfer_beyond_gaussian"]] == pytest.approx([floor] * len(measures))
    assert [t["token_measure"] for t in tasks] == [m for m in measures for _ in range(2)]
    assert all(t["dim"] == b["dim"] and t["covariance_rho"] == 0.0 for t in tasks)
    assert by_stage["summarize_beyond_gaussian"][0].after == ("train_beyond_gaussian", "train_trajectory_transfer_beyond_gaussian")


def test_report_lines_have_one_line_per_stage_a_total_and_the_floors(monkeypatch):
    from largeprompt.bench import floors

    rates = floors.sampler_seconds()
    monkeypatch.setattr(floors, "rates", lambda: rates)
    stages = [("data", [Job("make", "make", 3600.0)], "note"),
              ("training", [Job(f"t{i}", "train", 7200.0, ("make",), 1800.0) for i in range(3)], "n")]
    lines = paper.report_lines(stages, cores=2, overhead=0.0)
    assert len(lines) == 4 and lines[-2].startswith("total: config/paper.yaml")
    assert "7.00 core-hours" in lines[-2] and "≈ 5.00 h wall" in lines[-2]  # 1 h, then 2 h + 2 h on two cores
    assert "no draws" in lines[0]  # a rule never sliced draws nothing
    assert "floor   1.50, ratio   4.0x" in lines[1] and "floor   1.50, ratio   4.7x" in lines[-2]
    assert lines[-1].startswith("  floor:") and all(name in lines[-1] for name in floors.SAMPLERS)


@pytest.mark.parametrize("peak, want", [(0.0, 500), (100.0, 500), (999.0, 1500), (1000.0, 1500), (1001.0, 1600)])
def test_mem_mb_is_the_peak_with_its_margin_rounded_up(peak, want):
    assert memory.mem_mb(peak) == want


def test_mem_mb_rejects_a_missing_peak():
    with pytest.raises(ValueError):
        memory.mem_mb(float("nan"))


def test_peaks_by_rule_keeps_each_rules_largest_job():
    rows = [{"rule": "train", "wildcards": {"L": "10"}, "peak_rss_mb": 300.0},
            {"rule": "train", "wildcards": {"L": "1000"}, "peak_rss_mb": 900.0},
            {"rule": "bayes_risk", "wildcards": {}, "peak_rss_mb": 400.0}]
    peaks = memory.peaks_by_rule(rows)
    assert peaks["train"] == {"peak_rss_mb": 900.0, "jobs": 2, "worst": {"L": "1000"}}
    assert peaks["bayes_risk"]["jobs"] == 1


def test_synthetic_error_tables_have_the_schema_of_simulate_concentration_errors():
    lengths = prompt_length_grid(4, 8, 2)
    frame = slices.synthetic_errors("gaussian", 0.5, lengths, 7)
    assert list(frame.columns) == ERROR_KEYS + ["output_sq_error", "grad_U_sq_error", "grad_V_sq_error"]
    assert len(frame) == 7 * len(lengths)
    assert (frame[["output_sq_error", "grad_U_sq_error", "grad_V_sq_error"]] > 0).all().all()
    assert frame.groupby("repetition")["prompt_length"].apply(list).map(lambda x: x == lengths).all()


def test_fresh_copy_leaves_out_outputs_caches_and_the_virtualenv(tmp_path):
    repo = tmp_path / "repo"
    for rel in ["Snakefile", "src/pkg/mod.py", "src/pkg/results/keep.py", "results/default/x.parquet",
                "figures/a.pdf", "logs/a.log", ".git/HEAD", ".venv/bin/python", "src/pkg/__pycache__/m.pyc",
                ".snakemake/log"]:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("x")
    dest = pipeline.fresh_copy(repo, tmp_path / "copy")
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == ["Snakefile", "src/pkg/mod.py", "src/pkg/results/keep.py"]


def test_bench_command_line_help(capsys, monkeypatch):
    """`largeprompt bench --help` and `python -m largeprompt.bench --help` (the package's __main__) reach the bench's CLI."""
    from largeprompt.commands import cli

    monkeypatch.setattr(sys, "argv", ["python -m largeprompt.bench", "--help"])
    for call in (lambda: cli.main(["bench", "--help"]), lambda: runpy.run_module("largeprompt.bench", run_name="__main__")):
        with pytest.raises(SystemExit) as done:
            call()
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert "--paper" in out and "--cores" in out


def test_the_engine_in_blocks_equals_the_engine_in_one_block(monkeypatch):
    """The engine's blocking of large batches (a performance device) changes sums only by their order."""
    import torch

    from largeprompt.core.seeding import stream_generator
    from largeprompt.icl import models
    from largeprompt.icl.engine import stacked
    from largeprompt.icl.task import RegressionTask
    from largeprompt.maths.measures import toeplitz_covariance

    B, L = 40, 30
    query, prompt, target = RegressionTask(toeplitz_covariance(3, 0.5), 0.5, 0.2).sample(B, L, stream_generator(1, "t"))
    gen = stream_generator(2, "t/init")
    stack = stacked.RunStack.from_parameters([models.init_parameters(4, gen) for _ in range(3)], [False, True, False])
    whole = stacked.loss_and_gradients(stack, query, prompt, target)
    pred = stacked.predict(stack, query, prompt)
    monkeypatch.setattr(stacked, "BLOCK_ELEMENTS", 2 * 1 * L * 7)  # 1 softmax run, blocks of 7 prompts: 6, the last of 5
    assert len(stacked._blocks(B, stacked._block_size(None, 1, L, 4))) == 6
    blocked = stacked.loss_and_gradients(stack, query, prompt, target)
    tol = rounding_tolerance(B * L * 4, 1.0 + float(whole[0].max()))  # sums of B·L products of O(1) factors
    assert torch.allclose(blocked[0], whole[0], rtol=0, atol=tol)
    for name in models.PARAMETER_NAMES:
        assert torch.allclose(blocked[1][name], whole[1][name], rtol=0, atol=tol), name
    assert torch.allclose(stacked.predict(stack, query, prompt), pred, rtol=0, atol=tol)


def test_every_draw_is_counted_per_sampler_and_every_sampler_has_a_timed_rate():
    """The floors of bench --paper (largeprompt.bench.floors) count the numbers each draw makes, by sampler."""
    import numpy as np
    import torch

    from largeprompt.bench import floors
    from largeprompt.core import seeding
    from largeprompt.icl.task import RegressionTask
    from largeprompt.maths.measures import toeplitz_covariance

    seeding.DRAWN.clear()
    B, L, d = 7, 11, 3
    RegressionTask(toeplitz_covariance(d, 0.5), 0.5, 0.2).sample(B, L, seeding.stream_generator(0, "t"), dtype=torch.float32)
    assert dict(seeding.DRAWN) == {"normal/torch/float32": B * (L + 1) * (d + 1) + B * d}  # tokens and noise, then β
    seeding.DRAWN.clear()
    RegressionTask(torch.eye(d), 0.5, 0.2, "rademacher").sample(B, L, seeding.stream_rng(0, "t"))
    assert dict(seeding.DRAWN) == {"bits/numpy/int64": B * (L + 1) * d, "normal/numpy/float64": B * (L + 1) + B * d}
    gens = (np.random.Generator(np.random.SFC64(0)), torch.Generator())
    for kind in ("normal", "uniform", "bits"):
        for gen in gens:
            for dtype in (torch.float32, torch.float64):
                assert seeding.sampler(kind, gen, dtype) in floors.SAMPLERS
    seconds = floors.sampler_seconds()  # the rates, as the worker measures them
    assert set(seconds) == set(floors.SAMPLERS) and all(0 < s < 1e-6 for s in seconds.values())


def test_a_floor_is_the_count_times_the_rate_and_an_unknown_sampler_says_where_to_add_it(monkeypatch):
    from largeprompt.bench import floors

    rates = floors.sampler_seconds()
    monkeypatch.setattr(floors, "rates", lambda: rates)
    drawn = {"normal/torch/float32": 1000.0, "bits/numpy/int64": 10.0}
    assert floors.floor_seconds(drawn) == 1000.0 * rates["normal/torch/float32"] + 10.0 * rates["bits/numpy/int64"]
    with pytest.raises(ValueError, match="SAMPLERS"):
        floors.floor_seconds({"normal/jax/float32": 1.0})


def test_the_device_step_timings_run_on_the_cpu_and_split_the_step():
    """largeprompt.bench.device_steps (docs/performance.md#training-gpu), on the CPU where there is no GPU."""
    from largeprompt.bench import device_steps

    rows = device_steps.device_rows(devices=("cpu",), lengths=(10,), n=2)
    assert [(r["runs"], r["L"]) for r in rows] == [("2 runs", 10), ("18 runs", 10)]
    for row in rows:
        assert row["step_ms"] > 0 and row["loss_and_gradients_ms"] > 0 and row["draw_and_copy_ms"] > 0
