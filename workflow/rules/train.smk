# Stage 2: training at each prompt length (docs/experiments.md#training-protocol). One job per L
# trains every (model, seed) run at that L; the checkpoint lives outside the declared outputs, so it
# survives a killed (incomplete) job and the rerun resumes from it.

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
        "n_log",
        "divergence_threshold",
        "fatal_divergence",
        "dtype",
    )
)


def full_model_flows():
    return expand(results("infinite/full_model_seed{seed}.parquet"), seed=config["train"]["seeds"])


def training_trajectories():
    return expand(results("train/L{L}.parquet"), L=config["train"]["prompt_lengths"])


def transfer_trajectories():
    return expand(results("transfer/L{L}.parquet"), L=config["transfer"]["prompt_lengths"])


rule train:
    input:
        test_set=results("data/icl_test.parquet"),
        flows=full_model_flows(),
        code=code("train.py"),
    output:
        trajectories=results("train/L{L}.parquet"),
    params:
        prompt_length=lambda w: int(w.L),
        checkpoint=lambda w: results(f"checkpoints/train/L{w.L}.pt"),
        **cfg("seed", *ICL_TASK, *TRAIN_RUNS),
    log:
        logs("train/L{L}.log"),
    wildcard_constraints:
        L=r"\d+",
    threads: config["threads_per_job"]
    resources:
        mem_mb=2000,
        runtime=lambda w: training_runtime(int(w.L)),
    conda:
        ENV
    script:
        "../scripts/train.py"


# One row per run (status ok | trapped | diverged) and one per (model, L) with the theory curves.
rule summarize_training:
    input:
        trajectories=training_trajectories(),
        flows=full_model_flows(),
        bayes_risk=results("data/bayes_risk.parquet"),
        code=code("summarize_training.py"),
    output:
        runs=results("train/summary.parquet"),
        prompt_lengths=results("train/prompt_length_summary.parquet"),
    params:
        **cfg(*ICL_TASK, "train.trapped_readout_fraction", "train.convergence_window"),
    log:
        logs("train/summarize_training.log"),
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/summarize_training.py"


# R4 on the §6 model: constant small lr, large batch, short horizon; every seed twice (two batch
# streams) so that the SGD-noise floor of the distance to the flow is measured at every L.
rule train_transfer:
    input:
        test_set=results("data/icl_test.parquet"),
        code=code("train_transfer.py"),
    output:
        trajectories=results("transfer/L{L}.parquet"),
    params:
        prompt_length=lambda w: int(w.L),
        checkpoint=lambda w: results(f"checkpoints/transfer/L{w.L}.pt"),
        **cfg(
            "seed",
            *ICL_TASK,
            "transfer.models",
            "transfer.seeds",
            "transfer.replicate_seeds",
            "transfer.batch_size",
            "transfer.lr",
            "transfer.horizon",
            "transfer.n_log",
        ),
    log:
        logs("transfer/L{L}.log"),
    wildcard_constraints:
        L=r"\d+",
    threads: config["threads_per_job"]
    resources:
        mem_mb=2000,
        runtime=lambda w: transfer_runtime(int(w.L)),
    conda:
        ENV
    script:
        "../scripts/train_transfer.py"
