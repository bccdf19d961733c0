"""The Snakemake pipeline end to end on the smoke config, as a new user meets it (README).

One smoke run (session fixture) in a copy of the repository, then: the default profile is loaded, named
runs leave each other alone, no-op reruns, reruns that follow config values, code and nothing else,
readable rerun reasons, one-line errors for corrupt inputs, tidy tables, bit-identical data, provenance,
lint and formatting. The smoke run is shared: tests read it, and a test that edits files or results works in
its own copy (helpers.copy_repo with ``source``); config overlays are written outside it.
"""
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import yaml

from helpers import SMOKE, copy_repo, run, snakemake_cmd, workflow_rules

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
    assert len(pdfs) == 10
    for pdf in pdfs:
        assert pdf.stat().st_size > 1000 and pdf.with_suffix(".png").exists()
    for log in (work / "logs" / "smoke").rglob("*.log"):
        assert log.read_text().strip(), f"{log} is empty"
    assert "done in" in (work / "logs" / "smoke" / "affine_limit" / "simulate_affine_limit.log").read_text()
    assert {p.name for p in (work / "results").iterdir() if not p.name.startswith(".")} == {"smoke"}
    assert {p.name for p in (work / "benchmarks").iterdir()} == {"smoke"}  # each run keeps its own job costs
    assert (work / "benchmarks" / "smoke" / "simulate_affine_limit.tsv").is_file()
    assert not (work / "results" / "smoke" / "checkpoints").exists() or not any((work / "results" / "smoke" / "checkpoints").rglob("*.pt"))


def test_every_figure_carries_its_run_rule_and_input_hashes(smoke_run):
    """docs/architecture.md#figure-provenance: each PNG and PDF of the smoke run names its run and rule and the sha256
    of every table its rule read, which are the tables on disk."""
    from largeprompt.io.figure_provenance import read_figure_record
    work, _, _ = smoke_run
    for figure in sorted((work / "figures" / "smoke").glob("*.p[dn][fg]")):
        record = read_figure_record(figure)
        assert record is not None, figure
        assert record["run"] == "smoke" and record["rule"] == f"plot_{figure.stem}"
        assert record["inputs"] and len(record["git_commit"]) >= 7
        for path, digest in record["inputs"].items():
            assert hashlib.sha256((work / path).read_bytes()).hexdigest() == digest, (figure, path)


def test_the_smoke_run_reads_as_claims_with_a_verdict_each(smoke_run):
    """docs/experiments.md#claims: the ledger of the smoke run has a row per claim and a verdict in each."""
    from largeprompt.commands import reading
    from largeprompt.ledger.claims import CLAIMS
    from largeprompt.ledger.verdicts import VERDICTS
    work, _, _ = smoke_run
    ledger = reading.ledger_of("smoke", work)
    assert set(ledger["verdict"]) <= set(VERDICTS)
    assert {cid.split("/")[0] for cid in ledger["claim_id"]} == {c.claim_id for c in CLAIMS}
    assert reading.claims("smoke", "markdown", work).startswith("| claim_id | kind | claim | verdict")


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


def _changed_config(work, folder, path, value) -> str:
    """The smoke config with one value changed, written in ``folder`` (outside the shared checkout)."""
    with open(work / SMOKE) as fh:
        smoke = yaml.safe_load(fh)
    node = smoke
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    target = folder / f"changed_{'_'.join(path)}.yaml"
    target.write_text(yaml.safe_dump(smoke))
    return str(target)


