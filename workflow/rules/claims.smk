# The run read as claims (docs/experiments.md#claims): one row per claim of the paper and of this project, each
# computed from the run's own summary tables, with its interval, prediction and verdict. Config: none of its own.


localrules:
    evaluate_claims,


rule evaluate_claims:
    input:
        tables=claim_tables(),
    output:
        claims=results("claims/claims.parquet"),
    log:
        logs("claims/evaluate_claims.log"),
    benchmark:
        benchmarks("evaluate_claims.tsv")
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=1500,
        runtime=5,
    params:
        **code("evaluate_claims.py"),
        **cfg("seed"),
    script:
        "../scripts/evaluate_claims.py"
