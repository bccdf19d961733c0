"""largeprompt publish (src/largeprompt/commands/publish.py): figures shrunk under the size limit, small tables copied byte
for byte with their provenance, and each rule's measured time read from Snakemake's benchmark files."""
import json

import numpy as np
import pandas as pd
from PIL import Image

from helpers import REPO
from largeprompt.commands.publish import busy_seconds, measured_jobs, publish, publish_single_seed, small_png, stage_times
from largeprompt.io.parquet_io import read_parquet, read_provenance, write_parquet


def test_a_large_png_is_shrunk_under_the_limit_and_a_small_one_kept(tmp_path):
    noisy = np.random.default_rng(0).integers(0, 256, size=(400, 420, 3), dtype=np.uint8)
    big = tmp_path / "big.png"
    Image.fromarray(noisy).save(big)
    assert big.stat().st_size > 400_000
    shrunk = small_png(big, limit=400_000)
    assert len(shrunk) <= 400_000 and shrunk[:8] == b"\x89PNG\r\n\x1a\n"
    small = tmp_path / "small.png"
    Image.fromarray(np.zeros((10, 10, 3), dtype=np.uint8)).save(small)
    assert small_png(small) == small.read_bytes()


def _benchmark(path, s, cpu, rss):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
                    f"{s}\t0:00:00\t{rss}\t0\t0\t0\t0\t0\t0\t{cpu}\n")


def test_stage_times_sum_each_rules_jobs_and_compare_with_the_prediction(tmp_path):
    bench = tmp_path / "benchmarks" / "r"
    _benchmark(bench / "train" / "L10.tsv", 100.0, 90.0, 300.0)
    _benchmark(bench / "train" / "L20.tsv", 200.0, 180.0, 500.0)
    _benchmark(bench / "bayes_risk.tsv", 10.0, 9.0, 100.0)
    jobs = measured_jobs(bench)
    assert sorted(jobs["rule"]) == ["bayes_risk", "train", "train"]
    prediction = {"jobs": [{"rule": "train", "seconds": 135.0}, {"rule": "train", "seconds": 135.0},
                           {"rule": "bayes_risk", "seconds": 18.0}]}
    table = stage_times(jobs, prediction).set_index("rule")
    assert table.loc["train", "jobs"] == 2 and np.isclose(table.loc["train", "cpu_hours"], 270 / 3600)
    assert np.isclose(table.loc["train", "longest_job_hours"], 200 / 3600) and table.loc["train", "max_rss_mb"] == 500
    assert np.isclose(table.loc["train", "measured_over_predicted"], 1.0)
    assert np.isclose(table.loc["bayes_risk", "measured_over_predicted"], 0.5)


def test_publish_copies_small_tables_with_their_provenance_and_skips_large_ones(tmp_path):
    results = tmp_path / "results" / "r"
    write_parquet(pd.DataFrame({"x": [1.0, 2.0]}), results / "icl" / "small.parquet", {"rule": "t", "git_commit": "abc"})
    write_parquet(pd.DataFrame({"x": np.random.default_rng(1).random(800_000)}), results / "big.parquet", {"rule": "t"})
    (tmp_path / "figures" / "r").mkdir(parents=True)
    _benchmark(tmp_path / "benchmarks" / "r" / "bayes_risk.tsv", 1.0, 1.0, 1.0)
    prediction = tmp_path / "prediction.json"
    prediction.write_text(json.dumps({"jobs": [{"rule": "bayes_risk", "seconds": 2.0}], "total_core_hours": 0.001,
                                      "wall_hours": 0.001, "cores": 2, "machine": "test"}))
    out = tmp_path / "out"
    publish("r", out, prediction, root=tmp_path)
    copied = out / "tables" / "icl" / "small.parquet"
    assert copied.read_bytes() == (results / "icl" / "small.parquet").read_bytes()
    assert read_provenance(copied)["git_commit"] == "abc"
    assert not (out / "tables" / "big.parquet").exists()
    assert "`abc`" in (out / "times.md").read_text()


