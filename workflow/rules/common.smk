# Shared helpers: config validation, run-scoped paths, params, code fingerprints, threads.
# No maths here: rules declare inputs, outputs and params, and call the library
# (docs/architecture.md#naming: rule = workflow/scripts/<rule>.py = largeprompt.stages.<rule>).
import os

import largeprompt
from largeprompt.io.config import ConfigError, check_config, migrate_deprecated
from largeprompt.io.pipeline import (
    claim_table_names,
    code_params,
    output_cache_dir,
    settings,
)
from largeprompt.icl.job_limits import (
    init_dependence_minutes,
    training_job_minutes,
    transfer_job_minutes,
    transfer_jobs_minutes,
)

LIBRARY = os.path.dirname(os.path.dirname(largeprompt.__file__))
if os.path.realpath(LIBRARY) != os.path.realpath(os.path.join(workflow.basedir, "src")):
    raise WorkflowError(
        f"largeprompt is imported from {LIBRARY}, not from this checkout's src/: jobs would run, and reruns "
        "would follow, that other copy's code. Install this checkout (pip install -e .) or put its src/ first "
        "on PYTHONPATH."
    )

SCHEMA = os.path.join(workflow.basedir, "workflow", "schemas", "config.schema.yaml")

# Renamed keys first (a deprecation message names the new key), then clear, key-naming errors (this also
# reads "1e-3" as a number and checks the run name); then Snakemake's own validation fills the defaults.
try:
    migrate_deprecated(config)
    check_config(config, SCHEMA)
except ConfigError as err:
    raise WorkflowError(str(err)) from None
validate(config, SCHEMA)

ENV = "../envs/largeprompt.yaml"
# `snakemake --cache` shares results between runs (docs/architecture.md#sharing-results): a job whose rule, params
# (config values and code fingerprints) and inputs equal those of a job already run, in any run, is fetched from
# Snakemake's between-workflow cache instead of recomputed. Without --cache, every job runs and Snakemake records
# its wall time, CPU time and peak memory (benchmark:); it refuses both on one rule (a fetched job has no cost).
SHARE = "omit-software" if workflow.workflow_settings.cache is not None else False
output_cache_dir(workflow.basedir)
RUN = config["run"]
# Keys that cannot change a result: read by the job at run time and recorded in provenance.
RUNTIME_KEYS = (
    "device",
    "threads_per_job",
    "train.checkpoint_every",
    "trajectory_transfer.checkpoint_every",
)


def results(path):
    """A result file of this run: results/<run>/<path>."""
    return f"results/{RUN}/{path}"


def figures(path):
    return f"figures/{RUN}/{path}"


def logs(path):
    return f"logs/{RUN}/{path}"


def benchmarks(path):
    """Snakemake's record of a job's wall time, CPU time and peak memory: benchmarks/<run>/<path>."""
    return f"benchmarks/{RUN}/{path}"


def cfg(*keys):
    """``params:`` entries for config keys, recorded as ``key=value`` (unpack with ``**``)."""
    return settings(config, *keys, exclude=RUNTIME_KEYS)


def code(script):
    """``params:`` fingerprints of the code a rule's script reaches, definition by definition (unpack with
    ``**``; docs/architecture.md#fingerprints): editing it reruns exactly the rules that use it.
    """
    return code_params(os.path.join(workflow.basedir, "workflow", "scripts", script))


def threads(compute=True):
    """Threads of a job: config ``threads_per_job`` for the compute rules (also torch's thread count in
    the job), 1 for the rest."""
    return config["threads_per_job"] if compute else 1


def gpu_request():
    """SLURM resources of a compute rule: one GPU when config ``device`` is cuda (README, Run on a cluster)."""
    return {"gres": "gpu:1"} if config["device"] == "cuda" else {}


def training_runtime(prompt_length, section=None):
    """Cluster time limit (minutes) of one R6 training job (``section``: that of the runs, default config section
    train)."""
    return training_job_minutes(section or config["train"], prompt_length)


def transfer_runtime(prompt_length, section=None):
    """Cluster time limit (minutes) of one R4 transfer job (default config section transfer)."""
    return transfer_job_minutes(section or config["trajectory_transfer"], prompt_length)


def beyond_section(kind):
    """Section ``train`` or ``trajectory_transfer`` with the keys of ``beyond_gaussian.<kind>`` over it."""
    return {**config[kind], **config["beyond_gaussian"][kind]}


def beyond_runtime(kind, prompt_length=None):
    """Cluster time limit (minutes) of a train_beyond_gaussian job at ``prompt_length``, or of a
    train_trajectory_transfer_beyond_gaussian job (every L in turn)."""
    if kind == "train":
        return training_runtime(prompt_length, beyond_section("train"))
    return transfer_jobs_minutes(beyond_section("trajectory_transfer"))


