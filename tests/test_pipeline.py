"""The Snakemake pipeline end to end on the smoke config, as a new user meets it (README).

One smoke run (module fixture) in a copy of the repository, then: the default profile is loaded, named
runs leave each other alone, no-op reruns, reruns that follow config values, code and nothing else,
readable rerun reasons, one-line errors for corrupt inputs, tidy tables, bit-identical data, provenance,
lint and formatting.
"""
import hashlib
import re
import shutil
import subprocess
import sys

import pyarrow.dataset as ds
import pytest
import yaml

from conftest import SMOKE, copy_repo, run, snakemake_cmd

pytestmark = pytest.mark.pipeline


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


def reason_rules(output: str, reason: str) -> set[str]:
    """The rules Snakemake lists under one reason in the 'Reasons:' summary of a dry run."""
    match = re.search(rf"^\s*{re.escape(reason)}:\n\s*(.+)$", output, flags=re.M)
    return set(match.group(1).replace(" ", "").split(",")) if match else set()


def dry_run(work, *args, config=SMOKE):
    extra = ("--configfile", config) if config else ()
    proc = run(snakemake_cmd("-n", *extra, *args), cwd=work)
    return proc.stdout + proc.stderr


def test_smoke_dag_runs_end_to_end_into_its_own_run(smoke_run):
    work, _, _ = smoke_run
    pdfs = sorted((work / "figures" / "smoke").glob("*.pdf"))
    assert len(pdfs) == 9
    for pdf in pdfs:
        assert pdf.stat().st_size > 1000 and pdf.with_suffix(".png").exists()
    for log in (work / "logs" / "smoke").rglob("*.log"):
        assert log.read_text().strip(), f"{log} is empty"
    assert "done in" in (work / "logs" / "smoke" / "affine_limit" / "simulate_affine_limit.log").read_text()
    assert {p.name for p in (work / "results").iterdir() if not p.name.startswith(".")} == {"smoke"}


def test_the_default_profile_is_loaded(smoke_run):
    work, _, _ = smoke_run
    assert "Using workflow specific profile profiles/default" in dry_run(work)


def test_another_run_is_not_touched_by_the_smoke_run(smoke_run):
    """Named runs: building the smoke run changes nothing the default run would do."""
    work, _, default_before = smoke_run
    default_after = dry_run(work, config=None)
    assert job_counts(default_after) == job_counts(default_before)
    assert "results/default/" in default_after and "results/smoke/" not in default_after


def test_noop_rerun_has_nothing_to_do(smoke_run):
    work, _, _ = smoke_run
    assert job_counts(dry_run(work)) == {}


def _changed_config(work, path, value) -> str:
    with open(work / SMOKE) as fh:
        smoke = yaml.safe_load(fh)
    node = smoke
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    target = work / "overlays" / f"changed_{'_'.join(path)}.yaml"
    target.parent.mkdir(exist_ok=True)
    target.write_text(yaml.safe_dump(smoke))
    return str(target.relative_to(work))


RATE_FIGURES = {"plot_output_concentration", "plot_gradient_concentration", "plot_rate_exponent"}
TRAINING = {"train", "summarize_training", "plot_training_vs_prompt_length", "plot_trajectory_transfer"}
CHANGES = [
    (("affine_limit", "n_prompts"), 21, {"simulate_affine_limit", "plot_affine_limit", "all"}),
    (("affine_limit", "ray", "n_points"), 7, {"make_queries", "simulate_affine_limit", "plot_affine_limit", "all"}),
    (("bounds", "n_bootstrap"), 60, {"estimate_rates", *RATE_FIGURES, "all"}),
    (("bounds", "fixed_query", "deltas"), [0.1, 0.02], {"simulate_fixed_query_bounds", "plot_fixed_query_bound", "all"}),
    (("infinite", "balanced_flow", "alphas"), [0.3, 1.5], {"balanced_flow", "plot_balanced_flow", "all"}),
    (("train", "lr"), 0.2, {*TRAINING, "all"}),
    (("train", "horizon"), 5, {"full_model_flow", *TRAINING, "all"}),
    (("transfer", "lr"), 0.04, {"train_transfer", "trajectory_gap", "plot_trajectory_transfer", "all"}),
    (("device",), "cpu", set()),
    (("threads_per_job",), 2, set()),
    (("train", "checkpoint_every"), 7, set()),
]