RATE_FIGURES = {"plot_output_concentration", "plot_gradient_concentration", "plot_rate_exponent"}
TRAINING = {"train", "summarize_training", "plot_training_vs_prompt_length", "plot_trajectory_transfer"}
BEYOND = {"summarize_beyond_gaussian", "plot_beyond_gaussian"}  # beyond_gaussian keeps train's lr and transfer's lr
# every change that rebuilds a summary table also re-reads the run as claims (evaluate_claims) and its numbers.tex
LEDGER = {"evaluate_claims", "write_numbers", "all"}
CHANGES = [
    (("affine_limit", "n_prompts"), 21, {"simulate_affine_limit", "plot_affine_limit", *LEDGER}),
    (("affine_limit", "ray", "n_points"), 7, {"make_affine_limit_queries", "simulate_affine_limit", "plot_affine_limit", *LEDGER}),
    (("concentration", "n_bootstrap"), 60, {"estimate_concentration_rates", *RATE_FIGURES, *LEDGER}),
    (("concentration", "n_repetitions"), 300, {"simulate_concentration_errors", "collect_concentration_errors",
                                               "estimate_concentration_rates", *RATE_FIGURES, *LEDGER}),
    (("fixed_query_bound", "deltas"), [0.1, 0.02], {"simulate_fixed_query_bound", "plot_fixed_query_bound", *LEDGER}),
    (("bounds", "n_bootstrap"), 60, {"estimate_concentration_rates", *RATE_FIGURES, *LEDGER}),  # the deprecated section
    (("infinite", "balanced_flow", "alphas"), [0.3, 1.5], {"balanced_flow", "plot_balanced_flow", *LEDGER}),
    (("train", "lr"), 0.2, {*TRAINING, "train_beyond_gaussian", *BEYOND, *LEDGER}),
    (("train", "horizon"), 5, {"full_model_flow", *TRAINING, *LEDGER}),
    (("trajectory_transfer", "lr"), 0.04, {"train_trajectory_transfer", "summarize_trajectory_transfer", "plot_trajectory_transfer",
                                           "train_trajectory_transfer_beyond_gaussian", *BEYOND, *LEDGER}),
    (("beyond_gaussian", "train", "horizon"), 3, {"flow_beyond_gaussian", "train_beyond_gaussian", *BEYOND, *LEDGER}),
    (("device",), "cpu", set()),
    (("threads_per_job",), 2, set()),
    (("train", "checkpoint_every"), 7, set()),
]


@pytest.mark.parametrize("path, value, expected", CHANGES, ids=[".".join(c[0]) for c in CHANGES])
def test_changed_config_value_reruns_exactly_the_affected_jobs(smoke_run, tmp_path, path, value, expected):
    work, _, _ = smoke_run
    assert set(job_counts(dry_run(work, config=_changed_config(work, tmp_path, path, value)))) == expected


def test_rerun_reasons_name_the_changed_key(smoke_run, tmp_path):
    work, _, _ = smoke_run
    with open(work / SMOKE) as fh:
        lr = yaml.safe_load(fh)["train"]["lr"]
    output = dry_run(work, config=_changed_config(work, tmp_path, ("train", "lr"), 0.2))
    assert f"before: train.lr={lr!r}" in output and "now: train.lr=0.2" in output


def test_adding_a_prompt_length_trains_only_the_new_length(smoke_run, tmp_path):
    work, _, _ = smoke_run
    with open(work / SMOKE) as fh:
        lengths = yaml.safe_load(fh)["train"]["prompt_lengths"]
    new = sorted(lengths + [int(min(lengths)) + 1])
    counts = job_counts(dry_run(work, config=_changed_config(work, tmp_path, ("train", "prompt_lengths"), new)))
    assert counts["train"] == 1  # one job trains every run at the new L
    assert "make_icl_test_set" not in counts and "simulate_concentration_errors" not in counts and "full_model_flow" not in counts


@pytest.fixture
def edited_copy(smoke_run, tmp_path):
    """A private copy of the built smoke run (results, file times and Snakemake's records included), safe to edit."""
    return copy_repo(tmp_path / "repo", source=smoke_run[0])


CLAIM_TABLE_RULES = {  # the rule that writes each table the claims read (docs/architecture.md#naming)
    "affine_limit/leading_coefficients.parquet": "simulate_affine_limit",
    "concentration/leading_coefficients.parquet": "estimate_concentration_rates",
    "concentration/exponents.parquet": "estimate_concentration_rates",
    "fixed_query_bound/quantiles.parquet": "simulate_fixed_query_bound",
    "trajectory_transfer/gaps.parquet": "summarize_trajectory_transfer",
    "infinite/balanced_flow.parquet": "balanced_flow",
    "train/training_prompt_lengths.parquet": "summarize_training",
    "init_dependence/classes.parquet": "summarize_init_dependence",
    "beyond_gaussian/gaps.parquet": "summarize_beyond_gaussian",
    "beyond_gaussian/prompt_lengths.parquet": "summarize_beyond_gaussian",
    "beyond_gaussian/optima.parquet": "summarize_beyond_gaussian",
}