def longest_prompt():
    """The test set's prompt length: the longest L trained (R6 or R4); shorter L read prefixes."""
    return max(
        [
            *config["train"]["prompt_lengths"],
            *config["trajectory_transfer"]["prompt_lengths"],
        ]
    )


# Config keys of the in-context task and of the R6 runs: what a training or flow job depends on. The quadrature of
# softmax's R∞ is used only with bounded covariates, so only then does it rerun anything.
ICL_TASK = (
    "icl.dim",
    "icl.covariance_rho",
    "icl.task_variance",
    "icl.noise_variance",
    "icl.token_measure",
) + (() if config["icl"]["token_measure"] == "gaussian" else ("icl.quadrature",))
TRAIN_RUNS = tuple(
    f"train.{k}"
    for k in (
        "models",
        "seeds",
        "replicate_seeds",
        "batch_size",
        "lr",
        "step_size_rule",
        "stability_fraction",
        "horizon",
        "decay_start",
        "decay_end",
        "final_lr",
        "n_log",
        "divergence_threshold",
        "fatal_divergence",
        "dtype",
    )
)


# The isotropic task of section beyond_gaussian, and the keys of section train its R6 runs keep (the rest it overrides).
BEYOND_TASK = (
    "beyond_gaussian.dim",
    "beyond_gaussian.task_variance",
    "beyond_gaussian.noise_variance",
    "beyond_gaussian.quadrature",
)
BEYOND_TRAIN = tuple(
    k
    for k in TRAIN_RUNS
    if k.split(".")[1] not in config["beyond_gaussian"]["train"]
    and k != "train.prompt_lengths"
)


def transfer_files():
    """The endings of one measure's R4 files, one per L of beyond_gaussian.trajectory_transfer: L{L}.parquet."""
    return [
        f"L{L}.parquet"
        for L in config["beyond_gaussian"]["trajectory_transfer"]["prompt_lengths"]
    ]


def beyond_gaussian_flows(with_gaussian=False):
    """The L = ∞ flow file of every token measure of section beyond_gaussian (and gaussian's, which holds linear
    attention's flows, if ``with_gaussian``)."""
    measures = config["beyond_gaussian"]["token_measures"]
    return expand(
        results("beyond_gaussian/{token_measure}/flows.parquet"),
        token_measure={"gaussian", *measures} if with_gaussian else measures,
    )


def beyond_gaussian_runs(kind):
    """The R6 (``train``) or R4 (``trajectory_transfer``) trajectory files of every (measure, L) of section beyond_gaussian."""
    section = config["beyond_gaussian"]
    return expand(
        results(f"beyond_gaussian/{{token_measure}}/{kind}_L{{L}}.parquet"),
        token_measure=section["token_measures"],
        L=section[kind]["prompt_lengths"],
    )


def full_model_flows():
    return expand(
        results("infinite/full_model_seed{seed}.parquet"), seed=config["train"]["seeds"]
    )


def training_trajectories():
    return expand(results("train/L{L}.parquet"), L=config["train"]["prompt_lengths"])


def transfer_trajectories():
    return expand(
        results("trajectory_transfer/L{L}.parquet"),
        L=config["trajectory_transfer"]["prompt_lengths"],
    )


def error_jobs():
    return expand(
        results("concentration/errors/{token_measure}.parquet"),
        token_measure=config["concentration"]["token_measures"],
    )


# The tables of estimate_concentration_rates, one kind of row each (largeprompt.maths.rate_tables).
RATE_TABLES = (
    "exponents",
    "local_exponents",
    "error_statistics",
    "rate_guides",
    "leading_coefficients",
    "asymptotic_constants",
    "paper_form_fits",
    "exponent_curves",
)

FIGURES = [
    "affine_limit",
    "output_concentration",
    "gradient_concentration",
    "rate_exponent",
    "fixed_query_bound",
    "balanced_flow",
    "training_vs_prompt_length",
    "init_dependence",
    "trajectory_transfer",
    "beyond_gaussian",
]


def claim_tables():
    """The summary tables the claims ledger reads (largeprompt.ledger.claims.CLAIMS), in this run."""
    source = os.path.join(workflow.basedir, "src", "largeprompt", "ledger", "claims.py")
    return [results(t) for t in claim_table_names(source)]


def result_files(rules):
    """Every result file of this run: the outputs of every rule but the figures, wildcards expanded."""
    fixed = [
        str(f)
        for r in rules
        if r.name != "all" and not r.name.startswith("plot_") and not r.has_wildcards()
        for f in r.output
    ]
    return (
        fixed
        + full_model_flows()
        + training_trajectories()
        + transfer_trajectories()
        + error_jobs()
        + beyond_gaussian_runs("train")
        + beyond_gaussian_runs("trajectory_transfer")
        + beyond_gaussian_flows(with_gaussian=True)
    )
