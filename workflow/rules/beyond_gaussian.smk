# R4 and R6 beyond Gaussian covariates (docs/experiments.md#beyond_gaussian): per token measure, the infinite-prompt
# flows of both models, the R6 runs and the R4 transfer runs at each prompt length, then one summary. The protocol
# (step sizes, status rule, floors) is that of sections `train` and `trajectory_transfer`. Config section `beyond_gaussian`.


wildcard_constraints:
    token_measure="gaussian|rademacher|uniform",


rule flow_beyond_gaussian:
    output:
        flows=results("beyond_gaussian/{token_measure}/flows.parquet"),
    log:
        logs("beyond_gaussian/{token_measure}/flows.log"),
    benchmark:
        benchmarks("flow_beyond_gaussian/{token_measure}.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=1500,
        runtime=30,
    params:
        **code("flow_beyond_gaussian.py"),
        **cfg(
            "seed",
            *BEYOND_TASK,
            "beyond_gaussian.flow_points",
            "beyond_gaussian.train.seeds",
            "beyond_gaussian.train.horizon",
            "infinite.rtol",
            "infinite.atol",
        ),
        token_measure=lambda w: w.token_measure,
    script:
        "../scripts/flow_beyond_gaussian.py"


rule train_beyond_gaussian:
    input:
        flows=results("beyond_gaussian/{token_measure}/flows.parquet"),
        linear_flows=results("beyond_gaussian/gaussian/flows.parquet"),
    output:
        trajectories=results("beyond_gaussian/{token_measure}/train_L{L}.parquet"),
    log:
        logs("beyond_gaussian/{token_measure}/train_L{L}.log"),
    benchmark:
        benchmarks("train_beyond_gaussian/{token_measure}/L{L}.tsv")
    wildcard_constraints:
        L=r"\d+",
    cache: SHARE
    conda:
        ENV
    threads: threads()
    resources:
        **gpu_request(),
        mem_mb=2000,
        runtime=lambda w: beyond_runtime("train", int(w.L)),
    params:
        **code("train_beyond_gaussian.py"),
        **cfg(
            "seed",
            *BEYOND_TASK,
            "beyond_gaussian.n_test",
            "beyond_gaussian.train",
            *BEYOND_TRAIN,
        ),
        token_measure=lambda w: w.token_measure,
        prompt_length=lambda w: int(w.L),
    script:
        "../scripts/train_beyond_gaussian.py"


# One job per measure trains its short transfer runs at every L in turn, one output file per L: a job's start (imports,
# about 4 s) costs as much as the training at the smallest L.
rule train_trajectory_transfer_beyond_gaussian:
    output:
        # multiext, not expand: Snakemake's between-run cache (--cache) stores a job of several outputs only so
        trajectories=multiext(
            results("beyond_gaussian/{token_measure}/trajectory_transfer_"),
            *transfer_files(),
        ),
    log:
        logs("beyond_gaussian/{token_measure}/trajectory_transfer.log"),
    benchmark:
        benchmarks("train_trajectory_transfer_beyond_gaussian/{token_measure}.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads()
    resources:
        **gpu_request(),
        mem_mb=3000,
        runtime=beyond_runtime("trajectory_transfer"),
    params:
        **code("train_trajectory_transfer_beyond_gaussian.py"),
        **cfg(
            "seed",
            *BEYOND_TASK,
            "beyond_gaussian.n_test",
            "beyond_gaussian.trajectory_transfer",
            "trajectory_transfer.lr",
            "trajectory_transfer.horizon",
        ),
        token_measure=lambda w: w.token_measure,
    script:
        "../scripts/train_trajectory_transfer_beyond_gaussian.py"


rule summarize_beyond_gaussian:
    input:
        train=beyond_gaussian_runs("train"),
        trajectory_transfer=beyond_gaussian_runs("trajectory_transfer"),
        flows=beyond_gaussian_flows(),
    output:
        multiext(
            results("beyond_gaussian/"),
            runs="runs.parquet",
            prompt_lengths="prompt_lengths.parquet",
            gaps="gaps.parquet",
            slopes="slopes.parquet",
            optima="optima.parquet",
            scale_profiles="scale_profiles.parquet",
        ),
    log:
        logs("beyond_gaussian/summarize_beyond_gaussian.log"),
    benchmark:
        benchmarks("summarize_beyond_gaussian.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=1500,
        runtime=10,
    params:
        **code("summarize_beyond_gaussian.py"),
        **cfg(
            "seed",
            *BEYOND_TASK,
            "beyond_gaussian.token_measures",
            "beyond_gaussian.n_test",
            "beyond_gaussian.train.prompt_lengths",
            "infinite.rtol",
            "infinite.atol",
            "trajectory_transfer.lr",
            "trajectory_transfer.floor_factor",
            "train.batch_size",
            "train.trapped_loss_ratio",
            "train.trapped_readout_fraction",
            "train.unconverged_change",
            "train.convergence_window",
        ),
    script:
        "../scripts/summarize_beyond_gaussian.py"
