# Shared helpers: config validation, run-scoped paths, params and code dependencies.
# No maths here: rules declare inputs, outputs and params, and call the library.
import os

import largeprompt
from largeprompt.io.config import ConfigError, check_config
from largeprompt.io.pipeline import code_settings, settings
from largeprompt.icl.schedules import estimated_runtime_minutes, estimated_steps

LIBRARY = os.path.dirname(os.path.dirname(largeprompt.__file__))
if os.path.realpath(LIBRARY) != os.path.realpath(os.path.join(workflow.basedir, "src")):
    raise WorkflowError(
        f"largeprompt is imported from {LIBRARY}, not from this checkout's src/: jobs would run, and reruns "
        "would follow, that other copy's code. Install this checkout (pip install -e .) or put its src/ first "
        "on PYTHONPATH."
    )

SCHEMA = os.path.join(workflow.basedir, "workflow", "schemas", "config.schema.yaml")

# Clear, key-naming errors first (this also reads "1e-3" as a number and checks the run name);
# then Snakemake's own validation fills the schema defaults.
try:
    check_config(config, SCHEMA)
except ConfigError as err:
    raise WorkflowError(str(err)) from None
validate(config, SCHEMA)

ENV = "../envs/largeprompt.yaml"
RUN = config["run"]
# Keys that cannot change a result: read by the job at run time and recorded in provenance.
RUNTIME_KEYS = ("device", "threads_per_job", "train.checkpoint_every")


def results(path):
    """A result file of this run: results/<run>/<path>."""
    return f"results/{RUN}/{path}"


def figures(path):
    return f"figures/{RUN}/{path}"


def logs(path):
    return f"logs/{RUN}/{path}"


def cfg(*keys):
    """``params:`` entries for config keys, recorded as ``key=value`` (unpack with ``**``)."""
    return settings(config, *keys, exclude=RUNTIME_KEYS)


def code(script):
    """``params:`` fingerprints of a workflow script and the library modules it imports (unpack with
    ``**``): editing their code reruns exactly the stages that use them; comments and docstrings do not.
    """
    return code_settings(os.path.join(workflow.basedir, "workflow", "scripts", script))


def training_runtime(prompt_length):
    """Cluster time limit (minutes) of one R6 training job, from the estimated step count."""
    t = config["train"]
    steps = estimated_steps(
        t["step_size_rule"],
        t["lr"],
        t["horizon"],
        t["stability_fraction"],
        t["final_lr"],
    )
    n_runs = len(t["models"]) * (len(t["seeds"]) + len(t["replicate_seeds"]))
    return estimated_runtime_minutes(steps, prompt_length, n_runs)


def transfer_runtime(prompt_length):
    t = config["transfer"]
    n_runs = len(t["models"]) * (len(t["seeds"]) + len(t["replicate_seeds"]))
    steps = estimated_steps("constant", t["lr"], t["horizon"]) * max(
        1, t["batch_size"] // 128
    )
    return estimated_runtime_minutes(steps, prompt_length, n_runs)


def gpu_request():
    """SLURM resources of a compute rule: one GPU when config ``device`` is cuda (README, Run on a cluster)."""
    return {"gres": "gpu:1"} if config["device"] == "cuda" else {}


def longest_prompt():
    """The test set's prompt length: the longest L trained (R6 or R4); shorter L read prefixes."""
    return max(config["train"]["prompt_lengths"] + config["transfer"]["prompt_lengths"])


# Config keys of the in-context task and of the R6 runs: what a training or flow job depends on.
ICL_TASK = ("icl.dim", "icl.covariance_rho", "icl.task_variance", "icl.noise_variance")
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


def full_model_flows():
    return expand(
        results("infinite/full_model_seed{seed}.parquet"), seed=config["train"]["seeds"]
    )


def training_trajectories():
    return expand(results("train/L{L}.parquet"), L=config["train"]["prompt_lengths"])


def transfer_trajectories():
    return expand(
        results("transfer/L{L}.parquet"), L=config["transfer"]["prompt_lengths"]
    )


def error_jobs():
    return expand(
        results("concentration/errors/{measure}/c{c}.parquet"),
        measure=config["bounds"]["measures"],
        c=[f"{float(c):g}" for c in config["bounds"]["c_values"]],
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
]
