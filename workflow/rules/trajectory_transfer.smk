# R4 on the §6 model (docs/experiments.md#trajectory_transfer): constant small lr, large batch, short
# horizon; every seed twice (two batch streams) so that the SGD-noise floor of the distance to the flow is
# measured at every L, each run with its coupled L = ∞ run on the same batches (docs/theory.md#coupled-limit); then
# sup_t ‖θ_L(t) − θ_∞(t)‖, the distance to the coupled run, and the slopes over L. Config section `trajectory_transfer`.


rule train_trajectory_transfer:
    input:
        test_set=results("icl/test_set.parquet"),
    output:
        trajectories=results("trajectory_transfer/L{L}.parquet"),
    log:
        logs("trajectory_transfer/L{L}.log"),
    benchmark:
        benchmarks("train_trajectory_transfer/L{L}.tsv")
    wildcard_constraints:
        L=r"\d+",
    cache: SHARE
    conda:
        ENV
    threads: threads()
    resources:
        **gpu_request(),
        mem_mb=9900,  # measured: 6.6 GB peak at paper size (batch 32 768, L 1000, float64) x 1.5
        runtime=lambda w: transfer_runtime(int(w.L)),
    params:
        **code("train_trajectory_transfer.py"),
        **cfg(
            "seed",
            *ICL_TASK,
            "trajectory_transfer.models",
            "trajectory_transfer.seeds",
            "trajectory_transfer.replicate_seeds",
            "trajectory_transfer.batch_size",
            "trajectory_transfer.lr",
            "trajectory_transfer.horizon",
            "trajectory_transfer.n_log",
        ),
        prompt_length=lambda w: int(w.L),
    script:
        "../scripts/train_trajectory_transfer.py"


rule summarize_trajectory_transfer:
    input:
        trajectories=transfer_trajectories(),
        reduced=results("infinite/reduced_model.parquet"),
    output:
        multiext(
            results("trajectory_transfer/"),
            gaps="gaps.parquet",
            slopes="slopes.parquet",
        ),
    log:
        logs("trajectory_transfer/summary.log"),
    benchmark:
        benchmarks("summarize_trajectory_transfer.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=700,  # measured: 0.4 GB peak (default run; the flows dominate) x 1.5
        runtime=10,
    params:
        **code("summarize_trajectory_transfer.py"),
        **cfg(
            "seed",
            *ICL_TASK,
            "infinite.rtol",
            "infinite.atol",
            "trajectory_transfer.floor_factor",
            "trajectory_transfer.lr",
        ),
    script:
        "../scripts/summarize_trajectory_transfer.py"
