# Infinite-prompt dynamics (docs/theory.md#full-model-infinite-prompt-risk, docs/experiments.md#balanced_flow,
# docs/experiments.md#trajectory_transfer): gradient flows on closed-form risks. Config section `infinite`.


rule full_model_flow:
    output:
        flow=results("infinite/full_model_seed{seed}.parquet"),
    log:
        logs("infinite/full_model_seed{seed}.log"),
    benchmark:
        benchmarks("full_model_flow/seed{seed}.tsv")
    wildcard_constraints:
        seed=r"\d+",
    cache: SHARE
    priority: 2
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=700,  # measured: 0.4 GB peak at paper size x 1.5
        runtime=20,
    params:
        **code("full_model_flow.py"),
        **cfg(
            "seed",
            *ICL_TASK,
            "train.horizon",
            "infinite.rtol",
            "infinite.atol",
            "infinite.flow_points",
        ),
        run_seed=lambda w: int(w.seed),
    script:
        "../scripts/full_model_flow.py"


rule balanced_flow:
    output:
        flow=results("infinite/balanced_flow.parquet"),
    log:
        logs("infinite/balanced_flow.log"),
    benchmark:
        benchmarks("balanced_flow.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=600,  # measured: 0.4 GB peak at paper size x 1.5
        runtime=5,
    params:
        **code("balanced_flow.py"),
        **cfg(
            "icl.dim",
            "icl.covariance_rho",
            "infinite.rtol",
            "infinite.atol",
            "infinite.balanced_flow",
        ),
    script:
        "../scripts/balanced_flow.py"


rule reduced_model:
    output:
        result=results("infinite/reduced_model.parquet"),
    log:
        logs("infinite/reduced_model.log"),
    benchmark:
        benchmarks("reduced_model.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads()
    resources:
        mem_mb=3200,  # measured: 2.1 GB peak at paper size (batch 4096, L 2000) x 1.5
        runtime=10,
    params:
        **code("reduced_model.py"),
        **cfg("seed", "infinite.reduced_model"),
    script:
        "../scripts/reduced_model.py"