@pytest.mark.parametrize("path, value, expected", CHANGES, ids=[".".join(c[0]) for c in CHANGES])
def test_changed_config_value_reruns_exactly_the_affected_jobs(smoke_run, path, value, expected):
    work, _, _ = smoke_run
    assert set(job_counts(dry_run(work, config=_changed_config(work, path, value)))) == expected


def test_rerun_reasons_name_the_changed_key(smoke_run):
    work, _, _ = smoke_run
    with open(work / SMOKE) as fh:
        lr = yaml.safe_load(fh)["train"]["lr"]
    output = dry_run(work, config=_changed_config(work, ("train", "lr"), 0.2))
    assert f"before: train.lr={lr!r}" in output and "now: train.lr=0.2" in output


def test_adding_a_prompt_length_trains_only_the_new_length(smoke_run):
    work, _, _ = smoke_run
    with open(work / SMOKE) as fh:
        lengths = yaml.safe_load(fh)["train"]["prompt_lengths"]
    new = sorted(lengths + [int(min(lengths)) + 1])
    counts = job_counts(dry_run(work, config=_changed_config(work, ("train", "prompt_lengths"), new)))
    assert counts["train"] == 1  # one job trains every run at the new L
    assert "make_icl_test_set" not in counts and "simulate_errors" not in counts and "full_model_flow" not in counts


def test_editing_a_library_module_reruns_exactly_the_stages_that_import_it(smoke_run):
    work, _, _ = smoke_run
    module = work / "src" / "largeprompt" / "measures.py"
    original = module.read_text()
    module.write_text(original + "\n_AN_EDIT = 1\n")
    try:
        output = dry_run(work)
    finally:
        module.write_text(original)
    # Snakemake names one reason per job: a job whose inputs are rebuilt too is listed under those
    direct = reason_rules(output, "params have changed since last execution")
    assert {"simulate_affine_limit", "simulate_errors", "simulate_fixed_query_bounds", "full_model_flow",
            "make_icl_test_set"} <= direct
    assert {"train", "train_transfer", "bayes_risk", "summarize_training", "trajectory_gap"} <= set(job_counts(output))
    assert "make_queries" not in job_counts(output) and not any(r.startswith("plot_") for r in direct)
    assert "code:largeprompt/measures.py=" in output  # the reason names the module
    assert job_counts(dry_run(work)) == {}  # same code again: nothing to do


def test_editing_only_comments_and_docstrings_reruns_nothing(smoke_run):
    work, _, _ = smoke_run
    module = work / "src" / "largeprompt" / "measures.py"
    original = module.read_text()
    module.write_text('"""A reworded module docstring."""\n' + original.split('"""', 2)[2] + "\n# a comment\n")
    try:
        assert job_counts(dry_run(work)) == {}
    finally:
        module.write_text(original)


def test_editing_a_plotting_module_redraws_only_its_figure(smoke_run):
    work, _, _ = smoke_run
    module = work / "src" / "largeprompt" / "plots" / "affine_limit.py"
    original = module.read_text()
    module.write_text(original + "\nLINE_WIDTH = 1.5  # a style edit\n")
    try:
        assert set(job_counts(dry_run(work))) == {"plot_affine_limit", "all"}
    finally:
        module.write_text(original)  # the same code again: nothing to redraw
    assert job_counts(dry_run(work)) == {}


