"""The Snakemake pipeline end to end on the smoke config (SPEC §3.1, §3.4, §5).

One smoke run (module fixture) in a copy of the repository, then: no-op reruns, exact
rerun triggers for changed config values and plotting modules, bit-identical data on rerun,
provenance through `largeprompt inspect`, lint and the HTML report.
"""
import copy
import hashlib
import re
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from conftest import copy_repo, run, snakemake_cmd

pytestmark = pytest.mark.pipeline
SMOKE = "config/smoke.yaml"


def job_counts(output: str) -> dict[str, int]:
    """Rule → job count from Snakemake's 'Job stats' table."""
    if "Nothing to be done" in output:
        return {}
    block = output.split("Job stats:", 1)[1]
    counts = {}
    for line in block.splitlines():
        m = re.match(r"^(\w+)\s+(\d+)\s*$", line.strip())
        if m and m.group(1) != "total":
            counts[m.group(1)] = int(m.group(2))
        if line.strip().startswith("total"):
            break
    return counts


def dry_run(work, *args):
    proc = run(snakemake_cmd("-n", "--configfile", SMOKE, *args), cwd=work)
    return job_counts(proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    work = copy_repo(tmp_path_factory.mktemp("pipeline") / "repo")
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    start = time.perf_counter()
    proc = run(snakemake_cmd("--cores", "2", "--configfile", SMOKE), cwd=work, timeout=600)
    elapsed = time.perf_counter() - start
    return work, elapsed, proc


def test_smoke_dag_runs_end_to_end_in_under_two_minutes(smoke_run):
    work, elapsed, proc = smoke_run
    print(f"smoke DAG wall time: {elapsed:.1f} s")
    assert elapsed < 120, f"smoke DAG took {elapsed:.0f} s"
    for pdf in (work / "figures").glob("*.pdf"):
        assert pdf.stat().st_size > 1000 and pdf.with_suffix(".png").exists()
    assert (work / "figures" / "affine_limit.png").exists()
    for log in (work / "logs").rglob("*.log"):
        assert log.read_text().strip(), f"{log} is empty"
    assert "done in" in (work / "logs" / "bounds" / "simulate_affine_limit.log").read_text()


def test_noop_rerun_has_nothing_to_do(smoke_run):
    work, _, _ = smoke_run
    assert dry_run(work) == {}


def _changed_config(work, path, value) -> str:
    with open(work / SMOKE) as fh:
        smoke = yaml.safe_load(fh)
    with open(work / "config" / "config.yaml") as fh:
        default = yaml.safe_load(fh)
    node, base = smoke, default
    for key in path[:-1]:
        base = base[key]
        node = node.setdefault(key, copy.deepcopy(base) if not isinstance(base, dict) else {})
    node[path[-1]] = value
    target = work / "config" / f"changed_{'_'.join(path)}.yaml"
    target.write_text(yaml.safe_dump(smoke))
    return str(target.relative_to(work))


RATE_FIGURES = {"plot_output_concentration", "plot_gradient_concentration", "plot_rate_exponent"}
CHANGES = [
    (("affine_limit", "n_prompts"), 21, {"simulate_affine_limit", "plot_affine_limit", "all"}),
    (("affine_limit", "ray", "n_points"), 7, {"make_queries", "simulate_affine_limit", "plot_affine_limit", "all"}),
    (("bounds", "n_bootstrap"), 60, {"estimate_rates", *RATE_FIGURES, "all"}),
    (("bounds", "fixed_query", "deltas"), [0.1, 0.02], {"simulate_fixed_query_bounds", "plot_fixed_query_bound", "all"}),
    (("infinite", "balanced_flow", "alphas"), [0.3, 1.5], {"balanced_flow", "plot_balanced_flow", "all"}),
    (
        ("train", "lr"),
        0.2,
        {"train", "summarize_training", "full_model_flow", "trajectory_gap",
         "plot_training_vs_prompt_length", "plot_trajectory_transfer", "all"},
    ),
]


@pytest.mark.parametrize("path, value, expected", CHANGES, ids=[".".join(c[0]) for c in CHANGES])
def test_changed_config_value_reruns_exactly_the_affected_jobs(smoke_run, path, value, expected):
    work, _, _ = smoke_run
    changed = _changed_config(work, path, value)
    proc = run(snakemake_cmd("-n", "--configfile", changed), cwd=work)
    assert set(job_counts(proc.stdout + proc.stderr)) == expected


def test_adding_a_prompt_length_trains_only_the_new_runs(smoke_run):
    work, _, _ = smoke_run
    with open(work / SMOKE) as fh:
        lengths = yaml.safe_load(fh)["train"]["prompt_lengths"]
    new = sorted(lengths + [int(min(lengths)) + 1])
    changed = _changed_config(work, ("train", "prompt_lengths"), new)
    proc = run(snakemake_cmd("-n", "--configfile", changed), cwd=work)
    counts = job_counts(proc.stdout + proc.stderr)
    assert counts["train"] == 2  # softmax and linear at the new L, one seed in the smoke config
    assert "make_icl_test_set" not in counts and "simulate_errors" not in counts


def test_editing_a_plotting_module_redraws_only_its_figure(smoke_run):
    work, _, _ = smoke_run
    module = work / "src" / "largeprompt" / "plots" / "affine_limit.py"
    original = module.read_text()
    module.write_text(original + "\n# a style edit\n")
    try:
        assert set(dry_run(work)) == {"plot_affine_limit", "all"}
    finally:
        module.write_text(original)  # same content again: Snakemake's checksum sees no change
    assert dry_run(work) == {}


def test_provenance_round_trips_through_inspect(smoke_run):
    work, _, _ = smoke_run
    with open(work / SMOKE) as fh:
        n_prompts = yaml.safe_load(fh)["affine_limit"]["n_prompts"]
    proc = run([sys.executable, "-m", "largeprompt.cli", "inspect", "results/bounds/affine_limit.parquet"], cwd=work)
    assert '"rule": "simulate_affine_limit"' in proc.stdout
    assert f'"n_prompts": {n_prompts}' in proc.stdout
    assert '"git_commit"' in proc.stdout and '"torch"' in proc.stdout


def _digests(work):
    return {
        p.relative_to(work).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((work / "results").rglob("*.parquet"))
    }


def test_rerun_gives_bit_identical_parquet(smoke_run):
    work, _, _ = smoke_run
    before = _digests(work)
    assert before
    moved = work.parent / "results_first_run"
    shutil.copytree(work / "results", moved)
    shutil.rmtree(work / "results")
    run(snakemake_cmd("--cores", "2", *before.keys(), "--configfile", SMOKE), cwd=work, timeout=600)
    after = _digests(work)
    assert after == before
    # leave the tree as the fixture made it (figures depend on the results' mtimes)
    shutil.rmtree(work / "results")
    shutil.move(moved, work / "results")


def test_lint_is_clean(smoke_run):
    work, _, _ = smoke_run
    proc = run(snakemake_cmd("--lint"), cwd=work, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr


def test_html_report_builds(smoke_run):
    work, _, _ = smoke_run
    run(snakemake_cmd("--configfile", SMOKE, "--report", "report.html"), cwd=work)
    html = (work / "report.html").read_text(errors="replace")
    assert len(html) > 10_000 and "affine_limit" in html
