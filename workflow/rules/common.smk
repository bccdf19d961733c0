# Shared helpers: config validation and the list of figures. No maths here (SPEC §3.1).
import os

from largeprompt.config import ConfigError, canonical, check_config
from largeprompt.training import estimated_runtime_minutes

SCHEMA = os.path.join(workflow.basedir, "workflow", "schemas", "config.schema.yaml")

# Clear, key-naming errors first; then Snakemake's own validation fills schema defaults.
try:
    check_config(config, SCHEMA)
except ConfigError as err:
    raise WorkflowError(str(err)) from None
validate(config, SCHEMA)

ENV = "../envs/largeprompt.yaml"


def cfg(*keys):
    """The config value at ``keys``, key order canonicalised: use it for every ``params:`` entry."""
    node = config
    for key in keys:
        node = node[key]
    return canonical(node)

FIGURES = ["affine_limit", "output_concentration", "gradient_concentration", "rate_exponent", "fixed_query_bound", "balanced_flow", "training_vs_prompt_length", "trajectory_transfer"]


# In-context regression (SPEC §3.1 stages 1–3): params subsets and the lists of training outputs.
ICL_TASK_KEYS = ("dim", "covariance_rho", "task_variance", "noise_variance")
TRAIN_RUN_KEYS = ("steps", "batch_size", "lr", "log_every", "checkpoint_every", "divergence_threshold", "fatal_divergence", "dtype")


def icl_task_settings():
    """The task keys of config ``icl`` (not n_test): what a training or flow job depends on."""
    return {k: cfg("icl", k) for k in ICL_TASK_KEYS}


def train_settings():
    """The per-run keys of config ``train`` (not the L grid, seeds or models, so adding an L reruns nothing else)."""
    return {k: cfg("train", k) for k in TRAIN_RUN_KEYS}


def train_clock():
    """The keys that fix the logged training times t = lr · step."""
    return {k: cfg("train", k) for k in ("steps", "lr", "log_every")}


def train_runtime(wildcards):
    """SLURM time limit (minutes) of one training job, from the measured per-step cost."""
    return estimated_runtime_minutes(config["train"]["steps"], int(wildcards.L))


def ode_tolerances():
    return {k: cfg("infinite", k) for k in ("rtol", "atol")}


def training_runs():
    return expand(
        "results/train/{model}/L{L}/seed{seed}.parquet",
        model=config["train"]["models"],
        L=config["train"]["prompt_lengths"],
        seed=config["train"]["seeds"],
    )


def full_model_flows():
    return expand("results/infinite/full_model_seed{seed}.parquet", seed=config["train"]["seeds"])


def all_figures():
    return expand("figures/{name}.{ext}", name=FIGURES, ext=["pdf", "png"])