def test_a_corrupt_input_fails_with_one_line_naming_file_rule_and_command(tmp_path):
    """In its own copy: a failed job's outputs are deleted, and the session's smoke run must stay whole."""
    work = copy_repo(tmp_path / "repo")
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    run(snakemake_cmd("results/smoke/data/icl_test.parquet", "--cores", "1", "--configfile", SMOKE), cwd=work)
    victim = work / "results" / "smoke" / "data" / "icl_test.parquet"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 3])
    proc = run(snakemake_cmd("results/smoke/data/bayes_risk.parquet", "--cores", "1", "--configfile", SMOKE), cwd=work,
               check=False)
    assert proc.returncode != 0
    line = next(x for x in proc.stderr.splitlines() if x.startswith("error: results/smoke/data/icl_test.parquet"))
    assert "made by rule 'make_icl_test_set'" in line
    assert "snakemake --cores 2 --force results/smoke/data/icl_test.parquet --configfile config/smoke.yaml" in line
    inspect = run([sys.executable, "-m", "largeprompt.cli", "inspect", str(victim.relative_to(work))], cwd=work,
                  check=False)
    assert inspect.returncode == 2 and "make_icl_test_set" in inspect.stderr and "--force" in inspect.stderr


def test_tables_are_tidy(smoke_run):
    """One kind of row per file: a glob over every trajectory file reads as one table with integer keys."""
    work, _, _ = smoke_run
    trajectories = ds.dataset(work / "results" / "smoke" / "train", format="parquet").to_table().to_pandas()
    assert str(trajectories["seed"].dtype) == "int64" and str(trajectories["step"].dtype) == "int64"
    runs = ds.dataset(work / "results" / "smoke" / "summary" / "training_runs.parquet").to_table().to_pandas()
    assert "kind" not in runs and runs.groupby(["model", "prompt_length", "seed", "stream"]).size().eq(1).all()
    assert set(runs["status"]) <= {"ok", "trapped", "diverged"}


def test_progress_bars_count_steps(smoke_run):
    work, _, _ = smoke_run
    for log in (work / "logs" / "smoke" / "train").glob("L*.log"):
        counts = re.findall(r"\| (\d+)/(\d+) \[", log.read_text())
        done, total = map(int, counts[-1])
        assert done == total
        steps = ds.dataset(work / "results" / "smoke" / "train" / f"{log.stem}.parquet").to_table().to_pandas()["step"]
        assert total == steps.max()


def test_provenance_round_trips_through_inspect(smoke_run):
    work, _, _ = smoke_run
    with open(work / SMOKE) as fh:
        n_prompts = yaml.safe_load(fh)["affine_limit"]["n_prompts"]
    proc = run([sys.executable, "-m", "largeprompt.cli", "inspect", "results/smoke/affine_limit/affine_limit.parquet"],
               cwd=work)
    assert '"rule": "simulate_affine_limit"' in proc.stdout
    assert f'"n_prompts": {n_prompts}' in proc.stdout
    assert '"git_commit"' in proc.stdout and '"torch"' in proc.stdout and '"resolved_device": "cpu"' in proc.stdout


def _digests(work):
    return {
        p.relative_to(work).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((work / "results").rglob("*.parquet"))
    }


@pytest.mark.slow
def test_rerun_gives_bit_identical_parquet(smoke_run):
    work, _, _ = smoke_run
    before = _digests(work)
    assert before
    moved = work.parent / "results_first_run"
    shutil.copytree(work / "results", moved)
    shutil.rmtree(work / "results")
    run(snakemake_cmd("--cores", "2", *before.keys(), "--configfile", SMOKE), cwd=work, timeout=900)
    assert _digests(work) == before
    shutil.rmtree(work / "results")  # leave the tree as the fixture made it (figures depend on mtimes)
    shutil.move(moved, work / "results")


def test_lint_and_format_are_clean(smoke_run):
    work, _, _ = smoke_run
    proc = run(snakemake_cmd("--lint"), cwd=work, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr
    fmt = run([sys.executable, "-m", "snakefmt", "--check", "Snakefile", "workflow/rules"], cwd=work, check=False)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_html_report_builds(smoke_run):
    work, _, _ = smoke_run
    run(snakemake_cmd("--configfile", SMOKE, "--report", "report.html"), cwd=work)
    html = (work / "report.html").read_text(errors="replace")
    assert len(html) > 10_000 and "affine_limit" in html
