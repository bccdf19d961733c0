# Stage 2: training at each prompt length (docs/experiments.md#training-protocol). One job per L
# trains every (model, seed) run at that L; the checkpoint lives outside the declared outputs, so it
# survives a killed (incomplete) job and the rerun resumes from it.


rule train:
    input:
        test_set=results("data/icl_test.parquet"),
        flows=full_model_flows(),
    output:
        trajectories=results("train/L{L}.parquet"),
    log:
        logs("train/L{L}.log"),
    wildcard_constraints:
        L=r"\d+",
    conda:
        ENV
    threads: config["threads_per_job"]
    resources:
        **gpu_request(),
        mem_mb=5100,  # measured: 3.4 GB peak at paper size (L 1000, 10 000 test prompts) x 1.5
        runtime=lambda w: training_runtime(int(w.L)),
    params:
        **code("train.py"),
        **cfg("seed", *ICL_TASK, *TRAIN_RUNS),
        prompt_length=lambda w: int(w.L),
        checkpoint=lambda w: results(f"checkpoints/train/L{w.L}.pt"),
    script:
        "../scripts/train.py"


# One row per run (status ok | trapped | diverged) and one per (model, L) with the theory curves.
rule summarize_training:
    input:
        trajectories=training_trajectories(),
        flows=full_model_flows(),
        bayes_risk=results("data/bayes_risk.parquet"),
    output:
        runs=results("summary/training_runs.parquet"),
        prompt_lengths=results("summary/training_prompt_lengths.parquet"),
    log:
        logs("train/summarize_training.log"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=700,  # measured: 0.4 GB peak (default run) x 1.5
        runtime=5,
    params:
        **code("summarize_training.py"),
        **cfg(
            *ICL_TASK,
            "train.trapped_loss_ratio",
            "train.trapped_readout_fraction",
            "train.convergence_window",
            "train.mode_gap_factor",
        ),
    script:
        "../scripts/summarize_training.py"


# R4 on the §6 model: constant small lr, large batch, short horizon; every seed twice (two batch
# streams) so that the SGD-noise floor of the distance to the flow is measured at every L.
rule train_transfer:
    input:
        test_set=results("data/icl_test.parquet"),
    output:
        trajectories=results("transfer/L{L}.parquet"),
    log:
        logs("transfer/L{L}.log"),
    wildcard_constraints:
        L=r"\d+",
    conda:
        ENV
    threads: config["threads_per_job"]
    resources:
        **gpu_request(),
        mem_mb=9900,  # measured: 6.6 GB peak at paper size (batch 32 768, L 1000, float64) x 1.5
        runtime=lambda w: transfer_runtime(int(w.L)),
    params:
        **code("train_transfer.py"),
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
        prompt_length=lambda w: int(w.L),
        checkpoint=lambda w: results(f"checkpoints/transfer/L{w.L}.pt"),
    script:
        "../scripts/train_transfer.py"
