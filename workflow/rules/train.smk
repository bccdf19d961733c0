# R6 training at each prompt length (docs/experiments.md#training-protocol). One job per L trains every
# (model, seed) run at that L; it checkpoints under results/<run>/checkpoints/, outside the declared outputs,
# so a killed (incomplete) job resumes. Config section `train`.


rule train:
    input:
        test_set=results("icl/test_set.parquet"),
        flows=full_model_flows(),
    output:
        trajectories=results("train/L{L}.parquet"),
    log:
        logs("train/L{L}.log"),
    benchmark:
        benchmarks("train/L{L}.tsv")
    wildcard_constraints:
        L=r"\d+",
    cache: SHARE
    # the flows (priority 2), then the training jobs first: train at the longest L is the longest job of the default run
    priority: 1
    conda:
        ENV
    threads: threads()
    resources:
        **gpu_request(),
        mem_mb=5100,  # measured: 3.4 GB peak at paper size (L 1000, 10 000 test prompts) x 1.5
        runtime=lambda w: training_runtime(int(w.L)),
    params:
        **code("train.py"),
        **cfg("seed", *ICL_TASK, *TRAIN_RUNS),
        prompt_length=lambda w: int(w.L),
    script:
        "../scripts/train.py"


# One row per run (status ok | trapped | diverged) and one per (model, L) with the theory curves.
rule summarize_training:
    input:
        trajectories=training_trajectories(),
        flows=full_model_flows(),
        bayes_risk=results("icl/bayes_risk.parquet"),
    output:
        multiext(
            results("train/training_"),
            runs="runs.parquet",
            prompt_lengths="prompt_lengths.parquet",
        ),
    log:
        logs("train/summarize_training.log"),
    benchmark:
        benchmarks("summarize_training.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=700,  # measured: 0.4 GB peak (default run) x 1.5
        runtime=5,
    params:
        **code("summarize_training.py"),
        **cfg(
            "seed",
            *ICL_TASK,
            "train.batch_size",
            "train.trapped_loss_ratio",
            "train.trapped_readout_fraction",
            "train.unconverged_change",
            "train.convergence_window",
            "train.mode_gap_factor",
        ),
    script:
        "../scripts/summarize_training.py"
