# R4 on the §6 model (docs/experiments.md#trajectory_transfer): constant small lr, large batch, short
# horizon; every seed twice (two batch streams) so that the SGD-noise floor of the distance to the flow is
# measured at every L, each run with its coupled L = ∞ run on the same batches (docs/theory.md#coupled-limit); then
# sup_t ‖θ_L(t) − θ_∞(t)‖, the distance to the coupled run, and the slopes over L. Config section `transfer`.


rule train_transfer:
    input:
        test_set=results("icl/test_set.parquet"),
    output:
        trajectories=results("transfer/L{L}.parquet"),
    log:
        logs("transfer/L{L}.log"),
    benchmark:
        benchmarks("train_transfer/L{L}.tsv")
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
    script:
        "../scripts/train_transfer.py"


rule trajectory_gap:
    input:
        trajectories=transfer_trajectories(),
        reduced=results("infinite/reduced_model.parquet"),
    output:
        multiext(
            results("transfer/trajectory_"),
            gaps="gaps.parquet",
            slopes="slopes.parquet",
        ),
    log:
        logs("transfer/trajectory_gap.log"),
    benchmark:
        benchmarks("trajectory_gap.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=700,  # measured: 0.4 GB peak (default run; the flows dominate) x 1.5
        runtime=10,
    params:
        **code("trajectory_gap.py"),
        **cfg(
            "seed",
            *ICL_TASK,
            "infinite.rtol",
            "infinite.atol",
            "transfer.floor_factor",
            "transfer.lr",
        ),
    script:
        "../scripts/trajectory_gap.py"
