# How often torch-default inits give a drifting R∞ flow, and what predicts it
# (docs/experiments.md#init_dependence): the flows of seeds 0 … n_seeds−1, each classified at T and 2T.
# Config section `init_dependence`.


rule simulate_init_dependence:
    output:
        flows=results("init_dependence/flows.parquet"),
    log:
        logs("init_dependence/simulate_init_dependence.log"),
    benchmark:
        benchmarks("simulate_init_dependence.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=700,
        runtime=lambda w: init_dependence_minutes(config["init_dependence"]["n_seeds"]),
    params:
        **code("simulate_init_dependence.py"),
        **cfg(
            "seed",
            *ICL_TASK,
            "init_dependence.n_seeds",
            "init_dependence.horizon",
            "infinite.rtol",
            "infinite.atol",
        ),
    script:
        "../scripts/simulate_init_dependence.py"


rule summarize_init_dependence:
    input:
        flows=results("init_dependence/flows.parquet"),
    output:
        multiext(
            results("init_dependence/"),
            classes="classes.parquet",
            predictors="predictors.parquet",
        ),
    log:
        logs("init_dependence/summarize_init_dependence.log"),
    benchmark:
        benchmarks("summarize_init_dependence.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=500,
        runtime=5,
    params:
        **code("summarize_init_dependence.py"),
        **cfg("init_dependence.n_folds"),
    script:
        "../scripts/summarize_init_dependence.py"