def test_an_overlay_changing_the_noise_moves_only_the_claims_that_read_it(edited_copy, tmp_path):
    """docs/experiments.md#claims: after an overlay changes icl.noise_variance, the claims whose tables it rebuilds may
    move and R6.linear does; every other claim keeps its value and unadjusted verdict bit for bit; compare names the
    changed key."""
    from largeprompt.commands import reading
    from largeprompt.ledger.claims import CLAIMS
    work = edited_copy
    changed = _changed_config(work, tmp_path, ("icl", "noise_variance"), 0.3)
    rebuilt = set(job_counts(dry_run(work, config=changed)))
    assert set(CLAIM_TABLE_RULES) == {c.table for c in CLAIMS}
    reads_noise = {c.claim_id for c in CLAIMS if CLAIM_TABLE_RULES[c.table] in rebuilt}
    assert "R6.linear" in reads_noise and "R1" not in reads_noise
    shutil.copytree(work / "results" / "smoke", work / "results" / "before")
    run(snakemake_cmd("--cores", "2", "--configfile", changed), cwd=work, timeout=1200)
    before, after = reading.ledger_of("before", work), reading.ledger_of("smoke", work)
    both = before.merge(after, on="claim_id", suffixes=("_before", "_after"))
    assert len(both) == len(before) == len(after)
    for r in both.itertuples():
        same = r.value_before == r.value_after or (np.isnan(r.value_before) and np.isnan(r.value_after))
        if r.claim_id.split("/")[0] not in reads_noise:
            # its own test is unchanged; its Holm-adjusted verdict may move with the other claims' p-values
            assert same and r.verdict_unadjusted_before == r.verdict_unadjusted_after, r.claim_id
    linear = both.set_index("claim_id").loc["R6.linear"]
    assert linear["value_before"] != linear["value_after"]
    out = reading.compare("before", "smoke", work)
    assert "icl.noise_variance" in out.split("## claims")[0]


def test_editing_a_library_module_reruns_exactly_the_stages_that_use_it(edited_copy):
    work = edited_copy
    module = work / "src" / "largeprompt" / "maths" / "measures.py"
    original = module.read_text()
    # a statement that runs at import: it counts wherever any definition of the module is reached
    module.write_text(original + "\npass\n")
    output = dry_run(work)
    # Snakemake names one reason per job: a job whose inputs are rebuilt too is listed under those
    direct = reason_rules(output, "params have changed since last execution")
    assert {"simulate_affine_limit", "simulate_concentration_errors", "simulate_fixed_query_bound", "full_model_flow",
            "make_icl_test_set"} <= direct
    assert {"train", "train_trajectory_transfer", "bayes_risk", "summarize_training", "summarize_trajectory_transfer"} <= set(job_counts(output))
    assert "make_affine_limit_queries" not in job_counts(output) and not any(r.startswith("plot_") for r in direct)
    assert "code:largeprompt/maths/measures.py=" in output  # the reason names the module
    module.write_text(original)
    assert job_counts(dry_run(work)) == {}  # same code again: nothing to do


def test_editing_only_comments_and_docstrings_reruns_nothing(edited_copy):
    work = edited_copy
    module = work / "src" / "largeprompt" / "maths" / "measures.py"
    original = module.read_text()
    module.write_text('"""A reworded module docstring."""\n' + original.split('"""', 2)[2] + "\n# a comment\n")
    assert job_counts(dry_run(work)) == {}


def test_editing_a_plotting_module_redraws_only_its_figure(edited_copy):
    work = edited_copy
    module = work / "src" / "largeprompt" / "plots" / "affine_limit.py"
    original = module.read_text()
    assert original.count("pad = 0.35 * (hi - lo)") == 1
    module.write_text(original.replace("pad = 0.35 * (hi - lo)", "pad = 0.4 * (hi - lo)"))  # a style edit
    assert set(job_counts(dry_run(work))) == {"plot_affine_limit", "all"}
    module.write_text(original)  # the same code again: nothing to redraw
    assert job_counts(dry_run(work)) == {}


@pytest.mark.slow  # two Snakemake runs in a fresh copy: 10-20 s
def test_a_corrupt_input_fails_with_one_line_naming_file_rule_and_command(tmp_path):
    """In its own copy: a failed job's outputs are deleted, and the session's smoke run must stay whole."""
    work = copy_repo(tmp_path / "repo")
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    run(snakemake_cmd("results/smoke/icl/test_set.parquet", "--cores", "1", "--configfile", SMOKE), cwd=work)
    victim = work / "results" / "smoke" / "icl" / "test_set.parquet"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 3])
    proc = run(snakemake_cmd("results/smoke/icl/bayes_risk.parquet", "--cores", "1", "--configfile", SMOKE), cwd=work,
               check=False)
    assert proc.returncode != 0
    line = next(x for x in proc.stderr.splitlines() if x.startswith("error: results/smoke/icl/test_set.parquet"))
    assert "made by rule 'make_icl_test_set'" in line
    assert "snakemake --cores 2 --force results/smoke/icl/test_set.parquet --configfile config/smoke.yaml" in line
    inspect = run([sys.executable, "-m", "largeprompt.commands.cli", "inspect", str(victim.relative_to(work))], cwd=work,
                  check=False)
    assert inspect.returncode == 2 and "make_icl_test_set" in inspect.stderr and "--force" in inspect.stderr


