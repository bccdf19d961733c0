# The in-context regression task of R4-R6 (docs/experiments.md#training_vs_prompt_length): the held-out test
# set and the Bayes risk and R(Gamma*) on it. Config section `icl`.


# Nested prompts at the largest training L: adding a shorter L reruns nothing here.
rule make_icl_test_set:
    output:
        test_set=results("icl/test_set.parquet"),
    log:
        logs("icl/make_icl_test_set.log"),
    benchmark:
        benchmarks("make_icl_test_set.tsv")
    cache: SHARE
    priority: 2
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=4000,  # measured: 2.6 GB peak at paper size (10 000 prompts, L 1000) x 1.5
        runtime=5,
    params:
        **code("make_icl_test_set.py"),
        **cfg("seed", *ICL_TASK, "icl.n_test"),
        max_prompt_length=longest_prompt(),
    script:
        "../scripts/make_icl_test_set.py"


rule bayes_risk:
    input:
        test_set=results("icl/test_set.parquet"),
    output:
        bayes_risk=results("icl/bayes_risk.parquet"),
    log:
        logs("icl/bayes_risk.log"),
    benchmark:
        benchmarks("bayes_risk.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=6100,  # measured: 4.1 GB peak at paper size x 1.5
        runtime=5,
    params:
        **code("bayes_risk.py"),
        **cfg(*ICL_TASK, "icl.n_test", "train.prompt_lengths"),
    script:
        "../scripts/bayes_risk.py"
