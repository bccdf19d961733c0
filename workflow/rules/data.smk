# Stage 1: data generation. The query ray of R1, the fixed in-context regression test set and the
# Bayes risk on it (docs/experiments.md#training_vs_prompt_length).


rule make_queries:
    output:
        queries=results("data/queries.parquet"),
    log:
        logs("data/make_queries.log"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=500,  # measured: 0.3 GB peak (default run) x 1.5, at least 500
        runtime=5,
    params:
        **code("make_queries.py"),
        **cfg("affine_limit.ray"),
    script:
        "../scripts/make_queries.py"


# Nested prompts at the largest training L: adding a shorter L reruns nothing here.
rule make_icl_test_set:
    output:
        test_set=results("data/icl_test.parquet"),
    log:
        logs("data/make_icl_test_set.log"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=4000,  # measured: 2.6 GB peak at paper size (10 000 prompts, L 1000) x 1.5
        runtime=5,
    params:
        **code("make_icl_test_set.py"),
        **cfg("seed", "icl"),
        max_prompt_length=longest_prompt(),
    script:
        "../scripts/make_icl_test_set.py"


rule bayes_risk:
    input:
        test_set=results("data/icl_test.parquet"),
    output:
        bayes_risk=results("data/bayes_risk.parquet"),
    log:
        logs("data/bayes_risk.log"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=6100,  # measured: 4.1 GB peak at paper size x 1.5
        runtime=5,
    params:
        **code("bayes_risk.py"),
        **cfg("icl", "train.prompt_lengths"),
    script:
        "../scripts/bayes_risk.py"
