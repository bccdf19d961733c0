# Stage 1: data generation (SPEC §3.1 stage 1).


rule make_queries:
    output:
        queries="results/data/queries.parquet",
    params:
        ray=cfg("affine_limit", "ray"),
    log:
        "logs/data/make_queries.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/make_queries.py"


# In-context regression (SPEC F6): the fixed test set, nested prompts at the largest training L.
rule make_icl_test_set:
    output:
        test_set="results/data/icl_test.parquet",
    params:
        seed=cfg("seed"),
        icl=cfg("icl"),
        max_prompt_length=max(cfg("train", "prompt_lengths")),  # adding a shorter L reruns nothing here
    log:
        "logs/data/make_icl_test_set.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/make_icl_test_set.py"


# The Bayes (ridge, λ = σ²/τ²) risk on that test set, at every training L and on a geometric grid.
rule bayes_risk:
    input:
        test_set="results/data/icl_test.parquet",
    output:
        bayes_risk="results/data/bayes_risk.parquet",
    params:
        seed=cfg("seed"),
        icl=cfg("icl"),
        prompt_lengths=cfg("train", "prompt_lengths"),
    log:
        "logs/data/bayes_risk.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/bayes_risk.py"