def test_single_seed_page_puts_the_reference_seed_against_the_other_seeds(tmp_path):
    """The published single-seed run's table as the reference; a multi-seed run made from it: seeds 0..4 at the
    reference's value ± a known spread (inside at every (model, L)), then one length moved far off (outside there)."""
    reference = REPO / "docs" / "paper-run" / "single-seed"
    single = read_parquet(reference / "training_runs.parquet")
    offsets = np.array([-0.02, -0.01, 0.0, 0.01, 0.02])
    many = pd.concat([single] + [single.assign(seed=s, final_test_loss=single["final_test_loss"] * (1 + o))
                                 for s, o in enumerate(offsets)], ignore_index=True)
    tables = tmp_path / "tables"
    write_parquet(many, tables / "train" / "training_runs.parquet", {"rule": "t"})
    summary = publish_single_seed(tables, reference, tmp_path / "single-seed.md")
    pairs = len(single.groupby(["model", "prompt_length"]))
    assert summary.endswith(f"at {pairs} of {pairs} (model, L)")
    moved = many.copy()
    far = (moved["seed"] != 327) & (moved["prompt_length"] == 1000)
    moved.loc[far, "final_test_loss"] *= 2
    write_parquet(moved, tables / "train" / "training_runs.parquet", {"rule": "t"})
    assert publish_single_seed(tables, reference, tmp_path / "single-seed.md").endswith(f"at {pairs - 2} of {pairs} (model, L)")
    assert "| softmax | 1000 |" in (tmp_path / "single-seed.md").read_text()


def test_single_seed_page_compares_over_each_runs_own_linear_optimum(tmp_path):
    """Another test set moves every final loss by 3% and R(Γ*) with it: the raw losses fall outside the interval,
    their ratio to each run's own R(Γ*) does not."""
    reference = REPO / "docs" / "paper-run" / "single-seed"
    single, optimum = read_parquet(reference / "training_runs.parquet"), read_parquet(reference / "training_prompt_lengths.parquet")
    offsets = np.array([-0.002, -0.001, 0.0, 0.001, 0.002])
    many = pd.concat([single] + [single.assign(seed=s, final_test_loss=single["final_test_loss"] * (1 + o))
                                 for s, o in enumerate(offsets)], ignore_index=True)
    many["final_test_loss"] *= 1.03
    tables = tmp_path / "tables"
    write_parquet(many, tables / "train" / "training_runs.parquet", {"rule": "t"})
    pairs = len(single.groupby(["model", "prompt_length"]))
    write_parquet(optimum.assign(optimal_linear_attention_test_risk=optimum["optimal_linear_attention_test_risk"] * 1.03),
                  tables / "train" / "training_prompt_lengths.parquet", {"rule": "t"})
    assert publish_single_seed(tables, reference, tmp_path / "s.md").endswith(f"at {pairs} of {pairs} (model, L)")
    assert "over R(Γ*)" in (tmp_path / "s.md").read_text()
    (tables / "train" / "training_prompt_lengths.parquet").unlink()  # raw losses: 3% off, outside every interval
    assert publish_single_seed(tables, reference, tmp_path / "s.md").endswith(f"at 0 of {pairs} (model, L)")


def test_busy_time_is_the_union_of_the_job_intervals():
    """A run in two sittings: overlapping jobs count once, the idle gap between sittings not at all."""
    assert busy_seconds([0, 5, 3, 100], [10, 8, 12, 110]) == 22.0
    assert busy_seconds([], []) == 0.0
    assert busy_seconds([0, 0], [5, 5]) == 5.0


def test_publish_leaves_out_per_run_trajectories_and_takes_the_runs_own_ledger(tmp_path):
    from largeprompt.ledger.claims import evaluate
    results = tmp_path / "results" / "r"
    write_parquet(pd.DataFrame({"x": [1.0]}), results / "train" / "L10.parquet", {"rule": "train", "git_commit": "abc"})
    write_parquet(pd.DataFrame({"x": [1.0]}), results / "train" / "training_runs.parquet",
                  {"rule": "summarize_training", "git_commit": "abc"})
    ledger = evaluate(lambda name: None)  # every claim `not run` without tables …
    ledger.loc[0, "verdict"] = "agrees"  # … but the run's own ledger (rule evaluate_claims) says otherwise
    write_parquet(ledger, results / "claims" / "claims.parquet", {"rule": "evaluate_claims", "git_commit": "abc"})
    (tmp_path / "figures" / "r").mkdir(parents=True)
    _benchmark(tmp_path / "benchmarks" / "r" / "bayes_risk.tsv", 1.0, 1.0, 1.0)
    out = tmp_path / "out"
    publish("r", out, root=tmp_path)
    assert (out / "tables" / "train" / "training_runs.parquet").exists()
    assert not (out / "tables" / "train" / "L10.parquet").exists()
    text = (out / "claims.md").read_text()
    assert "1 agrees" in text and "the run's ledger" in text
    (results / "claims" / "claims.parquet").unlink()
    publish("r", out, root=tmp_path)
    assert "agrees" not in (out / "claims.md").read_text().split("\n")[2]  # evaluated on the published tables instead