RATE_TABLE_KEYS = {  # docs/architecture.md#tables: what one row of each rate table is
    "exponents": ["token_measure", "metric", "c", "statistic"],
    "local_exponents": ["token_measure", "metric", "c", "statistic", "prompt_length"],
    "error_statistics": ["token_measure", "metric", "c", "statistic", "prompt_length"],
    "rate_guides": ["token_measure", "metric", "c", "statistic", "prompt_length"],
    "leading_coefficients": ["token_measure", "metric", "c"],
    "asymptotic_constants": ["token_measure", "metric", "c"],
    "paper_form_fits": ["token_measure", "metric"],
    "exponent_curves": ["curve", "token_measure", "metric", "c"],
}


def test_tables_are_tidy(smoke_run):
    """One kind of row per file: a glob over every trajectory file reads as one table with integer keys, and the
    weights as one list column."""
    work, _, _ = smoke_run
    files = sorted(str(p) for p in (work / "results" / "smoke" / "train").glob("L*.parquet"))
    assert len(files) == 2  # smoke trains at two prompt lengths
    table = ds.dataset(files, format="parquet").to_table()
    trajectories = table.to_pandas()
    assert str(trajectories["seed"].dtype) == "int64" and str(trajectories["step"].dtype) == "int64"
    assert pa.types.is_list(table.schema.field("theta").type) and not any(c.startswith("theta_") for c in trajectories)
    assert trajectories["theta"].map(len).eq(3 * 6 * 6 + 6).all()  # Q, K, V (D × D), O (1 × D), D = d + 1 = 6
    runs = ds.dataset(work / "results" / "smoke" / "train" / "training_runs.parquet").to_table().to_pandas()
    assert "kind" not in runs and runs.groupby(["model", "prompt_length", "seed", "stream"]).size().eq(1).all()
    assert set(runs["status"]) <= {"ok", "trapped", "diverged"}
    # the rate tables: one file per kind of row (docs/architecture.md#tables), unique on its keys, no "quantity" column
    made = {Path(f).stem for f in workflow_rules()["estimate_concentration_rates"].outputs}
    assert made == set(RATE_TABLE_KEYS)
    for name, keys in RATE_TABLE_KEYS.items():
        table = pd.read_parquet(work / "results" / "smoke" / "concentration" / f"{name}.parquet")
        assert len(table) and "quantity" not in table and set(keys) <= set(table.columns), name
        assert not table.duplicated(keys).any(), name
        if "prompt_length" in keys:
            assert pd.api.types.is_integer_dtype(table["prompt_length"]), name


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
    proc = run([sys.executable, "-m", "largeprompt.commands.cli", "inspect", "results/smoke/affine_limit/outputs.parquet"],
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
def test_rerun_gives_bit_identical_parquet(smoke_run, edited_copy):
    before = _digests(smoke_run[0])
    assert before
    shutil.rmtree(edited_copy / "results")  # in a copy: the shared smoke run keeps its results
    run(snakemake_cmd("--cores", "2", *before.keys(), "--configfile", SMOKE), cwd=edited_copy, timeout=900)
    assert _digests(edited_copy) == before


def test_lint_and_format_are_clean(smoke_run):
    work, _, _ = smoke_run
    proc = run(snakemake_cmd("--lint"), cwd=work, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr
    fmt = run([sys.executable, "-m", "snakefmt", "--check", "Snakefile", "workflow/rules"], cwd=work, check=False)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_html_report_builds(smoke_run, tmp_path):
    work, _, _ = smoke_run
    report = tmp_path / "report.html"  # outside the shared checkout
    run(snakemake_cmd("--configfile", SMOKE, "--report", str(report)), cwd=work)
    html = report.read_text(errors="replace")
    assert len(html) > 10_000 and "affine_limit" in html
